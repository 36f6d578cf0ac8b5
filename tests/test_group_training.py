"""A real 2-node LibreYOLO training: two local instances, torchrun on each, gloo on CPU, tiny data."""

import json
import time

import pytest

from orchestrator import dataset
from tests.conftest import needs_torch, run_orch

pytestmark = [needs_torch, pytest.mark.training]
TRAIN = ["--cpu", "--imgsz", "64", "--batch", "4", "--train-arg", "workers=0", "--model", "yolo9-t"]


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
    deadline = time.monotonic() + 300
    while not all(torchrun_pids(i) for i in ids):
        assert time.monotonic() < deadline, "torchrun never ran on both nodes at once"
        time.sleep(0.5)

    deadline = time.monotonic() + 600
    while True:
        shown = json.loads(run_orch("status", "duo", "--json", check=0).stdout)
        if shown["run"]["state"] in ("completed", "failed", "crashed"):
            break
        assert time.monotonic() < deadline, shown["run"]
        time.sleep(3)
    assert shown["run"]["state"] == "completed" and shown["run"]["epoch"] == 2, shown["run"]

    # World size 2, from rank 0's own log and from the run's record.
    log = run_orch("logs", "duo", "-n", "400", check=0).stdout
    assert "DDP active: rank=0/2" in log and "world_size=2" in log, log[-2000:]
    from orchestrator.lifecycle import Orch

    ledger = Orch.open(say=lambda m: None).ledger
    args = json.loads(ledger.latest_run(ids[0]).args)
    assert args["orch_world_size"] == 2 and args["orch_nodes"] == 2 and args["sync_bn"] is False

    down = run_orch("down", "duo", check=0)
    assert "duo-0 destroyed" in down.stdout and "duo-1 destroyed" in down.stdout
    home = orch_home / "runs" / "duo"
    for f in ("weights/best.pt", "weights/last.pt", "status.json", "metrics.jsonl"):
        assert (home / f).stat().st_size > 0, f
    epochs = [json.loads(line)["epoch"] for line in (home / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert not any(torchrun_pids(i) for i in ids)
    from providers.local import instance_pids

    assert not any(instance_pids(i) for i in ids), "no process of either node is left"
