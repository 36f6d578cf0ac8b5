"""The first hour of a new user, on a machine without a GPU and without provider keys: what is
refused before anything is made, what runs by default, and that nothing is left unsaid."""

from __future__ import annotations

import json

import pytest

from orchestrator.tasks import dataset
from tests.conftest import needs_torch, run_orch, skip_without
from tests.test_cli_ux import has_local_gpu

RUNPOD_KEY = "RUNPOD_API_KEY, or api_key under [providers.runpod] in config.toml"


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return dataset.synth(tmp_path_factory.mktemp("first") / "ds", n_train=4, n_val=2, imgsz=64)


# -- keys, before anything is created ---------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["up", "bad3", "--provider", "runpod", "--gpu", "RTX 4090"],
    ["up", "bad3", "--provider", "runpod", "--cpu"],
    ["run", "bad3", "--data", "DS", "--provider", "runpod", "--gpu", "RTX 4090"],
    ["run", "bad3", "--data", "DS", "--provider", "local", "--provider", "runpod"],
])
def test_a_provider_without_its_key_is_refused_before_anything_is_made(orch_home, ds, argv):
    proc = run_orch(*[str(ds) if a == "DS" else a for a in argv])
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "no runpod credentials" in line and RUNPOD_KEY in line
    assert not orch_home.exists(), "no ledger, no row, no home: nothing was created"


def test_a_default_provider_without_its_key_is_refused_too(orch_home):
    orch_home.mkdir()
    (orch_home / "config.toml").write_text('default_provider = "runpod"\n')
    proc = run_orch("up", "box", "--cpu")
    assert proc.returncode == 2 and "no runpod credentials" in proc.stderr and RUNPOD_KEY in proc.stderr
    assert sorted(p.name for p in orch_home.iterdir()) == ["config.toml"], "no ledger made"


def test_a_key_in_config_toml_is_enough_to_pass_the_check(orch_home):
    # The key is there (config.toml): the refusal is no longer about keys (the fake API is nowhere).
    orch_home.mkdir()
    (orch_home / "config.toml").write_text('[providers.runpod]\napi_key = "rp-test"\nretries = 1\n')
    proc = run_orch("up", "box", "--provider", "runpod", "--gpu", "RTX 4090", "--ssh-timeout", "1")
    assert "credentials" not in proc.stderr and proc.returncode != 0


# -- offers and check name what they skipped ---------------------------------------------------------
def test_offers_without_keys_names_every_provider_skipped_and_the_key_it_needs(orch_home):
    proc = run_orch("offers")
    assert proc.returncode == 1
    skipped = {line.split()[1].rstrip(":"): line for line in proc.stderr.splitlines() if line.startswith("skipped ")}
    assert set(skipped) >= {"runpod", "vastai", "aws", "lambda"}, proc.stderr
    assert RUNPOD_KEY in skipped["runpod"] and "VAST_API_KEY" in skipped["vastai"]
    assert "LAMBDA_API_KEY" in skipped["lambda"] and "AWS_ACCESS_KEY_ID" in skipped["aws"]
    if not has_local_gpu():
        assert "no GPU on this machine" in skipped["local"]
    assert "no provider asked" in proc.stdout
    data = json.loads(run_orch("offers", "--json").stdout)
    assert {s["provider"] for s in data["skipped"]} >= {"runpod", "vastai", "aws", "lambda"}


def test_check_without_a_provider_checks_every_one_and_names_those_skipped(orch_home):
    proc = run_orch("check", check=0)
    lines = proc.stdout.splitlines()
    assert "local: every step held" in lines
    for name, key in (("runpod", "RUNPOD_API_KEY"), ("vastai", "VAST_API_KEY"), ("lambda", "LAMBDA_API_KEY"),
                      ("aws", "AWS_ACCESS_KEY_ID")):
        [line] = [x for x in lines if x.startswith(f"{name}: ")]
        assert "skipped" in line and key in line
    data = json.loads(run_orch("check", "--json", check=0).stdout)
    assert [r["provider"] for r in data["providers"]] == ["local"] and data["ok"]
    assert {s["provider"] for s in data["skipped"]} == {"runpod", "vastai", "aws", "lambda"}
    assert run_orch("check", "--live").returncode == 2  # --live rents: one provider, named


