"""A rented host is not trusted, and a careless user is not a hostile one: each attack or input from
the issue that drew the trust line, tried for real against local instances, and refused."""

import hashlib
import inspect
import io
import json
import os
import subprocess
import sys
import tarfile
import typing
from pathlib import Path

import typer

import pytest

from orchestrator.tasks import dataset
from playbooks import pull as pulling
from tests.clouds import arrange, open_orch
from tests.conftest import needs_torch, orch_popen, run_orch

ON_INSTANCE = Path(__file__).resolve().parent.parent / "playbooks" / "on_instance"


def one_line_refusal(proc, code=2, needle=""):
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("orch: warning")]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("orch: error: "), proc.stderr
    assert needle in lines[0], (needle, proc.stderr)


# -- what comes back from an instance ------------------------------------------------------------
def test_the_file_list_takes_only_known_run_files():
    listed = [["weights/epoch_x/../../../../x", 5, 1.0], ["/etc/passwd", 5, 1.0], ["weights/best.pt", 7, 2.0],
              ["weights/epoch_12.pt", 3, 1.0], ["weights/../../.bashrc", 1, 1.0], ["status.json", "big", 1.0],
              ["metrics.jsonl", -1, 1.0], "not a triple", ["weights/last.pt", 9, 3.0]]
    take, refused = pulling.run_files(listed)
    assert [f.rel for f in take] == ["weights/best.pt", "weights/epoch_12.pt", "weights/last.pt"]
    assert len(refused) == 6
    milestones, _ = pulling.run_files(listed, only_milestones=True)
    assert [f.rel for f in milestones] == ["weights/best.pt", "weights/epoch_12.pt"]


def test_a_destination_through_a_link_or_out_of_the_folder_is_refused(tmp_path):
    dest = tmp_path / "runs" / "box"
    (dest).mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / "weights").symlink_to(elsewhere)
    with pytest.raises(Exception, match="link"):
        pulling.destination(dest, "weights/best.pt")
    with pytest.raises(Exception, match="leads out"):
        pulling.destination(dest, "../x")


HOSTILE = r'''#!/bin/sh
# The instance lies: its run_status answers paths outside the run, its checksum answers what it likes.
case "$1" in
  *run_status.py) printf '%s\n' 'ORCH_RESULT {"status": {"state": "completed", "train_loss": "\u001b[31m[/]red", "best_metric_name": "\u001b]0;pwned\u0007[bold]x", "completed_epochs": "two", "total_epochs": 2, "error": {"type": "[/]", "message": "\u001b[2Jgone"}}, "alive": false, "moved_s": 1, "files": [["weights/epoch_x/../../../../ESCAPED", 5, 1.0], ["/tmp/ABSOLUTE", 5, 1.0], ["weights/best.pt", 4, 1.0]]}';;
  *checksum.py) printf '%s\n' "ORCH_RESULT {\"weights/best.pt\": [4, 1.0, \"$(printf %064d 0)\"]}";;
  *) exec "$REAL_PYTHON" "$@";;
esac
'''


def _make_hostile(orch_home, name):
    """Point the instance's recorded Python at a liar (what a hostile host can always do)."""
    root = next((orch_home / "local").glob(f"orch-*-{name}"))
    work = root / "home" / "orch"
    liar = work / "bin" / "hostile-python"
    liar.parent.mkdir(parents=True, exist_ok=True)
    liar.write_text(HOSTILE.replace("$REAL_PYTHON", sys.executable))
    liar.chmod(0o755)
    (work / "python").write_text(f"{liar}\n")
    run_dir = work / "runs" / "r1"
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    (run_dir / "weights" / "best.pt").write_bytes(b"real")
    return run_dir


