"""What the red team of issue 27 did, as a hostile rented host and a careless team member would, each
tried for real and refused: a checkpoint that runs code on the next machine, a ledger that writes
ssh_config, pulls without bounds, and the low findings."""

from __future__ import annotations

import shutil
import sys
from collections import OrderedDict

import pytest

from orchestrator.tasks import dataset
from tests.clouds import arrange, open_orch
from tests.conftest import needs_torch, run_orch
from tests.test_checkpoint import _Boom
from tests.test_untrusted import one_line_refusal


def hostile_checkpoint(path, mark, legacy: bool) -> None:
    """A last.pt shaped like LibreYOLO's whose pickle writes ``mark`` when anything unpickles it:
    torch's legacy format calling os.system, or the zip format calling eval."""
    import torch

    obj = {"epoch": 0, "model": OrderedDict(w=torch.ones(2)), "x": _Boom(mark, "system" if legacy else "eval")}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)


# The instance vouches for any checkpoint: it answers its own checkpoint.py as it likes.
VOUCHES = r'''#!/bin/sh
case "$1" in
  *checkpoint.py) printf '%s\n' 'ORCH_RESULT {"exists": true, "loads": true, "epoch": 1, "size": 1, "error": null}';;
  *) exec "$REAL_PYTHON" "$@";;
esac
'''


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return dataset.synth(tmp_path_factory.mktemp("redteam") / "ds", n_train=4, n_val=2, imgsz=64)


# -- 1. a checkpoint that would run code on the next instance --------------------------------------
@needs_torch
@pytest.mark.training
def test_a_job_whose_instance_serves_a_hostile_last_pt_keeps_no_copy_uploads_nothing_and_starts_over(
        orch_home, ds, tmp_path):
    from tests.test_jobs import TRAIN, _advance_until, _freeze, _run_root, live_instances

    mark = tmp_path / "ran"
    run_orch("run", "jz", "--data", ds, "--epochs", "40", "--save-period", "5", *TRAIN, check=0)
    _freeze("jz-a1")  # it stays paused until the machine goes: every look meets a whole file
    # The instance turns: its last.pt is a legacy pickle with a payload, and its Python vouches for it.
    root = _run_root("jz-a1")
    last = root / "weights" / "last.pt"
    real = last.read_bytes()
    hostile_checkpoint(last, mark, legacy=True)
    work = next((orch_home / "local").glob("orch-*-jz-a1")) / "home" / "orch"
    liar = work / "bin" / "vouching-python"
    liar.parent.mkdir(parents=True, exist_ok=True)
    liar.write_text(VOUCHES.replace("$REAL_PYTHON", sys.executable))
    liar.chmod(0o755)
    python = (work / "python").read_text()
    (work / "python").write_text(f"{liar}\n")
    job = _advance_until("jz", lambda j: any("not kept" in h["text"] for h in j["history"]), every=0.5)
    assert job["checkpoint_epoch"] is None and not list((orch_home / "jobs" / "jz").glob("ckpt-*")), job
    assert any("legacy" in h["text"] for h in job["history"]), job["history"][-5:]
    # It turns back; the job keeps a copy of a real checkpoint (still paused: a look at a training that
    # runs on may meet last.pt while torch rewrites it, "torn, not kept", and a tiny training ends first)...
    last.write_bytes(real)
    (work / "python").write_text(python)
    job = _advance_until("jz", lambda j: (j["checkpoint_epoch"] or 0) >= 1, every=0.5)
    kept = job["checkpoint_epoch"]
    copy = orch_home / "jobs" / "jz" / f"ckpt-{kept}" / "weights" / "last.pt"
    # ...which is swapped at home for a zip whose pickle calls eval (a careless teammate, a shared disk),
    hostile_checkpoint(copy, mark, legacy=False)
    run_orch("down", "jz-a1", "--no-pull", "--yes", check=0)  # and the machine goes.
    job = _advance_until("jz", lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["state"] == "running")
    second = job["attempts"][1]
    assert second["start_epoch"] == 1 and "started at epoch 1" in second["resumed_from"], second
    assert not any("verified copy" in str(a["resumed_from"]) for a in job["attempts"]), job["attempts"]
    assert any(f"resume copy (epoch {kept}) is not uploaded" in h["text"] and "eval" in h["text"]
               for h in job["history"]), job["history"][-5:]
    assert not copy.exists(), "a copy that cannot be resumed from is forgotten"
    run_orch("jobs", "cancel", "jz", check=0)
    assert live_instances() == []
    assert not mark.exists(), "the payload ran somewhere"