@pytest.mark.long  # the dataset doctor loads torch first
def test_run_for_a_gpu_with_no_keys_names_the_providers_it_could_not_ask(orch_home, ds):
    proc = run_orch("run", "j0", "--data", ds, "--gpu", "RTX 4090")
    assert proc.returncode != 0
    assert f"runpod not asked: no key: set {RUNPOD_KEY}" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "no on-demand offer" in last and "not asked: " in last and "runpod" in last and "`orch check`" in last


# -- orch run on a laptop ---------------------------------------------------------------------------
@needs_torch
@pytest.mark.training
@pytest.mark.skipif(has_local_gpu(), reason="on a machine with a GPU the job ranks GPU offers")
def test_run_without_flags_on_a_machine_without_gpu_or_keys_trains_on_a_cpu_instance(orch_home, ds):
    proc = run_orch("run", "j1", "--data", ds, "--epochs", "1", "--imgsz", "64", "--batch", "4",
                    "--train-arg", "workers=0", "--json")
    said = [line for line in proc.stderr.splitlines() if "CPU instance" in line]
    assert len(said) == 1 and "local" in said[0], proc.stderr
    job = json.loads(proc.stdout)
    assert job["plan"]["cpu"] is True and job["plan"]["provider"] == "local", job
    assert [a["provider"] for a in job["attempts"]] == ["local"] and job["state"] != "failed", job
    run_orch("jobs", "cancel", "j1", check=0)


# -- logs, down ------------------------------------------------------------------------------------
def _in_a_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """``orch ARGS`` with a terminal on its stdin (as a person types), answering the first question."""
    import os
    import pty
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], stdin=follower, stdout=subprocess.PIPE,
                            stderr=follower, cwd=ROOT, text=True)
    os.close(follower)
    seen, deadline = b"", time.monotonic() + 120
    while b"[y/N]" not in seen and time.monotonic() < deadline and proc.poll() is None:
        try:
            seen += os.read(leader, 4096)
        except OSError:
            break
    os.write(leader, answer.encode() + b"\n")
    out, _ = proc.communicate(timeout=300)
    os.close(leader)
    return proc.returncode, seen.decode(errors="replace") + out


def test_logs_without_a_run_and_down_of_a_training_instance_asks_first(orch_home):
    from tests.clouds import arrange, open_orch

    here = open_orch()
    for name in ("ta", "tb", "tc"):  # ready local instances: `logs`, `ssh` and `down` are under test, not `up`
        arrange(here, name)
    logs = run_orch("logs", "tb")
    assert logs.returncode == 2 and "no training run" in logs.stderr and logs.stdout == ""
    _ssh_starts_ssh_without_the_full_cli("tb")

    ledger = here.ledger
    ledger.add_run(instance_id=ledger.by_name("ta").id, model="yolo9-t", data="x", epochs=9, run_dir="/nowhere",
                   pid=1, state="running")  # as the ledger records a training started by `orch up --data`
    refused = run_orch("down", "ta", "tb")  # no terminal to ask on: refused, nothing destroyed
    assert refused.returncode == 2 and "ta is training" in refused.stderr and "--yes" in refused.stderr
    assert run_orch("down", "--all").returncode == 2
    rc, said = _in_a_terminal(["down", "ta"], "n")
    assert "ta (TRAINING)" in said and rc == 2, said
    assert {i.name: i.state for i in ledger.instances()} == {"ta": "ready", "tb": "ready", "tc": "ready"}

    run_orch("down", "tb", check=0)  # not training: no question
    rc, said = _in_a_terminal(["down", "--all", "--no-pull"], "y")
    assert rc == 0 and "ta: destroyed" in said and "tc: destroyed" in said, said
    assert {i.state for i in ledger.instances()} == {"destroyed"}
    assert run_orch("down").returncode == 2  # neither names nor --all