def test_a_hostile_instance_writes_nothing_outside_its_run_folder_and_blocks_the_destroy(orch_home):
    orch = open_orch()
    inst = arrange(orch, "evil")  # ready, not provisioned: the run and its Python are the test's
    try:
        run_dir = _make_hostile(orch_home, "evil")
        orch.ledger.add_run(instance_id=inst.id, model="yolo9-t", data="x", epochs=2, run_dir=str(run_dir), pid=1,
                            state="running")
        status = run_orch("status", "evil", check=0)
        assert "\x1b" not in status.stdout and "\x07" not in status.stdout, "no terminal escape reaches the terminal"
        assert "not a run file orch knows" in status.stdout  # the refused entries are reported
        pulled = run_orch("pull", "evil")
        assert pulled.returncode == 1 and "checksum" in pulled.stderr and "Traceback" not in pulled.stderr
        runs = orch_home / "runs" / "evil"
        assert not (runs / "weights" / "best.pt").exists(), "an unverified file is never renamed into place"
        assert not list(orch_home.parent.rglob("ESCAPED")) and not Path("/tmp/ABSOLUTE").exists()
        assert not [p for p in runs.rglob("*") if p.is_file() and p.name not in (".orch-pull.json",)]
        down = run_orch("down", "evil", "--yes")
        assert down.returncode == 1 and "not destroying" in down.stderr
        assert orch.ledger.get(inst.id).state == "ready"
    finally:
        run_orch("down", "evil", "--no-pull")


# The training writes last.pt again right after the instance computed its sum (once): what a pull
# meets whenever it copies during a run.
REWRITES_AFTER_CHECKSUM = r'''#!/bin/bash
case "$1" in
  *checksum.py) "$REAL_PYTHON" "$@"; rc=$?
    if [ ! -e "$RUN/rewritten" ]; then
      touch "$RUN/rewritten"; printf 'epoch 3 weights' > "$RUN/weights/.last.tmp"; mv "$RUN/weights/.last.tmp" "$RUN/weights/last.pt"
    fi
    exit $rc;;
  *) exec "$REAL_PYTHON" "$@";;
esac
'''


