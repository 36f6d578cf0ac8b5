"""A real LibreYOLO training on a real local instance, watched and pulled the way a user would."""

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from orchestrator.tasks import dataset
from tests.clouds import wait_for
from tests.conftest import needs_torch, on_instance, run_orch

pytestmark = [needs_torch, pytest.mark.training]
checkpoint = on_instance("checkpoint")  # the on-instance check of last.pt, read from this machine's side
TRAIN = ["--cpu", "--imgsz", "64", "--batch", "4", "--train-arg", "workers=0", "--model", "yolo9-t"]


@pytest.fixture
def ds(tmp_path):
    return dataset.synth(tmp_path / "ds", n_train=8, n_val=4)


def status(name):
    return json.loads(run_orch("status", name, "--json", check=0).stdout)


def wait_run(name, until, timeout=400):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status(name)
        if until(s["run"]):
            return s
        time.sleep(2)
    raise AssertionError(f"run on {name} never got there: {s['run']}")


def test_up_train_watch_pull_down(orch_home, ds):
    up = run_orch("up", "tr1", "--data", ds, "--epochs", "2", *TRAIN, "--json", check=0)
    inst = json.loads(up.stdout)
    assert inst["state"] == "ready" and inst["run"]["pid"] and inst["run"]["run_dir"].endswith("/runs/r1")
    assert "disk: " in up.stderr and "rounded up" in up.stderr, "the chosen disk size is explained"

    during = status("tr1")["run"]
    assert during["state"] in ("starting", "running", "completed")
    done = wait_run("tr1", lambda r: r["state"] in ("completed", "failed", "crashed"))["run"]
    assert done["state"] == "completed", done
    assert done["epoch"] == 2 and done["epochs"] == 2 and done["loss"] > 0

    logs = run_orch("logs", "tr1", "-n", "200", check=0).stdout
    assert "Epoch" in logs and "Training complete" in logs

    run_orch("pull", "tr1", check=0)
    home = orch_home / "runs" / "tr1"
    for f in ("weights/best.pt", "weights/last.pt", "status.json", "metrics.jsonl", "train.log"):
        assert (home / f).stat().st_size > 0, f
    epochs = [json.loads(line)["epoch"] for line in (home / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert json.loads((home / "status.json").read_text())["state"] == "completed"
    again = run_orch("pull", "tr1", check=0).stdout
    assert "all up to date" in again, "a second pull re-sends nothing"

    with sqlite3.connect(orch_home / "ledger.db") as db:
        row = db.execute("SELECT run_dir, pid, state, completed_epochs, args FROM runs").fetchone()
    assert row[0] == inst["run"]["run_dir"] and row[1] and row[2] == "completed" and row[3] == 2
    assert json.loads(row[4])["seed"] == 0, "a fixed seed is passed so the run can be repeated"

    check_monitor("tr1", done["run_dir"])

    down = run_orch("down", "tr1", check=0)
    assert "destroyed" in down.stdout
    assert (home / "weights" / "best.pt").exists(), "the weights outlive the instance"


def check_monitor(name, run_dir):
    """orch monitor forwards libreyolo monitor to 127.0.0.1; Ctrl-C ends the forward only."""
    import subprocess
    import sys
    import urllib.request

    from tests.conftest import ROOT

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "monitor", name, "--port", "18420"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split("http://", 1)[1].split()[0].rstrip("/")
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://{url}/api/runs", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert json.loads(body), body
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    assert proc.returncode == 0
    assert status(name)["state"] == "ready", "ending the forward leaves the instance alone"


def kill_between_checkpoints(pid, last_pt):
    """SIGKILL the training, but not while it is writing last.pt: LibreYOLO's torch.save is not
    atomic, and this test is about orch seeing the crash and resuming, not a torn checkpoint."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        if checkpoint.check(str(last_pt))["loads"]:
            break
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)


def test_killed_run_shows_crashed_and_resume_continues_from_last_pt(orch_home, ds):
    run_orch("up", "tr2", "--data", ds, "--epochs", "40", *TRAIN, check=0)
    first = wait_run("tr2", lambda r: (r.get("epoch") or 0) >= 1 and r["state"] == "running")["run"]
    kill_between_checkpoints(first["pid"], Path(first["run_dir"]) / "weights" / "last.pt")
    # The instance is processes on this machine: its pid is ours to check.
    wait_for(lambda: not Path(f"/proc/{first['pid']}").exists(), timeout=30,
             what=f"the killed training (pid {first['pid']}) to go away")
    crashed = status("tr2")["run"]
    assert crashed["state"] == "crashed", "status.json still says running; the dead pid says otherwise"
    assert (orch_home / "runs" / "tr2" / "status.json").exists(), "status pulls the milestones it finds"

    # What it resumes from is last.pt (status.json is written after it, and may be an epoch behind).
    done = checkpoint.check(str(Path(first["run_dir"]) / "weights" / "last.pt"))["epoch"]
    target = done + 2
    resumed = run_orch("up", "tr2", "--resume", "--data", ds, "--epochs", target, *TRAIN, "--wait", "--json", check=0)
    run = json.loads(resumed.stdout)["run"]
    assert run["state"] == "completed" and run["run_dir"] == first["run_dir"], resumed.stderr
    lines = (orch_home / "runs" / "tr2" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines][-1] == target and len(lines) <= target
    st = json.loads((orch_home / "runs" / "tr2" / "status.json").read_text())
    assert st["start_epoch"] == done + 1, "resume continued from last.pt instead of starting over"
    run_orch("down", "tr2", check=0)


def _break(ds, how):
    if how == "no-yaml":
        (ds / "data.yaml").unlink()
    elif how == "class-out-of-range":
        label = sorted((ds / "labels" / "train").iterdir())[0]
        label.write_text("7 0.5 0.5 0.2 0.2\n")
    elif how == "missing-path":
        return ds.parent / "does-not-exist"
    return ds


@pytest.mark.parametrize("how", ["no-yaml", "class-out-of-range", "missing-path"])
def test_bad_data_is_refused_before_anything_is_rented(orch_home, ds, how):
    path = _break(ds, how)
    proc = run_orch("up", "bad", "--data", path, "--epochs", "1", *TRAIN)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (orch_home / "local").exists()
    assert json.loads(run_orch("status", "--all", "--json", check=0).stdout) == []


def test_hf_dataset_push_then_train_from_the_hub(orch_home, ds, tmp_path):
    from tests.fakes.hf_hub import FakeHub

    with FakeHub(tmp_path) as hub:
        env = {**hub.env, "HF_TOKEN": hub.token}
        pushed = run_orch("data", "push", ds, "acme/tiny", env=env, check=0)
        uri = pushed.stdout.strip().splitlines()[-1]
        assert uri.startswith("hf://acme/tiny/") and uri.endswith(".tar")
        up = run_orch("up", "hf1", "--data", uri, "--epochs", "1", *TRAIN, "--wait", "--json", env=env, check=0)
        assert json.loads(up.stdout)["run"]["state"] == "completed"
        downloads = [r for r in hub.requests if "/resolve/" in r.path]
        assert downloads, "the instance downloaded the tar from the hub"
        assert all(hub.token not in r.path for r in hub.requests), "the token never travels in a URL"
        assert any(r.headers.get("authorization") == f"Bearer {hub.token}" for r in downloads)
        # The token never lands in the ledger, the logs or a file orch wrote.
        for path in orch_home.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000 and "home/.cache" not in str(path):
                assert hub.token.encode() not in path.read_bytes(), path
        run_orch("down", "hf1", check=0)


def test_push_to_uploads_milestones_from_the_instance(orch_home, ds, tmp_path):
    """--push-to runs LibreYOLO's Python API with orch's callback: the hub gets each epoch_N.pt."""
    from tests.fakes.hf_hub import FakeHub

    with FakeHub(tmp_path) as hub:
        env = {**hub.env, "HF_TOKEN": hub.token}
        up = run_orch("up", "push1", "--data", ds, "--epochs", "2", "--save-period", "1", "--push-to",
                      "hf://acme/run1", *TRAIN, "--wait", "--json", env=env, check=0)
        assert json.loads(up.stdout)["run"]["state"] == "completed"
        for name in ("weights/epoch_1.pt", "weights/epoch_2.pt", "weights/best.pt"):
            pulled = (orch_home / "runs" / "push1" / name).read_bytes()
            assert hub.file_bytes("model", "acme/run1", name) == pulled, name
        run_orch("down", "push1", check=0)