@needs_torch
@pytest.mark.parametrize("legacy", [True, False])
def test_a_resume_from_a_hostile_pulled_last_pt_is_refused_before_anything(orch_home, ds, tmp_path, legacy):
    """`orch run --resume` and `orch up --resume` upload the pulled last.pt: refused up front, one
    line, exit 2, nothing rented, no job, no ledger."""
    mark = tmp_path / "ran"
    weights = orch_home / "runs" / "box" / "weights"
    weights.mkdir(parents=True)
    hostile_checkpoint(weights / "last.pt", mark, legacy=legacy)
    before = sorted(p.relative_to(orch_home) for p in orch_home.rglob("*"))
    for args in (("run", "box", "--resume"), ("up", "box", "--resume")):
        proc = run_orch(*args, "--data", ds, "--epochs", "3", "--cpu")
        one_line_refusal(proc, 2, "not resumable")
        assert ("legacy" if legacy else "eval") in proc.stderr, proc.stderr
    assert sorted(p.relative_to(orch_home) for p in orch_home.rglob("*")) == before, "something was created"
    assert not mark.exists()
    shutil.rmtree(orch_home / "runs")


# -- 2. the ledger writes ssh_config -----------------------------------------------------------------
PAYLOAD = "\nHost *\n    ProxyCommand touch {mark}\n#"


def _ssh_g(config, host) -> dict:
    import subprocess

    proc = subprocess.run(["ssh", "-F", str(config), "-G", host], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs OpenSSH's client")
@pytest.mark.parametrize("column", ["provider", "name", "ssh_host", "ssh_user", "host_key", "ssh_port", "state"])
def test_a_newline_in_any_ledger_column_never_becomes_a_line_of_ssh_config(orch_home, tmp_path, column):
    """Anyone who can write the (shared) ledger writes what they like in a row: a newline in any
    column must not add ``Host *`` and a ``ProxyCommand`` that every member's ssh would run."""
    import subprocess

    from sqlalchemy import update as sql_update

    from orchestrator.ledger.ledger import Instance

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hk")], check=True)
    key = " ".join((tmp_path / "hk.pub").read_text().split()[:2])
    orch = open_orch()
    clean_row = dict(provider="local", ssh_host="127.0.0.1", ssh_port=2222, ssh_user="root", host_key=key)
    good = orch.ledger.create_instance(name="good", **clean_row)
    bad = orch.ledger.create_instance(name="bad", **clean_row)
    for inst in (good, bad):
        orch.ledger.transition(inst.id, "provisioning")
        orch.ledger.transition(inst.id, "ready")
    mark = tmp_path / "ran"
    value = str(clean_row.get(column) or ("bad" if column == "name" else "ready")) + PAYLOAD.format(mark=mark)
    with orch.ledger.session() as s:  # as a hostile writer of the shared database would: no API in the way
        s.exec(sql_update(Instance).where(Instance.id == bad.id).values(**{column: value}))
        s.commit()
    proc = run_orch("ssh-config")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    config = orch_home / "ssh_config"
    text = config.read_text()
    assert "ProxyCommand" not in text and "Host *" not in text, text
    hosts = [line for line in text.splitlines() if line.startswith("Host ")]
    assert "Host orch-good" in hosts and set(hosts) <= {"Host orch-good", "Host orch-bad"}, text
    # What is written is what orch writes: comments, blanks, and the eight options of each Host.
    assert all(not line or line.startswith(("# ", "Host orch-", "    ")) for line in text.splitlines()), text
    assert "proxycommand" not in _ssh_g(config, "gitbox"), "an unrelated host got a ProxyCommand"
    known = (orch_home / "ssh_known_hosts").read_text()
    assert all(line.startswith("[127.0.0.1]:2222 ssh-ed25519 ") for line in known.splitlines()), known
    assert not mark.exists()


def test_uninstall_under_another_orch_home_leaves_that_include_and_says_so(orch_home, tmp_path):
    cfg = tmp_path / "user" / ".ssh" / "config"
    run_orch("ssh-config", "--install", check=0)
    include = f'Include "{orch_home / "ssh_config"}"'
    assert include in cfg.read_text()
    other = run_orch("ssh-config", "--uninstall", env={"ORCH_HOME": str(tmp_path / "elsewhere")}, check=0)
    assert include in cfg.read_text(), "another home's Include line was taken out"
    assert "no Include line of this ORCH_HOME's" in other.stderr and "another ORCH_HOME's" in other.stderr
    assert "removed the Include line" not in other.stderr, other.stderr
    mine = run_orch("ssh-config", "--uninstall", check=0)
    assert "removed the Include line" in mine.stderr and "orch" not in cfg.read_text(), cfg.read_text()


# -- 3. pulls within what the run could write ---------------------------------------------------------
def _a_run_that_lies(orch_home, name, epochs=2, save_period=1):
    """A local instance whose run (2 epochs, saving every epoch) left a 1.5 GB sparse train.log and
    400 epoch_N.pt files: what a hostile host serves for free."""
    import json

    orch = open_orch()
    inst = arrange(orch, name)  # ready, not provisioned: the run is the hostile host's
    work = next((orch_home / "local").glob(f"orch-*-{name}")) / "home" / "orch"
    run_dir = work / "runs" / "r1"
    (run_dir / "weights").mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"state": "completed", "completed_epochs": epochs,
                                                     "total_epochs": epochs, "start_epoch": 1}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e}) + "\n" for e in range(1, epochs + 1)))
    with open(run_dir / "train.log", "wb") as f:
        f.truncate(1536 << 20)  # 1.5 GB of nothing: free for the host
        f.seek(0, 2)
        f.write(b"the newest line\n")
    for n in range(1, 401):
        (run_dir / "weights" / f"epoch_{n}.pt").write_bytes(b"w" * 1000)
    (run_dir / "weights" / "best.pt").write_bytes(b"b" * (3 << 20))
    orch.ledger.add_run(instance_id=inst.id, model="yolo9-t", data="x", epochs=epochs, run_dir=str(run_dir),
                        pid=1, state="completed", args=json.dumps({"save_period": save_period}))
    return run_dir