def test_a_file_rewritten_while_pulled_is_read_again_and_the_others_still_come_home(orch_home):
    orch = open_orch()
    inst = arrange(orch, "chg")  # ready, not provisioned: the run and its Python are the test's
    try:
        work = next((orch_home / "local").glob("orch-*-chg")) / "home" / "orch"
        run_dir = work / "runs" / "r1"
        (run_dir / "weights").mkdir(parents=True)
        (run_dir / "weights" / "last.pt").write_bytes(b"epoch 2 weights")
        (run_dir / "status.json").write_text('{"state": "running", "completed_epochs": 2, "total_epochs": 5}')
        (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n')
        wrapper = work / "bin" / "rewriting-python"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(REWRITES_AFTER_CHECKSUM.replace("$REAL_PYTHON", sys.executable).replace("$RUN", str(run_dir)))
        wrapper.chmod(0o755)
        (work / "python").write_text(f"{wrapper}\n")
        orch.ledger.add_run(instance_id=inst.id, model="yolo9-t", data="x", epochs=5, run_dir=str(run_dir), pid=1,
                            state="running")
        pulled = run_orch("pull", "chg", check=0)
        assert pulled.returncode == 0, pulled.stderr
        assert (run_dir / "rewritten").exists(), "last.pt was rewritten during the pull"
        home = orch_home / "runs" / "chg"
        for rel in ("weights/last.pt", "status.json", "metrics.jsonl"):
            assert (home / rel).read_bytes() == (run_dir / rel).read_bytes(), rel
        assert (home / "weights" / "last.pt").read_bytes() == b"epoch 3 weights"
    finally:
        run_orch("down", "chg", "--no-pull", check=0)


@needs_torch
@pytest.mark.training
def test_two_downs_at_once_one_pulls_verified_weights_the_other_is_refused(orch_home, tmp_path):
    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    run_orch("up", "twice", "--cpu", "--data", ds, "--epochs", "2", "--imgsz", "64", "--batch", "4",
             "--train-arg", "workers=0", "--wait", check=0)
    run_dir = next((orch_home / "local").glob("orch-*-twice")) / "home" / "orch" / "runs" / "r1"
    original = hashlib.sha256((run_dir / "weights" / "best.pt").read_bytes()).hexdigest()
    import shutil

    shutil.rmtree(orch_home / "runs" / "twice")  # --wait brought it home: both downs must pull it again
    procs = [orch_popen(["down", "twice"]) for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, 1], results
    loser = next(r for r in results if r[2] == 1)
    assert "busy" in loser[1] and len(loser[1].strip().splitlines()) == 1
    home = orch_home / "runs" / "twice" / "weights" / "best.pt"
    assert hashlib.sha256(home.read_bytes()).hexdigest() == original
    assert not list((orch_home / "runs" / "twice").rglob("*.part"))


@needs_torch
@pytest.mark.training
def test_the_hub_token_reaches_only_what_uses_it(orch_home, tmp_path):
    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    env = {"HF_TOKEN": "hf_secret_that_must_not_travel"}
    run_orch("up", "tok", "--cpu", "--data", ds, "--epochs", "30", "--imgsz", "64", "--batch", "4",
             "--train-arg", "workers=0", env=env, check=0)
    try:
        orch = open_orch()
        pid = orch.ledger.latest_run(orch.ledger.by_name("tok").id).pid
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"HF_TOKEN" not in environ, "local data and no --push-to: the training never sees the token"
    finally:
        run_orch("down", "tok", "--no-pull")


# -- what a careless user types -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["box\n", "box\nPort 22", "-box", "BOX", "box box", "b" * 41])
def test_names_are_matched_whole(orch_home, name):
    proc = run_orch("up", "--cpu", "--", name)
    one_line_refusal(proc, needle="invalid name")
    assert not orch_home.exists(), "a refused argument creates nothing, not even orch's home"


def test_an_orch_home_with_a_space_works(tmp_path):
    home = tmp_path / "my orch home"
    env = {"ORCH_HOME": str(home)}
    run_orch("up", "spaced", "--cpu", env=env, check=0)
    out = run_orch("ssh", "spaced", "--", "echo in-$HOME", env=env, check=0).stdout
    assert out.strip().startswith("in-") and "my orch home" in out
    run_orch("down", "spaced", env=env, check=0)


@pytest.mark.parametrize("arg,needle", [("amp=--project=/x", "begin with '-'"), ("Project=/x", "orch manages it"),
                                        ("EPOCHS=0", "--epochs"), ("exist_ok=false", "orch manages it"),
                                        ("name=other", "orch manages it"), ("lr0=-0.5e", "begin with '-'")])
def test_train_args_cannot_move_the_run_or_pass_options(orch_home, tmp_path, arg, needle):
    ds = dataset.synth(tmp_path / "ds", n_train=2, n_val=1)
    proc = run_orch("up", "ta", "--cpu", "--data", ds, "--train-arg", arg)
    one_line_refusal(proc, needle=needle)
    assert not orch_home.exists()


def test_an_ssh_user_that_is_an_option_never_reaches_ssh(orch_home, tmp_path):
    orch = open_orch()
    inst = arrange(orch, "usr")
    try:
        orch.ledger.update(inst.id, ssh_user=f"-oProxyCommand=touch {tmp_path / 'PWNED'}")
        proc = run_orch("ssh", "usr", "--", "true")
        assert proc.returncode != 0 and "not an SSH user name" in proc.stderr
        assert not (tmp_path / "PWNED").exists()
        proc = run_orch("status", "usr")
        assert not (tmp_path / "PWNED").exists() and "Traceback" not in proc.stderr
    finally:
        orch.ledger.update(inst.id, ssh_user="root")
        run_orch("down", "usr", "--no-pull")


def test_the_dataset_packer_refuses_a_link_out_of_the_dataset(tmp_path):
    ds = dataset.synth(tmp_path / "ds", n_train=2, n_val=1)
    secret = tmp_path / "secret.png"
    secret.write_bytes((ds / "images" / "train" / "0000.png").read_bytes())
    target = ds / "images" / "train" / "0000.png"
    target.unlink()
    target.symlink_to(secret)
    info = dataset.validate(ds, doctor=False)
    with pytest.raises(Exception, match="outside the dataset folder"):
        dataset.pack(info, tmp_path / "t.tar")


def _run_extract(tar_path, dest, *limits):
    return subprocess.run([sys.executable, str(ON_INSTANCE / "extract.py"), str(tar_path), str(dest), *map(str, limits)],
                          capture_output=True, text=True, timeout=60)


def test_a_compressed_file_named_tar_is_not_expanded(tmp_path):
    import gzip

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        ti = tarfile.TarInfo("big/data.yaml")
        payload = b"{}" + b" " * (20 * 2**20)
        ti.size = len(payload)
        tar.addfile(ti, io.BytesIO(payload))
    (tmp_path / "bomb.tar").write_bytes(gzip.compress(raw.getvalue()))
    out = _run_extract(tmp_path / "bomb.tar", tmp_path / "dest")
    assert out.returncode != 0 and "not a plain tar" in out.stderr
    assert not (tmp_path / "dest" / "big").exists()


def test_extract_caps_size_and_member_count(tmp_path):
    with tarfile.open(tmp_path / "many.tar", "w") as tar:
        for i in range(50):
            ti = tarfile.TarInfo(f"many/{i}.txt")
            ti.size = 1000
            tar.addfile(ti, io.BytesIO(b"x" * 1000))
    assert "more than 10 members" in _run_extract(tmp_path / "many.tar", tmp_path / "d1", 10**9, 10).stderr
    assert "more than 20000 bytes" in _run_extract(tmp_path / "many.tar", tmp_path / "d2", 20_000, 1000).stderr


def test_a_changed_host_key_at_start_ends_stopped_with_the_next_command_named(orch_home):
    from providers import local

    arrange(open_orch(), "hk")  # ready, not provisioned: what is checked is the key at the start
    run_orch("stop", "hk", check=0)
    root = next((orch_home / "local").glob("orch-*-hk"))
    for f in ("host_key", "host_key.pub"):
        (root / f).unlink()
    local.host_key(root)  # another key: what an interception would show
    proc = run_orch("start", "hk")
    assert proc.returncode == 1 and "host key" in proc.stderr and "orch down hk" in proc.stderr, proc.stderr
    detail = json.loads(run_orch("status", "hk", "--json", check=0).stdout)
    assert detail["state"] == "stopped", "a state the user can act on, not `starting`"
    run_orch("down", "hk", "--no-pull", check=0)


def test_reaper_uninstall_leaves_no_keys_behind_and_loose_modes_are_named(orch_home):
    env = {"RUNPOD_API_KEY": "rp-key-in-the-env-file"}
    run_orch("reaper", "install", "--backend", "loop", "--every", "60s", env=env, check=0)
    assert (orch_home / "reaper.env").exists()
    run_orch("reaper", "uninstall", check=0)
    assert not (orch_home / "reaper.env").exists()
    (orch_home / "config.toml").write_text('[providers.runpod]\napi_key = "abc"\n')
    (orch_home / "config.toml").chmod(0o644)
    orch_home.chmod(0o755)
    warned = run_orch("status", "nosuch").stderr
    assert "config.toml holds an api_key and is readable by other users" in warned
    assert f"{orch_home} is readable by other users" in warned


@pytest.mark.parametrize("url,needle", [("sqlite:///", "in-memory"), ("sqlite:///:memory:", "in-memory"),
                                        ("sqlite:////no/such/folder/ledger.db", "does not exist")])
def test_a_ledger_url_that_would_lose_the_ledger_is_refused(orch_home, url, needle):
    proc = run_orch("status", "x", env={"ORCH_DATABASE_URL": url})
    one_line_refusal(proc, needle=needle)


@pytest.mark.parametrize("how", ["home is a file", "ledger is a folder", "random bytes", "truncated", "newer"])
def test_a_broken_home_or_ledger_is_one_line(tmp_path, how):
    home = tmp_path / "home"
    if how == "home is a file":
        home.write_text("x")
    else:
        home.mkdir(mode=0o700)
        db = home / "ledger.db"
        if how == "ledger is a folder":
            db.mkdir()
        elif how == "random bytes":
            db.write_bytes(os.urandom(4096))
        else:
            run_orch("status", env={"ORCH_HOME": str(home)}, check=0)
            if how == "truncated":
                db.write_bytes(db.read_bytes()[:1000])
            else:
                import sqlite3

                with sqlite3.connect(db) as conn:
                    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    for args in (["status"], ["status", "--json"], ["status", "x"], ["db", "upgrade"], ["dashboard", "--port", "1"]):
        proc = run_orch(*args, env={"ORCH_HOME": str(home)}, timeout=60)
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, (args, proc.stderr)
        lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("orch: warning")]
        assert len(lines) == 1 and lines[0].startswith("orch: error: "), (args, proc.stderr)
        if how == "newer" and args[0] != "dashboard":  # the dashboard migrates nothing: it says to upgrade
            assert "newer orch" in proc.stderr


