"""A real 2-node LibreYOLO training: two local instances, torchrun on each, gloo on CPU, tiny data."""

import json

import pytest

from orchestrator.tasks import dataset
from tests.clouds import wait_for
from tests.conftest import needs_torch, run_orch

pytestmark = [needs_torch, pytest.mark.training]
TRAIN = ["--cpu", "--imgsz", "64", "--batch", "4", "--train-arg", "workers=0", "--model", "yolo9-t"]


def training_pids(instance_id: str) -> list[int]:
    """torchrun and its workers on a local instance (every process running train_entry.py)."""
    from providers.local import instance_pids

    found = []
    for pid in instance_pids(instance_id):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"train_entry.py" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def torchrun_pids(instance_id: str) -> list[int]:
    """The torchrun launchers running on a local instance (its processes carry its id)."""
    from providers.local import instance_pids

    found = []
    for pid in instance_pids(instance_id):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"torch.distributed.run" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_two_nodes_train_one_run_under_torchrun_and_rank_0_brings_the_weights_home(orch_home, tmp_path):
    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    up = run_orch("up", "duo", "--nodes", "2", "--data", ds, "--epochs", "2", *TRAIN, "--json", check=0)
    group = json.loads(up.stdout)
    ids = [n["id"] for n in group["nodes"]]
    assert group["run"]["run_dir"] and "world size 2" in up.stderr, up.stderr

    # Both nodes train at once, each under its own torchrun.
    wait_for(lambda: all(torchrun_pids(i) for i in ids), timeout=300, what="torchrun on both nodes at once")

    # The training ends when no process of it is left on either node (read here, no orch command).
    wait_for(lambda: not any(training_pids(i) for i in ids), timeout=600, what="the training to end on both nodes")
    shown = json.loads(run_orch("status", "duo", "--json", check=0).stdout)
    assert shown["run"]["state"] == "completed" and shown["run"]["epoch"] == 2, shown["run"]

    # World size 2, from rank 0's own log and from the run's record.
    log = run_orch("logs", "duo", "-n", "400", check=0).stdout
    assert "DDP active: rank=0/2" in log and "world_size=2" in log, log[-2000:]
    from orchestrator.instances.lifecycle import Orch

    ledger = Orch.open(say=lambda m: None).ledger
    args = json.loads(ledger.latest_run(ids[0]).args)
    assert args["orch_world_size"] == 2 and args["orch_nodes"] == 2 and args["sync_bn"] is False

    down = run_orch("down", "duo", "--yes", check=0)
    assert "duo-0 destroyed" in down.stdout and "duo-1 destroyed" in down.stdout
    home = orch_home / "runs" / "duo"
    for f in ("weights/best.pt", "weights/last.pt", "status.json", "metrics.jsonl"):
        assert (home / f).stat().st_size > 0, f
    epochs = [json.loads(line)["epoch"] for line in (home / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert not any(torchrun_pids(i) for i in ids)
    from providers.local import instance_pids

    assert not any(instance_pids(i) for i in ids), "no process of either node is left"


def _kill_node(home, instance_name: str) -> None:
    """A lost machine: SIGKILL to its sshd and every process it runs, as a host that vanished."""
    import os
    import signal

    from providers.local import instance_pids, sshd_pid

    folder = next(p for p in (home / "local").iterdir() if p.name.endswith(f"-{instance_name}"))
    iid = folder.name.split("-")[1]
    for pid in [sshd_pid(folder), *instance_pids(iid)]:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _freeze_group(names, at_least: int, patience: float = 300.0):
    """Pause every node's training (torchrun and its workers: the session setsid gave it) once
    rank 0's last.pt is whole at epoch ``at_least``, so what follows meets a known state however
    fast this machine trains; returns what resumes them."""
    import os

    from tests.test_jobs import _freeze
    from orchestrator.instances.lifecycle import Orch

    ledger = Orch.open(say=lambda m: None).ledger

    def send(sig):  # torchrun starts its workers in sessions of their own: each process by name
        for name in names:
            for pid in training_pids(ledger.by_name(name).id):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    return _freeze(names[0], at_least=at_least, patience=patience, send=send)  # rank 0 writes last.pt


def test_a_lost_node_ends_the_attempt_and_the_group_resumes_from_the_checkpoint_on_every_node(orch_home, tmp_path):
    from providers.local import instance_pids
    from tests.test_jobs import _advance_until, _job, epochs_in, live_instances

    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    epochs = 4
    orch_home.mkdir(parents=True)
    (orch_home / "config.toml").write_text("[providers.local]\nprice_per_hour = 3.6\n")  # 0.001 $/s, each node
    run_orch("run", "gj", "--nodes", "2", "--data", ds, "--epochs", str(epochs), "--save-period", "1", *TRAIN,
             check=0)
    first = _job("gj")
    assert first["nodes"] == 2 and first["attempts"][0]["instance"] == "gj-a1"
    resume = _freeze_group(("gj-a1-0", "gj-a1-1"), at_least=1)  # between two epochs, on both nodes
    job = _advance_until("gj", lambda j: (j["checkpoint_epoch"] or 0) >= 1, timeout=300, every=1)
    assert job["state"] == "running" and (job["epoch"] or 0) < epochs, "lost before its end"
    kept = job["checkpoint_epoch"]
    from orchestrator.instances.lifecycle import Orch

    ledger = Orch.open(say=lambda m: None).ledger
    old = {n: ledger.by_name(n).id for n in ("gj-a1-0", "gj-a1-1")}
    _kill_node(orch_home, "gj-a1-1")
    resume()  # node 0 goes on, and meets its peer gone

    job = _advance_until("gj", lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["state"] == "running",
                         timeout=400, every=2)
    lost, second = job["attempts"]
    assert lost["state"] == "lost" and "node 1" in lost["reason"], lost
    # Node 1 alone was replaced: the same group (gj-a1), the survivor kept with its data staged.
    assert second["instance"] == "gj-a1" and second["start_epoch"] == kept + 1, second
    assert ledger.get(old["gj-a1-0"]).state == "ready", "the survivor is kept"
    assert not instance_pids(old["gj-a1-1"]) and ledger.get(old["gj-a1-1"]).state in ("destroyed", "lost")
    assert any("replaced alone" in h["text"] for h in job["history"]), job["history"][-5:]

    job = _advance_until("gj", lambda j: j["state"] not in ("running", "recovering"), timeout=600, every=3)
    assert job["state"] == "completed", job["history"][-5:]
    folder = orch_home / "runs" / "gj"
    assert epochs_in(folder / "metrics.jsonl") == list(range(1, epochs + 1)), "metrics cover every epoch"
    assert json.loads((folder / "status.json").read_text())["start_epoch"] == kept + 1 > 1
    assert (folder / "weights" / "best.pt").stat().st_size > 0
    # --max-cost's count: every machine the job rented (three: the replaced node too), as `orch cost` bills them.
    spent = json.loads(run_orch("cost", "--json", check=0).stdout)
    assert sorted(i["name"] for i in spent["instances"]) == ["gj-a1-0", "gj-a1-1", "gj-a1-1"]
    assert job["cost"] > 0 and job["cost"] == pytest.approx(spent["providers"]["local"]["total_usd"], abs=1e-3)
    assert job["attempts"][0]["cost"] == pytest.approx(spent["groups"]["gj-a1"]["total_usd"], abs=1e-3)
    assert live_instances() == []
    assert not any(instance_pids(i.id) for i in ledger.instances()), "no process of any node is left"