def test_a_pull_brings_home_only_what_a_2_epoch_run_could_write_within_the_caps(orch_home):
    import time

    run_dir = _a_run_that_lies(orch_home, "liar")
    try:
        t0 = time.monotonic()
        proc = run_orch("pull", "liar")
        assert proc.returncode == 0, proc.stderr
        print(f"\nthe hostile run's pull: {time.monotonic() - t0:.1f} s; it said:\n{proc.stderr}")
        home = orch_home / "runs" / "liar"
        assert sorted(p.name for p in (home / "weights").iterdir() if not p.name.startswith(".")) == \
            ["best.pt", "epoch_1.pt", "epoch_2.pt"]
        log = home / "train.log"
        assert log.stat().st_size == 64 << 20 and log.read_bytes().endswith(b"the newest line\n")
        assert sum(p.stat().st_size for p in home.rglob("*") if p.is_file()) < 256 << 20
        # The pull says what it left behind: the head of the log, the epochs the run could not have written.
        said = proc.stderr
        assert "left on the instance" in said and "train.log" in said and "epoch_3.pt" in said, said
        orch = open_orch()
        notes = [e.reason for e in orch.ledger.events(orch.ledger.by_name("liar").id)]
        assert any("left on the instance" in n for n in notes), notes
        # A user who wants more raises the caps; what came home already is not pulled again.
        again = run_orch("pull", "liar", env={"ORCH_PULL_LOG_MB": "100"})
        assert again.returncode == 0 and log.stat().st_size == 100 << 20, again.stderr
        # A total cap below the run's weights stops the pull, says so, and leaves the instance be.
        (run_dir / "weights" / "best.pt").write_bytes(b"c" * (3 << 20))
        capped = run_orch("pull", "liar", env={"ORCH_PULL_MAX_GB": "0.002"})
        assert capped.returncode == 1 and "ORCH_PULL_MAX_GB" in capped.stderr, capped.stderr
        assert (home / "weights" / "best.pt").read_bytes()[:1] == b"b", "past the cap: not pulled"
        down = run_orch("down", "liar", env={"ORCH_PULL_MAX_GB": "0.002"})
        assert down.returncode == 1 and orch.ledger.by_name("liar") is not None, down.stderr
    finally:
        run_orch("down", "liar", "--no-pull")


