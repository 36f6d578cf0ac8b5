"""A command on several machines (`nodes: N`, `--nodes N -- CMD`): one world, one verdict, a lost
node replaced alone, and nothing of a group left billing by a failed or interrupted bring-up.
Every group here is real: local instances (an sshd each, on its own loopback address), torch's own
launcher on gloo, accelerate's multi-node flags."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest

from tests.clouds import local_billing, lost_midway, open_orch, orch_proc, wait_for
from tests.conftest import ROOT, run_orch, skip_without

EXAMPLES = ROOT / "examples"


def live_instances() -> list:
    return [i for i in open_orch().ledger.instances() if i.state not in ("destroyed", "failed", "lost")]


def group_rows(prefix: str) -> list:
    return sorted((i for i in open_orch().ledger.instances() if i.name.startswith(prefix)),
                  key=lambda i: (i.node_rank or 0, i.created_at))


def test_dash_dash_nodes_runs_the_command_on_every_node_with_its_rank_and_the_head(orch_home):
    proc = run_orch("run", "pair", "--nodes", "2", "--cpu", "--wait", "--json", "--", "sh", "-c",
                    'echo "rank=$ORCH_NODE_RANK of=$ORCH_NUM_NODES head=$ORCH_MASTER_ADDR:$ORCH_MASTER_PORT '
                    'procs=$ORCH_PROCS_PER_NODE ips=$(echo $ORCH_NODE_IPS)"', check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["nodes"] == 2, job["history"][-3:]
    # every node went, and the job says so (it named rank 0 alone: "instance pair-a1-0 destroyed")
    assert "the group pair-a1 (2 nodes) destroyed" in job["reason"], job["reason"]
    rows = group_rows("pair-a1-")
    assert [r.node_rank for r in rows] == [0, 1] and len({r.private_ip for r in rows}) == 2
    head = rows[0].private_ip
    folder = orch_home / "runs" / "pair"
    lines = {0: (folder / "train.log").read_text(), 1: (folder / "train.node1.log").read_text()}
    port = None
    for rank, text in lines.items():
        line = next(x for x in text.splitlines() if x.startswith("rank="))
        fields = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
        assert fields["rank"] == str(rank) and fields["of"] == "2" and fields["procs"] == "1", line
        assert fields["head"].startswith(f"{head}:"), line
        port = port or fields["head"].split(":")[1]
        assert fields["head"].endswith(f":{port}") and int(port) >= 1024, "one port, the head's, for every node"
    logs = run_orch("jobs", "logs", "pair", "--node", "1", check=0).stdout
    assert "rank=1 of=2" in logs
    assert run_orch("jobs", "logs", "pair", "--node", "2", check=2).stderr.count("\n") == 1
    assert live_instances() == [] and local_billing(orch_home) == set()


def test_a_node_that_exits_non_zero_fails_the_job_naming_its_rank_and_the_others_end(orch_home):
    t0 = time.monotonic()
    proc = run_orch("run", "boom", "--nodes", "2", "--cpu", "--wait", "--json", "--", "sh", "-c",
                    'if [ "$ORCH_NODE_RANK" = 1 ]; then echo "rank 1 went boom"; exit 3; fi; sleep 120', check=1)
    job = json.loads(proc.stdout)
    assert job["state"] == "failed", job["history"][-3:]
    assert "node 1: run exited 3" in job["reason"] and "rank 1 went boom" in job["reason"], job["reason"]
    assert "the group boom-a1 (2 nodes) destroyed" in job["reason"], job["reason"]
    assert time.monotonic() - t0 < 110, "the head's command was ended, not waited for"
    assert live_instances() == [] and local_billing(orch_home) == set()


@pytest.mark.long
def test_the_torchrun_example_trains_as_one_world_on_two_local_nodes(orch_home):
    skip_without("torch")
    proc = run_orch("run", "-f", EXAMPLES / "torchrun-2-nodes" / "task.yaml", "--provider", "local", "--cpu",
                    "--env", "STEPS=20", "--wait", "--json", check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["exit_code"] == 0, job["history"][-3:]
    folder = orch_home / "runs" / "ddp"
    assert (folder / "out" / "run.txt").read_text().splitlines()[0] == "world 2"
    assert (folder / "out" / "model.pt").stat().st_size > 0
    both = (folder / "train.log").read_text() + (folder / "train.node1.log").read_text()
    assert "rank 0 of world 2 on node 0" in both and "rank 1 of world 2 on node 1" in both
    assert live_instances() == []


@pytest.mark.long
def test_the_hf_accelerate_example_runs_on_two_nodes_with_accelerates_multi_node_flags(orch_home):
    skip_without("transformers", "accelerate")
    proc = run_orch("run", "-f", EXAMPLES / "hf-accelerate" / "task.yaml", "--nodes", "2", "--wait", "--json", check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["exit_code"] == 0, job["history"][-3:]
    folder = orch_home / "runs" / "tiny-gpt2"
    assert (folder / "out" / "world.txt").read_text().strip() == "2", "one accelerate world over both nodes"
    assert (folder / "out" / "steps.txt").read_text().strip() == "6"
    assert live_instances() == []


@pytest.mark.long(weight=2)
def test_a_lost_node_is_replaced_alone_and_the_group_resumes_from_the_restored_checkpoint(orch_home, tmp_path):
    skip_without("torch")
    work = tmp_path / "ddp"
    shutil.copytree(EXAMPLES / "torchrun-2-nodes", work)
    task = (work / "task.yaml").read_text().replace("checkpoint_minutes: 10", "checkpoint_minutes: 0.02")
    (work / "task.yaml").write_text(task)
    out, err = lost_midway("ddp", 1, 480, "run", "-f", work / "task.yaml", "--provider", "local", "--cpu", "--env",
                           "STEPS=80", "--env", "STEP_SLEEP=0.25", "--wait", "--json", node_rank=1)
    job = json.loads(out)
    assert job["state"] == "completed", (job["history"][-5:], err[-2000:])
    rows = group_rows("ddp-a1-")
    assert [r.node_rank for r in rows] == [0, 1, 1], "three machines rented in all: the lost one replaced alone"
    assert len({r.group_id for r in rows}) == 1
    history = " ".join(h["text"] for h in job["history"])
    assert "replaced alone" in history and "saved" in history, history[-2000:]
    # What the user reads, in the order it happened, though the new node was rented beside the
    # survivors' stop and the checkpoint's pull: each line once, none lost to the other.
    lines = [h["text"] for h in job["history"]]
    steps = ("attempt 1 lost", "ended the training on every node", "took the checkpoint folder",
             "attempt 2: node 1 (ddp-a1-1) replaced alone", "attempt 2 running")
    at = [next((k for k, line in enumerate(lines) if line.startswith(step)), None) for step in steps]
    assert None not in at and at == sorted(at), lines[-8:]
    run = (orch_home / "runs" / "ddp" / "out" / "run.txt").read_text().splitlines()
    assert run[0] == "world 2" and run[1] != "resumed from step 0", run
    assert live_instances() == [] and local_billing(orch_home) == set()


def test_ctrl_c_during_a_groups_bring_up_leaves_no_process_and_no_live_row(orch_home):
    proc = orch_proc("up", "g", "--provider", "local", "--cpu", "--nodes", "2")

    def both_created():
        if proc.poll() is not None:
            return "ended"  # before its nodes were made: what it said is the failure's reason
        return (orch_home / "ledger.db").exists() and \
            len([i for i in open_orch().ledger.instances() if i.state == "provisioning"]) == 2
    try:
        got = wait_for(both_created, 120, "both nodes created", every=0.1)  # provisioning lasts about a second here
        assert got is True, f"orch up ended ({proc.returncode}) first: {proc.communicate()[1][-3000:]}"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "orch: interrupted" in err, err  # not 0, as Typer would have it
    assert live_instances() == [], err
    assert local_billing(orch_home) == set(), "every node made so far destroyed"


REPLACED = """
name: rep
resources:
  cpu: true