def test_a_silent_endpoint_prints_no_library_traceback(orch_home):
    """paramiko's transport thread prints its own traceback for a silent endpoint: not here."""
    import socket

    from orchestrator import config
    from orchestrator.ssh import remote
    from orchestrator.errors import SSHError

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    code = ("import sys\nfrom orchestrator import config\nfrom orchestrator.ssh import remote\nfrom orchestrator.errors import SSHError\n"
            f"try: remote.connect('127.0.0.1', {silent.getsockname()[1]}, 'root', config.ssh_key()[0], None, timeout=1)\n"
            "except SSHError as e: print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "ORCH_HOME": str(orch_home)})
    silent.close()
    assert "refused:" in out.stdout and "Traceback" not in out.stderr and out.stderr.strip() == "", out.stderr
    assert config and remote and SSHError


def cli_in_process(monkeypatch, capsys, home, args) -> tuple[int | str | None, str]:
    """``orch ARGS`` through ``cli.main.main`` in this process, with ``home`` as ORCH_HOME: its exit
    code and what it wrote to stderr (a few hundred inputs: a process each would take minutes)."""
    from orchestrator import config
    from orchestrator.cli.main import main

    monkeypatch.setenv("ORCH_HOME", str(home))
    monkeypatch.setattr(sys, "argv", ["orch", *args])
    config._load.cache_clear()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr()[1]


def test_every_command_refuses_bad_option_values_in_one_line_creating_nothing(tmp_path, monkeypatch, capsys):
    """Every number option of every command, given values of the wrong kind: never a traceback, and
    a refusal is one line, exit 2, with nothing under ORCH_HOME (refused before anything is opened)."""
    from orchestrator.cli import check, data, db, demo, instances, offers, reaper, reconcile  # noqa: F401
    from orchestrator.cli.app import app

    bad = {int: ["-1", "x", "1e20"], float: ["-1", "x", "nan", "inf"]}
    tried = refused = 0
    for path, callback in _commands(app):
        hints = typing.get_type_hints(callback)
        params = inspect.signature(callback).parameters
        required = [("x1" if n in ("name", "provider", "folder") else "acme/x" if n == "repo" else "x")
                    for n, p in params.items() if isinstance(p.default, typer.models.ArgumentInfo)
                    and p.default.default is ...]
        for pname, p in params.items():
            if not isinstance(p.default, typer.models.OptionInfo):
                continue
            kind = next((k for k in (int, float) if hints[pname] in (k, typing.Optional[k])), None)
            flag = next((d for d in (p.default.param_decls or ()) if d.startswith("--")), "--" + pname.replace("_", "-"))
            for value in bad.get(kind, []):
                home = tmp_path / f"h{tried}"
                args = [*path, *required, f"{flag}={value}"]
                code, err = cli_in_process(monkeypatch, capsys, home, args)
                tried += 1
                assert "Traceback" not in err and "internal error" not in err, (args, err)
                assert code == 2, (args, code, err)
                refused += 1
                assert len(err.strip().splitlines()) == 1, (args, err)
                assert not home.exists(), (args, "orch's home was created for a refused argument")
    assert tried > 40 and refused == tried


def _commands(typer_app, path=()):
    for info in typer_app.registered_commands:
        yield (*path, info.name or info.callback.__name__.replace("_", "-")), info.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, (*path, group.name))