# -- 4. the low findings ------------------------------------------------------------------------------
def test_a_deeply_nested_line_from_an_instance_is_a_bad_line_not_a_crash(tmp_path):
    """json raises RecursionError (not ValueError) on deep nesting: every reader of what an
    instance wrote skips such a line, and an ORCH_RESULT made of one is no answer (an OrchError the
    callers handle: a lost instance is still destroyed)."""
    from orchestrator.text import row_json
    from orchestrator.jobs import resume_copy
    from orchestrator.errors import OrchError
    from playbooks import host
    from playbooks import pull as pulling

    deep = "[" * 200_000 + "]" * 200_000
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n' + deep + '\n{"epoch": 2}\n')
    (run / "status.json").write_text('{"x": ' + deep + "}")
    assert resume_copy.metrics_epochs(run / "metrics.jsonl") == [1, 2]
    assert resume_copy.pulled_epoch(run) == 2
    assert resume_copy.trimmed_metrics(run / "metrics.jsonl", 5) == '{"epoch": 1}\n{"epoch": 2}\n'
    assert row_json(deep, {}) == {}
    with pytest.raises(OrchError, match="no answer"):
        host.answer("ORCH_RESULT " + deep, "run_status.py")
    (run / pulling.MANIFEST).write_text(deep)
    assert pulling._load(run) == {}


