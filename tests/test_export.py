"""`orch export modal|beam NAME`: the file it writes loads with the platform's real SDK offline, says the
GPU, timeout and volume asked for, refuses what would bill without bound or cannot run, and its training
function trains on this machine, leaving last.pt on the "volume" and resuming from it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.tasks import dataset
from tests.conftest import needs_torch, on_instance, one_cpu, run_orch

HAS = {sdk: importlib.util.find_spec(sdk) is not None for sdk in ("modal", "beam")}
needs_sdk = {sdk: pytest.mark.skipif(not ok, reason=f"needs the {sdk} extra") for sdk, ok in HAS.items()}
JOB = ["--data", "hf://acme/birds/birds.tar", "--epochs", "30", "--model", "yolo9-s"]

# The test's own offline loader (not orch's): the file imported as a module with the SDK, its
# `train` function read back through the SDK's objects. Beam needs a token to decorate, and opens a
# gRPC channel to its gateway: a dummy token, a gateway on loopback where nothing listens.
_LOAD = textwrap.dedent("""
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("app_under_test", sys.argv[2])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if sys.argv[1] == "modal":
        info = mod.train.info()  # modal.Function.info(): filled in when the function is defined
        out = {"gpus": [list(g) for g in info.gpus], "timeout": info.timeout, "retries": info.max_retries,
               "volumes": {path: v.name for path, v in info.volumes.items()}, "secrets": len(info.secrets),
               "app": mod.app.name}
    else:
        fn = mod.train.parent  # beta9's Function behind the @function wrapper
        out = {"gpus": [[fn.gpu, fn.gpu_count]], "timeout": fn.task_policy.timeout,
               "retries": fn.task_policy.max_retries, "volumes": {v.mount_path: v.name for v in fn.volumes},
               "secrets": [s.name for s in fn.secrets], "app": fn.name}
    print(json.dumps(out))