# -- no silent minutes -------------------------------------------------------------------------------
@needs_torch
def test_the_dataset_doctor_says_what_it_does_and_how_long_it_has_run(ds, monkeypatch):
    monkeypatch.setattr(dataset, "DOCTOR_NOTE_SECONDS", 0.5)  # LibreYOLO loads torch first: always over 0.5 s
    said = []
    info = dataset.validate(ds, imgsz=64, say=said.append)
    assert info.n_images == {"train": 4, "val": 2}
    assert "libreyolo doctor checks 6 images" in said[0], said
    assert any("still checking" in line for line in said[1:-1]), said
    assert "done in" in said[-1]


# -- data-loading workers ------------------------------------------------------------------------------
def test_data_loading_workers_are_sized_to_the_cpus_of_the_instance():
    import os
    import subprocess
    import sys

    from playbooks.host import ON_INSTANCE

    # The script as the instance runs it, in a process held to one CPU (a small instance), then two.
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import train_entry as t; "
            "print(json.dumps([t.usable_cpus(), t.with_workers({'mode': 'cli', 'argv': ['device=cpu']})['argv'], "
            "t.with_workers({'mode': 'api', 'kwargs': {'device': '0,1'}})['kwargs'], "
            "t.with_workers({'mode': 'cli', 'argv': ['device=cpu', 'workers=5']})['argv']]))")
    cpus = sorted(os.sched_getaffinity(0))
    for allowed in ([cpus[0]], cpus[:2]):
        out = subprocess.run([sys.executable, "-c", code, str(ON_INSTANCE)], capture_output=True, text=True,
                             check=True, preexec_fn=lambda a=allowed: os.sched_setaffinity(0, set(a))).stdout
        n, cpu_argv, gpu_kwargs, given = json.loads(out)
        assert n <= len(allowed)
        assert cpu_argv == ["device=cpu", f"workers={max(0, n - 1)}"], "one core left to the CPU training itself"
        assert gpu_kwargs["workers"] == n // 2, "the CPUs shared between two GPUs' loaders"
        assert given == ["device=cpu", "workers=5"], "a workers= the user gave is kept"
    from tests.conftest import on_instance

    t = on_instance("train_entry")
    assert [t.loader_workers(16, 1, False), t.loader_workers(64, 8, False), t.loader_workers(2, 1, True),
            t.loader_workers(1, 1, True), t.loader_workers(4, 8, False)] == [8, 8, 1, 0, 0]