nodes: 2
run: |
  mkdir -p ckpt
  n=$(cat ckpt/n 2>/dev/null || echo 0)
  while [ "$n" -lt 3000 ]; do n=$((n + 1)); [ "$ORCH_NODE_RANK" = 0 ] && echo "$n" > ckpt/n; sleep 0.1; done
checkpoint: ckpt
checkpoint_minutes: 0.02
"""


def test_ctrl_c_while_a_lost_node_is_replaced_leaves_no_node_of_the_old_group_billing(orch_home, tmp_path):
    """The survivors of node 1's loss stayed ready (and billing) after a Ctrl-C during node 1's
    replacement: the next look relaunched the job as a new group beside them, and nothing ended them."""
    (tmp_path / "task.yaml").write_text(REPLACED)
    proc = orch_proc("run", "-f", tmp_path / "task.yaml", "--wait", "--json")
    try:
        ledger = open_orch().ledger
        wait_for(lambda: (ledger.job("rep") or None) and (ledger.job("rep").checkpoint_epoch or 0) >= 1, 240,
                 "a checkpoint copy of rep at home")
        lost = next(i for i in ledger.instances() if i.name == "rep-a1-1")
        open_orch().provider("local").destroy(lost.provider_id)

        def renting():  # node 1's replacement rented, attempt 2 not running yet
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            return any(i.name == "rep-a1-1" and i.id != lost.id for i in ledger.instances())
        wait_for(renting, 240, "node 1's replacement rented", every=0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    job = ledger.job("rep")
    assert [a.state for a in ledger.attempts(job.id)] == ["lost", "interrupted"], err[-3000:]
    shown = json.loads(run_orch("jobs", "show", "rep", "--json", check=0).stdout)  # the job advanced once more
    fleet = json.loads(run_orch("status", "--all", "--json", check=0).stdout)
    live = {i["name"] for i in fleet if i["state"] not in ("destroyed", "failed", "lost")}
    assert not {n for n in live if n.startswith("rep-a1-")}, (live, shown["history"][-6:])
    assert shown["state"] == "running" and live == {"rep-a3-0", "rep-a3-1"}, (shown["state"], live)
    run_orch("jobs", "cancel", "rep", check=0)
    assert live_instances() == [] and local_billing(orch_home) == set()


def test_the_dry_run_shows_the_groups_plan_and_bad_group_input_is_refused_before_anything(orch_home):
    plan = run_orch("run", "-f", EXAMPLES / "torchrun-2-nodes" / "task.yaml", "--provider", "local", "--cpu",
                    "--dry-run", check=0).stdout
    assert "2 node(s)" in plan and "rented together" in plan and "ORCH_MASTER_PORT" in plan, plan
    refused = run_orch("run", "x", "--nodes", "2", "--provider", "vastai", "--", "true", check=2).stderr
    assert "no private network" in refused and "planned separately" in refused and refused.count("\n") == 1
    assert run_orch("run", "x", "--nodes", "65", "--cpu", "--", "true", check=2).stderr.count("\n") == 1
    assert not (orch_home / "ledger.db").exists() or open_orch().ledger.instances() == []