""")
OFFLINE = {"BEAM_TOKEN": "dummy", "BETA9_GATEWAY_HOST": "127.0.0.1", "BETA9_GATEWAY_PORT": "9",
           "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": "9", "MODAL_SERVER_URL": "http://127.0.0.1:9"}


def load(platform: str, path: Path, tmp_path: Path) -> dict:
    env = {**os.environ, **OFFLINE, "CONFIG_PATH": str(tmp_path / "no-beam-config.ini")}
    proc = subprocess.run([sys.executable, "-c", _LOAD, platform, str(path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_sdk["modal"]
def test_modal_export_loads_offline_with_the_gpu_timeout_and_volume_asked_for(tmp_path):
    out = tmp_path / "birds_modal.py"
    proc = run_orch("export", "modal", "birds", *JOB, "--gpu", "A100 80GB", "--gpus", "2", "--max-hours", "30",
                    "--volume", "team-vol", "--retries", "2", "-o", out, check=0)
    assert proc.stdout.strip() == f"modal run {out}"
    assert "checked offline with modal's SDK" in proc.stderr
    got = load("modal", out, tmp_path)
    # Modal caps one attempt at 24 h: 30 h is a 24 h timeout and two calls, each resuming from last.pt.
    assert got == {"gpus": [["A100-80GB", 2]], "timeout": 24 * 3600, "retries": 2, "volumes": {"/vol": "team-vol"},
                   "secrets": 1, "app": "orch-birds"}
    text = out.read_text()
    assert "CALLS = 2" in text and "MAX_HOURS = 30.0" in text and "'model': 'yolo9-s'" in text
    assert "'device': '0,1'" in text and "'epochs': 30" in text


@needs_sdk["beam"]
def test_beam_export_loads_offline_with_the_gpu_timeout_and_volume_asked_for(tmp_path):
    out = tmp_path / "job.py"
    proc = run_orch("export", "beam", "birds", *JOB, "--gpu", "RTX A6000", "--max-hours", "2.5", "-o", out, check=0)
    assert proc.stdout.strip() == f"python {out}"
    got = load("beam", out, tmp_path)
    assert got == {"gpus": [["A6000", 1]], "timeout": 9000, "retries": 3, "volumes": {"./orch": "orch"},
                   "secrets": ["HF_TOKEN"], "app": "orch-birds"}


@needs_sdk["modal"]
def test_the_default_file_name_and_an_existing_file_is_never_replaced_unasked(tmp_path):
    run_orch("export", "modal", "birds", *JOB, "--gpu", "h100", "--max-hours", "1", "-o", tmp_path / "x.py", check=0)
    default = Path(__file__).resolve().parent.parent / "birds_modal.py"
    assert not default.exists()
    # Run where the user stands (the file is named for the job, in the working folder); this
    # checkout's orch wherever the fork server is off (PYTHONPATH: the venv's install may be another's).
    proc = run_orch("export", "modal", "birds", *JOB, "--gpu", "H100", "--max-hours", "1", cwd=tmp_path,
                    env={"PYTHONPATH": str(default.parent)}, timeout=120, check=0)
    assert proc.stdout.strip() == "modal run birds_modal.py" and (tmp_path / "birds_modal.py").is_file()
    before = (tmp_path / "x.py").read_bytes()
    again = run_orch("export", "modal", "birds", *JOB, "--gpu", "T4", "--max-hours", "1", "-o", tmp_path / "x.py")
    assert again.returncode == 2 and "--force" in again.stderr
    assert (tmp_path / "x.py").read_bytes() == before
    run_orch("export", "modal", "birds", *JOB, "--gpu", "T4", "--max-hours", "1", "-o", tmp_path / "x.py", "--force",
             check=0)
    assert load("modal", tmp_path / "x.py", tmp_path)["gpus"] == [["T4", 1]]


@pytest.mark.parametrize("platform, args, says", [
    ("modal", ["--data", "hf://acme/birds/birds.tar", "--gpu", "T4"], "--max-hours is required"),
    ("beam", ["--data", "hf://acme/birds/birds.tar", "--gpu", "T4"], "--max-hours is required"),
    ("modal", ["--data", "{local}", "--gpu", "T4", "--max-hours", "1"], "orch data push"),
    ("beam", ["--data", "{local}", "--gpu", "T4", "--max-hours", "1"], "orch data push"),
    ("modal", ["--data", "hf://acme/birds/birds.tar", "--gpu", "RTX 4090", "--max-hours", "1"], "does not offer"),
    ("beam", ["--data", "hf://acme/birds/birds.tar", "--gpu", "L40S", "--max-hours", "1"], "does not offer"),
    ("modal", ["--data", "hf://acme/birds/birds.tar", "--gpu", "A10", "--gpus", "5", "--max-hours", "1"], "1 to 4"),
    ("modal", ["--data", "hf://acme/birds/birds.tar", "--max-hours", "1"], "--gpu is required"),
    ("beam", ["--data", "hf://acme/birds/birds.tar", "--gpu", "T4", "--max-hours", "0"], "--max-hours must be"),
])
def test_what_would_bill_without_bound_or_cannot_run_is_refused_and_nothing_written(orch_home, tmp_path, platform, args, says):
    local = dataset.synth(tmp_path / "birds", n_train=2, n_val=1)
    out = tmp_path / "app.py"
    proc = run_orch("export", platform, "birds", *[a.format(local=local) for a in args], "-o", out)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not out.exists() and not list(tmp_path.glob("*.py")) and not list(tmp_path.glob(".*.tmp"))


def test_without_the_sdk_the_file_is_written_and_the_install_named(tmp_path):
    out = tmp_path / "app.py"
    code = ("import sys; sys.modules['modal'] = None; sys.argv[0] = 'orch'; "
            "from orchestrator.cli.main import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, "export", "modal", "birds", *JOB, "--gpu", "L4",
                           "--max-hours", "3", "-o", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'orch-gpu[modal]'" in proc.stderr and "not checked" in proc.stderr
    assert proc.stdout.strip() == f"modal run {out}"
    compile(out.read_text(), str(out), "exec")


# -- the training function, run here -----------------------------------------------------------------------
_CALL = textwrap.dedent("""
    import importlib.util, json, sys, time
    spec = importlib.util.spec_from_file_location("app_under_test", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    print("RESULT " + json.dumps(mod.train_on(sys.argv[2], deadline=time.time() + float(sys.argv[3]))), flush=True)
""")


def _call(app: Path, volume: Path, env: dict, seconds: float = 3600) -> subprocess.Popen:
    return one_cpu(subprocess.Popen([sys.executable, "-c", _CALL, str(app), str(volume), str(seconds)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))


def _result(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-3000:]
    return {**json.loads(lines[-1][7:]), "output": out}


@pytest.fixture
def hub_app(tmp_path):
    """A tiny dataset pushed to a loopback hub with `orch data push`, and a Modal export that trains on it."""
    from tests.fakes.hf_hub import FakeHub

    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    with FakeHub(tmp_path) as hub:
        env = {**os.environ, **hub.env, **OFFLINE}
        uri = run_orch("data", "push", ds, "acme/tiny", env=env, check=0).stdout.strip().splitlines()[-1]
        app = tmp_path / "tiny_modal.py"
        run_orch("export", "modal", "tiny", "--data", uri, "--epochs", "3", "--save-period", "1", "--imgsz", "64",
                 "--batch", "4", "--train-arg", "workers=0", "--train-arg", "pretrained=false", "--gpu", "T4",
                 "--max-hours", "1", "--push-to", "hf://acme/tiny-run", "-o", app, check=0)
        yield app, env, hub


@needs_sdk["modal"]
@needs_torch
@pytest.mark.training
def test_the_training_function_trains_onto_the_volume_and_a_second_call_resumes_from_last_pt(tmp_path, hub_app):
    app, env, hub = hub_app
    volume = tmp_path / "volume"
    weights = volume / "runs" / "tiny" / "weights"
    check = on_instance("checkpoint").check

    # The first attempt dies after its first epoch (a preemption, a timeout): SIGKILL, nothing to clean up.
    first = _call(app, volume, env)
    deadline = time.monotonic() + 400
    while not (check(str(weights / "last.pt"))["epoch"] or 0) >= 1:
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no last.pt on the volume"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    reached = check(str(weights / "last.pt"))["epoch"]
    assert 1 <= reached < 3, "the attempt was killed before it finished"
    assert any((volume / "hf").rglob("*.tar")), "the dataset is cached in HF_HOME on the volume"
    downloads = sum("/resolve/" in r.path for r in hub.requests)

    second = _result(_call(app, volume, env))
    assert second["state"] == "completed" and second["epoch"] == 3 and second["resumed_from"] == reached
    assert f"resuming tiny from {weights / 'last.pt'} (epoch {reached} of 3)" in second["output"]
    assert check(str(weights / "last.pt"))["epoch"] == 3
    assert {f"epoch_{n}.pt" for n in (1, 2, 3)} <= {p.name for p in weights.iterdir()}
    assert sum("/resolve/" in r.path for r in hub.requests) - downloads <= 1, "the tar came from the volume's cache"
    for name in ("epoch_1.pt", "epoch_3.pt", "last.pt"):  # --push-to: milestones reached the hub from the function
        assert hub.file_bytes("model", "acme/tiny-run", f"weights/{name}") == (weights / name).read_bytes(), name

    third = _result(_call(app, volume, env))
    assert third["state"] == "completed" and "already completed" in third["output"]


@needs_sdk["modal"]
@needs_torch
def test_past_the_deadline_nothing_trains(tmp_path, hub_app):
    app, env, _ = hub_app
    volume = tmp_path / "volume"
    got = _result(_call(app, volume, env, seconds=-1))
    assert got["state"] == "deadline" and got["epoch"] is None
    assert not (volume / "runs").exists()


@pytest.mark.parametrize("platform, asked, gpus, named", [
    ("modal", "A100 80GB", 1, "A100-80GB"), ("modal", "a100-40gb", 1, "A100-40GB"), ("modal", "A100", 2, "A100"),
    ("modal", "NVIDIA H100 80GB HBM3", 8, "H100"), ("modal", "h100!", 1, "H100!"), ("modal", "rtx pro 6000", 1, "RTX-PRO-6000"),
    ("modal", "A10", 4, "A10"), ("beam", "RTX A6000", 1, "A6000"), ("beam", "A100 80GB", 1, "A100-80"),
    ("beam", "Tesla T4", 2, "T4"), ("beam", "a10g", 1, "A10G"), ("beam", "H100 PCIe", 1, "H100"),
])
def test_gpu_names_map_to_each_platforms_own(platform, asked, gpus, named):
    from orchestrator import export

    assert export.gpu_name(platform, asked, gpus) == named


@pytest.mark.parametrize("platform, asked, gpus", [
    ("modal", "RTX 4090", 1), ("modal", "A10", 5), ("modal", "H100", 9), ("beam", "L40S", 1), ("beam", "GAUDI2", 1),
    ("beam", "MI300X", 1), ("beam", "T4", 0),
])
def test_gpus_a_platform_does_not_offer_are_refused(platform, asked, gpus):
    from orchestrator import export
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError):
        export.gpu_name(platform, asked, gpus)


# -- what the user types never becomes code (issue 42, item 6) ----------------------------------------------
@needs_sdk["modal"]
def test_a_file_name_made_of_code_is_written_as_text_and_runs_nothing(tmp_path):
    """`-o 'x\"\"\"; CODE; \"\"\".py'` closed the module docstring: CODE ran in orch's own offline check
    and again on `modal run`. The name is shown in the docstring, escaped, and nothing runs."""
    import ast

    mark = tmp_path / "ran"
    code = f'open(chr(47) + chr(47).join({json.dumps(list(mark.parts[1:]))}), "w")'
    name = f'x"""; {code}; """.py'
    out = tmp_path / name
    proc = run_orch("export", "modal", "birds", *JOB, "--gpu", "T4", "--max-hours", "1", "-o", out)
    assert proc.returncode == 0 and "checked offline with modal's SDK" in proc.stderr, proc.stderr
    assert not mark.exists(), "the file name ran as code during orch's own check"
    load("modal", out, tmp_path)  # what `modal run` does first: import the file
    assert not mark.exists(), "the file name ran as code when the file was imported"
    doc = ast.get_docstring(ast.parse(out.read_text()))
    assert f"modal run 'x\"\"\"; {code}; \"\"\".py'" in doc, doc[:400]


@pytest.mark.parametrize("name", ["a\\Nb.py", "a\\x4.py", "a\\u12.py", "tab\there.py"])
def test_a_backslash_or_a_control_character_in_the_file_name_is_no_internal_error(tmp_path, name):
    import ast

    out = tmp_path / name
    proc = run_orch("export", "beam", "birds", *JOB, "--gpu", "T4", "--max-hours", "1", "-o", out)
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr
    shown = name.replace("\t", "\\t")
    assert shown in ast.get_docstring(ast.parse(out.read_text()))


@pytest.mark.parametrize("value", ["1e999", "-1e999", "nan", "inf", "Infinity", "1" * 5000])
def test_a_train_arg_that_is_no_finite_number_is_refused_and_nothing_written(tmp_path, value):
    folder = tmp_path / "out"
    folder.mkdir()
    proc = run_orch("export", "modal", "birds", *JOB, "--gpu", "T4", "--max-hours", "1", "--train-arg",
                    f"lr0={value}", "-o", folder / "app.py")
    assert proc.returncode == 2 and "lr0" in proc.stderr and "finite" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not list(folder.iterdir()), "nothing written"