# -- what a training imports ----------------------------------------------------------------------------
@needs_torch
def test_a_yolo_training_does_not_import_rf_detr_and_transformers_that_it_never_uses():
    """LibreYOLO's CLI imports RF-DETR and DINOv2, with transformers, to list its model names,
    wherever transformers is installed (most Hugging Face images). train_entry builds that list
    without them for a model that names neither: the names it trains by still resolve, and RF-DETR
    still registers when something asks for it, as when a checkpoint holds one."""
    skip_without("transformers")  # the list imports them only beside transformers
    import subprocess
    import sys

    from playbooks.host import ON_INSTANCE

    code = """if True:
        import json, sys
        sys.path.insert(0, sys.argv[1])
        import train_entry as t
        import libreyolo.models as models
        from libreyolo.cli.config import resolve_model_name
        ensure = models.try_ensure_rfdetr
        out = {"rfdetr_named": t.name_map_without_lazy_families("RFDETR-n"),
               "dinov2_named": t.name_map_without_lazy_families("/runs/dinov2-s/last.pt"),
               "yolo": t.name_map_without_lazy_families("yolo9-t"),
               "again": t.name_map_without_lazy_families("yolox-s")}
        out["imported"] = sorted(m for m in ("transformers", "libreyolo.models.rfdetr") if m in sys.modules)
        out["resolved"] = [resolve_model_name("yolo9-t"), resolve_model_name("yolox-s")]
        out["restored"] = models.try_ensure_rfdetr is ensure
        out["rfdetr_on_demand"] = getattr(models.try_ensure_rfdetr(), "FAMILY", None)
        print(json.dumps(out))
    """
    proc = subprocess.run([sys.executable, "-c", code, str(ON_INSTANCE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["rfdetr_named"] and not out["dinov2_named"], "a model that may be RF-DETR or DINOv2 gets the full list"
    assert out["yolo"] and not out["again"], "built once, without them; a second call changes nothing"
    assert out["imported"] == [], "neither RF-DETR nor transformers was imported for the name list"
    assert out["resolved"] == ["LibreYOLO9t.pt", "LibreYOLOXs.pt"]
    assert out["restored"] and out["rfdetr_on_demand"] == "rfdetr", "RF-DETR still registers when asked for"


# -- status --refresh ---------------------------------------------------------------------------------
@pytest.mark.long
@needs_torch
def test_status_refresh_shows_an_instance_its_watchdog_stopped(orch_home):
    from providers import local as sshd
    from tests.clouds import wait_for
    from tests.test_reaper import live_root

    run_orch("up", "wd2", "--cpu", "--idle-minutes", "0.1", check=0)  # orch has exited: nobody watches
    root = live_root(orch_home, "wd2")
    wait_for(lambda: not sshd.running(root), timeout=120, what="the watchdog to stop its instance")
    [before] = json.loads(run_orch("status", "--json", check=0).stdout)
    assert before["state"] == "ready", "the ledger alone has not seen it (nothing looked)"
    assert "--refresh" in run_orch("status", check=0).stdout
    [after] = json.loads(run_orch("status", "--refresh", "--json", check=0).stdout)
    assert after["state"] == "stopped"
    detail = json.loads(run_orch("status", "wd2", "--json", check=0).stdout)
    assert detail["events"][-1]["actor"] == "watchdog" and "watchdog" in detail["events"][-1]["reason"]
    run_orch("down", "wd2", check=0)


# -- a checkout and its .venv under /tmp ------------------------------------------------------------------
def test_a_fake_cloud_host_runs_the_image_python_of_a_venv_under_tmp(tmp_path):
    import subprocess
    import sys

    from tests.fakes.hosts import Host, sshd_available

    if not sshd_available():
        pytest.skip("fake hosts need root, unshare and sshd")
    venv = tmp_path / "clone" / ".venv"  # pytest's tmp_path is under /tmp, which every container hides
    assert str(venv).startswith("/tmp/")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    h = Host(tmp_path / "host", python=str(venv / "bin" / "python"))
    h.boot()
    try:
        seen = h.run(f"/usr/local/bin/python3 -c 'import sys; print(sys.prefix)' && touch {venv}/written-inside")
        assert seen.returncode == 0 and seen.stdout.strip() == str(venv), seen.stderr
        assert h.run("ls /tmp").stdout.split() == [venv.parts[2]], "the rest of this machine's /tmp stays hidden"
        assert not (venv / "written-inside").exists(), "what the container writes stays on its own disk"
    finally:
        h.destroy()


def _ssh_starts_ssh_without_the_full_cli(name: str) -> None:
    """`orch ssh NAME -- CMD` runs CMD there, and reaches ssh having loaded neither Typer nor
    SQLAlchemy (seconds on a busy machine: bench/ssh.py measures it)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    assert run_orch("ssh", name, "--", "echo", "hi there").stdout == "hi there\n"
    code = ("import os, sys\nsys.argv = ['orch', 'ssh', sys.argv[1], '--', 'true']\n"
            "def execvp(file, argv):\n    print('EXEC', file, [m for m in ('typer', 'sqlalchemy', 'sqlmodel', 'fabric')"
            " if m in sys.modules]); sys.exit(0)\nos.execvp = execvp\n"
            "from orchestrator.cli.main import main\nmain()\n")
    out = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True, cwd=ROOT).stdout
    assert out.strip() == "EXEC ssh []", out