def test_a_webhook_that_never_answers_is_said_once_when_posts_are_dropped(tmp_path):
    """It accepts the connection and never answers: at exit orch gives up on the posts (it waits a
    few seconds at most) and says so, once, for all of them."""
    import socket
    import subprocess

    from tests.conftest import ROOT

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/services/T0/B0/secretsecret"
        code = ("from orchestrator import notify\n"
                "notify.TIMEOUT_S = 60.0\n"  # the post would wait longer than the exit does
                f"[notify.post({url!r}, 'hello') for _ in range(3)]\n"
                "import atexit; atexit.unregister(notify.drain); atexit.register(notify.drain, 1.0)\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc.stderr
    assert "not delivered" in lines[0] and "3 post(s) unanswered" in lines[0] and "secret" not in lines[0], lines


def test_every_refused_name_or_text_option_creates_nothing(tmp_path, monkeypatch, capsys):
    """Every command given bad names and bad text options (the red team's 400 inputs, in kind): a
    refusal (exit 2) leaves no ORCH_HOME behind, no ledger.db in it, and never a traceback."""
    import inspect
    import typing

    import typer

    from orchestrator.cli import check, data, db, demo, instances, offers, reaper, reconcile  # noqa: F401
    from orchestrator.cli.app import app
    from tests.conftest import _cleanup_local
    from tests.test_untrusted import _commands, cli_in_process

    names = ["../x", "X Y", "-x", "", "a" * 300, "a\nb", "x/../../y"]
    texts = ["../../x", "", "\x00", "nope-provider", "a\nb", "x" * 300]
    tried, created = 0, []
    try:
        for path, callback in _commands(app):
            params = inspect.signature(callback).parameters
            hints = typing.get_type_hints(callback)
            wanted = [n for n, p in params.items() if isinstance(p.default, typer.models.ArgumentInfo)
                      and p.default.default is ...]
            good = {n: "x1" if n in ("name", "provider", "folder") else "acme/x" if n == "repo" else "x"
                    for n in wanted}
            cases = [[*path, *[(v if m == n else good[m]) for m in wanted]] for n in wanted for v in names]
            for pname, p in params.items():
                if isinstance(p.default, typer.models.OptionInfo) and hints.get(pname) in (str, typing.Optional[str]):
                    flag = next((d for d in (p.default.param_decls or ()) if d.startswith("--")),
                                "--" + pname.replace("_", "-"))
                    cases += [[*path, *good.values(), f"{flag}={v}"] for v in texts]
            for args in cases:
                home = tmp_path / f"h{tried}"
                tried += 1
                code, err = cli_in_process(monkeypatch, capsys, home, args)
                assert "Traceback" not in err and "internal error" not in err, (args, err)
                if code == 2 and home.exists():
                    created.append((args, sorted(p.name for p in home.iterdir()), err.strip()[:120]))
    finally:
        # An input that is not refused runs for real (an `orch up` rents a local instance) whose
        # sshd and watchdog would outlive the test, in a home that the autouse ``orch_home``
        # fixture does not clean.
        for home in tmp_path.glob("h*"):
            _cleanup_local(home)
    assert tried > 150 and created == [], created


@pytest.mark.parametrize("args, says", [
    (("run", "j", "--cpu", "--spot"), "spot"),
    (("run", "j", "--cpu", "--offer", "../../x"), "--offer picks a GPU offer"),
    (("up", "b", "--cpu", "--spot"), "spot"),
    (("up", "b", "--cpu", "--offer", "../../x"), "--offer picks a GPU offer"),
    (("up", "b", "--cpu", "--image", "ubuntu:22.04"), "--image is not supported by local"),
    (("run", "j", "--cpu", "--image", "ubuntu:22.04"), "--image is not supported by local"),
])
def test_what_the_renting_provider_cannot_do_is_refused_before_renting(orch_home, ds, args, says):
    proc = run_orch(*args, *(("--data", ds) if args[0] == "run" else ()))
    one_line_refusal(proc, 2, says)
    assert not orch_home.exists(), "refused, yet something was created"


def test_cost_since_a_span_before_year_one_is_everything(orch_home):
    proc = run_orch("cost", "--since", "99999999d")
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr


# -- a dataset tar, unpacked on the instance --------------------------------------------------------
def _tar(path, members):
    """A tar of (name, kind, mode, data) members, as a careless hand (or a hostile one) packs it."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, kind, mode, data in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _extract(tar_path, dest, filters=True):
    import subprocess

    from tests.test_untrusted import ON_INSTANCE

    code = ("import sys, tarfile\n"
            + ("" if filters else "del tarfile.data_filter  # a Python without PEP 706's filters\n")
            + f"sys.path.insert(0, {str(ON_INSTANCE)!r})\nimport extract\n"
            f"print(extract.orch_extract({str(tar_path)!r}, {str(dest)!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


YAML = b"train: images/train\nval: images/val\nnames:\n  0: bird\n"


@pytest.mark.parametrize("filters", [True, False])
def test_no_setuid_bit_survives_unpacking_with_or_without_the_data_filter(tmp_path, filters):
    import stat

    tar = _tar(tmp_path / "ds.tar", [("ds/", "dir", 0o755, b""), ("ds/data.yaml", "file", 0o644, YAML),
                                     ("ds/run-me", "file", 0o4777, b"#!/bin/sh\nid\n")])
    proc = _extract(tar, tmp_path / "out", filters)
    assert proc.returncode == 0, proc.stderr
    mode = (tmp_path / "out" / "ds" / "run-me").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH), oct(mode)


@pytest.mark.parametrize("order", ["folder, then file", "file, then folder", "file, then a file under it"])
def test_a_name_that_is_both_a_folder_and_a_file_is_refused_in_one_line(tmp_path, order):
    x = {"folder, then file": [("ds/x/", "dir", 0o755, b""), ("ds/x", "file", 0o644, b"f")],
         "file, then folder": [("ds/x", "file", 0o644, b"f"), ("ds/x/", "dir", 0o755, b"")],
         "file, then a file under it": [("ds/x", "file", 0o644, b"f"), ("ds/x/y", "file", 0o644, b"g")]}[order]
    tar = _tar(tmp_path / "ds.tar", [("ds/", "dir", 0o755, b""), ("ds/data.yaml", "file", 0o644, YAML), *x])
    proc = _extract(tar, tmp_path / "out")
    assert proc.returncode != 0 and "both a folder and a file" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "IsADirectoryError" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("key", ['"path"', "'path'", "path", '"path" '])
def test_a_data_yaml_path_key_in_any_spelling_never_moves_the_dataset(tmp_path, key):
    import yaml

    tar = _tar(tmp_path / "ds.tar", [("ds/", "dir", 0o755, b""),
                                     ("ds/data.yaml", "file", 0o644, YAML + f"{key}: /etc\n".encode())])
    proc = _extract(tar, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load((tmp_path / "out" / "ds" / "data.yaml").read_text())
    assert written["path"] == str((tmp_path / "out" / "ds").resolve()), written


@pytest.mark.parametrize("setting, says", [('ssh_user = "-oProxyCommand=id"', "ssh_user must be a login name"),
                                           ('region = "mars"', "region must be a region name")])
@pytest.mark.parametrize("command", ["up", "run"])
def test_aws_settings_are_checked_before_renting(orch_home, ds, setting, says, command):
    orch_home.mkdir(mode=0o700)
    (orch_home / "config.toml").write_text(f"[providers.aws]\n{setting}\n")
    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "x"}  # nothing is asked of AWS
    proc = run_orch(command, "b", "--provider", "aws", "--gpu", "A10G", *(("--data", ds) if command == "run" else ()),
                    env=env)
    one_line_refusal(proc, 2, says)
    assert sorted(p.name for p in orch_home.iterdir()) == ["config.toml"], "refused, yet something was created"
