"""A job is watched without asking (issue 43), on the local provider: the detached watcher that
`orch run` starts copies checkpoints on the job's own cadence, relaunches a machine killed from
outside and completes the job with no further orch command, then exits; the ledger blames what
really ended a machine; the newest checkpoint copies outlive the job; `orch jobs logs -f` ends with
its job; "not found yet" is said once per attempt; a group job shows each node's progress.

The suite runs with ``ORCH_WATCHER=off`` (tests/conftest.py): the tests here that want the
watcher turn it on for the `orch run` that starts it, as a user's environment has it.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.clouds import configure, wait_for
from tests.conftest import on_instance, run_orch
from tests.test_tasks import live_instances, write

WATCHED = {"ORCH_WATCHER": "on", "ORCH_WATCH_INTERVAL": "1"}

# Counts steps 1..N, one every 0.5 s, its state in $ORCH_CHECKPOINT_DIR (written aside, then
# renamed). The first attempt stops at step PAUSE and waits there to be killed, so that what the
# test sees does not depend on this machine's speed.
STEPS_PY = '''
import os, sys, time
from pathlib import Path

ckpt = Path(os.environ["ORCH_CHECKPOINT_DIR"])
state = ckpt / "step"
done = int(state.read_text()) if state.exists() else 0
print(f"starting after step {done}", flush=True)
steps, pause = int(sys.argv[1]), int(sys.argv[2])
for step in range(done + 1, steps + 1):
    time.sleep(0.5)
    with open(ckpt / "steps.txt", "a") as f:
        f.write(f"{step}\\n")
    (ckpt / ".step").write_text(str(step))
    os.replace(ckpt / ".step", state)
    print(f"step {step}", flush=True)
    if step == pause and not done:
        time.sleep(3600)
Path("out").mkdir(exist_ok=True)
Path("out/steps.txt").write_text((ckpt / "steps.txt").read_text())
'''


def ledger():
    from orchestrator import config
    from orchestrator.ledger.ledger import Ledger

    return Ledger(config.database_url())


def job_state(name: str) -> str | None:
    job = ledger().job(name)
    return job.state if job is not None else None


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie nobody reaped has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[1].split()[0] != "Z"


def watcher_pid(proc) -> int:
    m = re.search(r"is watched by a detached watcher \(pid (\d+), log (\S+)\)", proc.stderr)
    assert m, proc.stderr
    assert Path(m[2]) == Path(os.environ["ORCH_HOME"]) / "watcher.log"
    return int(m[1])


def copies(orch_home: Path, name: str) -> dict[int, str]:
    """The job's checkpoint copies at home: {number: the step its folder holds}."""
    out = {}
    for d in (orch_home / "jobs" / name).glob("ckpt-*"):
        if d.name[5:].isdigit() and (d / "step").is_file():
            out[int(d.name[5:])] = (d / "step").read_text()
    return out


def nothing_left(orch_home: Path, attempts: list[dict]) -> None:
    from providers import local as sshd

    assert live_instances() == []
    for a in attempts:
        inst = ledger().get(a["instance_id"])
        assert sshd.instance_pids(inst.id) == [], f"{inst.name} left processes"
    root = orch_home / "local"
    assert not root.exists() or not [d for d in root.iterdir() if not d.name.startswith(".")]


# -- 1 and 4: always watched; a machine killed from outside is relaunched and blamed on no one of orch ----
@pytest.mark.long
def test_a_job_without_wait_survives_its_machine_killed_from_outside_with_no_further_orch_command(orch_home,
                                                                                                  tmp_path):
    from providers.local import LocalProvider

    steps, pause = 6, 3
    write(tmp_path / "work" / "steps.py", STEPS_PY)
    task = write(tmp_path / "task.yaml", f"""
        name: kept
        workdir: work
        run: python steps.py {steps} {pause}
        checkpoint: ckpt
        checkpoint_minutes: 0.01
        outputs: [out/steps.txt]
        """)
    proc = run_orch("run", "-f", task, "--provider", "local", "--cpu", env=WATCHED, check=0)
    pid = watcher_pid(proc)
    assert alive(pid)

    # The watcher copies the checkpoint folder home on the job's cadence: nobody else looks.
    wait_for(lambda: str(pause) in copies(orch_home, "kept").values(), timeout=120,
             what=f"a checkpoint copy at step {pause}")
    inst = ledger().by_name("kept-a1")
    LocalProvider(None, orch_home).destroy(inst.provider_id)  # the machine is killed from outside

    wait_for(lambda: job_state("kept") not in ("planned", "running", "recovering"), timeout=240,
             what="the job to end with no further orch command")
    wait_for(lambda: not alive(pid), timeout=30, what="the watcher to exit")
    job = json.loads(run_orch("jobs", "show", "kept", "--json", check=0).stdout)
    assert job["state"] == "completed", job["history"][-5:]
    first, second = job["attempts"]
    assert (first["state"], second["state"]) == ("lost", "completed"), job["attempts"]
    # Blame: killed from outside, never "stopped from inside ... by watchdog".
    assert "from outside orch" in first["reason"] or "not by orch" in first["reason"], first["reason"]
    assert "watchdog" not in first["reason"] and "from inside" not in first["reason"], first["reason"]
    assert all(e.actor != "watchdog" for e in ledger().events(inst.id)), "the watchdog was blamed"
    assert "restored" in (second["resumed_from"] or ""), second
    folder = orch_home / "runs" / "kept"
    done = (folder / "out" / "steps.txt").read_text().split()
    assert done == [str(i) for i in range(1, steps + 1)], f"each step once, resumed after {pause}: {done}"
    assert f"starting after step {pause}" in (folder / "train.log").read_text()
    # The newest copy (the folder as the command left it) is kept, and the reason says where.
    kept = copies(orch_home, "kept")
    assert list(kept.values()) == [str(steps)], kept
    assert f"kept in {orch_home / 'jobs' / 'kept' / f'ckpt-{max(kept)}'}" in job["reason"], job["reason"]
    nothing_left(orch_home, job["attempts"])
    log = (orch_home / "watcher.log").read_text()
    assert "exits: no job is active" in log and "job kept: completed" in log, log[-2000:]


# -- 5: copies on the job's cadence wherever the watcher is, the newest N kept ------------------------
@pytest.mark.long
def test_the_watcher_copies_on_the_jobs_cadence_not_its_own_interval_and_keeps_the_newest(orch_home, tmp_path):
    steps = 20
    write(tmp_path / "work" / "steps.py", STEPS_PY)
    task = write(tmp_path / "task.yaml", f"""
        name: cadence
        resources: {{cpu: true, provider: local}}
        workdir: work
        run: python steps.py {steps} 0
        checkpoint: ckpt
        checkpoint_minutes: 0.02
        keep_checkpoints: 3
        """)
    # A look every 30 s of its own, but a copy is due every 1.2 s: the watcher looks then.
    proc = run_orch("run", "-f", task, env={**WATCHED, "ORCH_WATCH_INTERVAL": "30"}, check=0)
    pid = watcher_pid(proc)
    wait_for(lambda: job_state("cadence") == "completed", timeout=120, what="the job to complete")
    wait_for(lambda: not alive(pid), timeout=30, what="the watcher to exit")
    job = ledger().job("cadence")
    kept = copies(orch_home, "cadence")
    assert len(kept) == 3 and kept[max(kept)] == str(steps), kept  # the newest 3, the last one whole
    assert max(kept) >= 3, f"copies taken while it ran ({steps * 0.5:.0f} s, one due every 1.2 s): {kept}"
    assert str(orch_home / "jobs" / "cadence") in job.reason and "3 checkpoint copies kept" in job.reason, job.reason


# -- 6: `orch jobs logs -f` ends with its job; `orch logs JOB` points there ----------------------------
def test_jobs_logs_follow_ends_when_the_job_ends_and_orch_logs_points_to_it(orch_home):
    proc = run_orch("run", "lf", "--cpu", "--", "bash", "-c", "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done",
                    env=WATCHED, check=0)
    pid = watcher_pid(proc)
    t0 = time.monotonic()
    follow = run_orch("jobs", "logs", "lf", "-f", timeout=120, check=0)  # a hang fails the test
    assert [f"line {i}" for i in range(1, 7)] == [line for line in follow.stdout.splitlines()
                                                  if line.startswith("line ")], follow.stdout
    assert job_state("lf") == "completed" and time.monotonic() - t0 < 60
    wait_for(lambda: not alive(pid), timeout=30, what="the watcher to exit")
    pointer = run_orch("logs", "lf", check=2)
    assert pointer.stderr.count("\n") == 1 and "`orch jobs logs lf`" in pointer.stderr, pointer.stderr


def test_jobs_logs_follow_looks_itself_when_nothing_watches(orch_home):
    run_orch("run", "lo", "--cpu", "--", "bash", "-c", "echo one; sleep 1; echo two", check=0)  # ORCH_WATCHER=off
    follow = run_orch("jobs", "logs", "lo", "-f", timeout=120, check=0)
    assert "one" in follow.stdout and "two" in follow.stdout and job_state("lo") == "completed", follow.stdout


# -- 4: the watchdog is blamed on its own word only ----------------------------------------------------
def test_a_stop_is_the_watchdogs_only_on_its_own_word(orch_home):
    from orchestrator.provider import features
    from providers import local as sshd
    from providers.local import LocalProvider

    run_orch("run", "bl", "--cpu", "--retries", "1", "--", "sleep", "600", check=0)
    first = ledger().by_name("bl-a1")
    sshd.kill_instance(orch_home / "local" / first.provider_id, first.id)  # killed from outside: stopped
    job = json.loads(run_orch("jobs", "show", "bl", "--json", check=0).stdout)  # a look: lost, relaunched
    assert [a["state"] for a in job["attempts"]] == ["lost", "running"], job["attempts"]
    reason = job["attempts"][0]["reason"]
    assert "not by orch" in reason and "watchdog" not in reason and "from inside" not in reason, reason
    stop = [e for e in ledger().events(first.id) if e.to_state == "stopped"]
    assert [e.actor for e in stop] == ["cli"] and "not by orch" in stop[0].reason

    # The watchdog's own stop, as it makes it: its provider's self-stop with its reason.
    second = ledger().by_name("bl-a2")
    command = features.self_end_commands(LocalProvider(None, orch_home), second.provider_id, False)["stop"]
    rc, err = on_instance("watchdog").act(command, "idle 1.0 min (limit 1): no training, no interactive SSH session")
    assert rc == 0, err
    job = json.loads(run_orch("jobs", "show", "bl", "--json", check=0).stdout)
    assert job["state"] == "failed" and [a["state"] for a in job["attempts"]] == ["lost", "lost"], job["attempts"]
    stop = [e for e in ledger().events(second.id) if e.to_state == "stopped"]
    assert [e.actor for e in stop] == ["watchdog"], [(e.actor, e.reason) for e in stop]
    assert "stopped by its watchdog" in stop[0].reason and "idle 1.0 min (limit 1)" in stop[0].reason
    assert live_instances() == []


# -- 8: "not found yet" once per attempt -------------------------------------------------------------
def test_not_found_yet_is_said_once_per_attempt_not_at_every_look(orch_home, tmp_path):
    task = write(tmp_path / "task.yaml", """
        name: once
        resources: {cpu: true}
        run: sleep 600
        outputs: [out/model.pt]
        checkpoint: ckpt
        checkpoint_minutes: 0.001
        """)
    run_orch("run", "-f", task, check=0)
    for _ in range(3):
        job = json.loads(run_orch("jobs", "show", "once", "--json", check=0).stdout)
    lines = [h["text"] for h in job["history"]]
    # An output written only at the end is not missing while the command runs (issue 55, 8): the end says it.
    assert sum("output(s) not found" in t for t in lines) == 0, lines
    assert sum("no checkpoint copy this time" in t for t in lines) == 1, lines
    run_orch("jobs", "cancel", "once", check=0)
    lines = [h["text"] for h in json.loads(run_orch("jobs", "show", "once", "--json", check=0).stdout)["history"]]
    assert sum("output(s) not found" in t for t in lines) == 1, lines
    assert live_instances() == []


# -- 10: a group job prints each node's progress -------------------------------------------------------
def test_a_group_job_prints_each_nodes_progress(orch_home):
    from orchestrator.views.jobs import node_lines

    waited = run_orch("run", "gp", "--nodes", "2", "--provider", "local", "--cpu", "--wait", "--", "bash", "-c",
                      "sleep 3", check=0)
    for rank in (0, 1):
        assert re.search(rf"node {rank} +gp-a1-{rank}: ready, command running", waited.stderr), waited.stderr
    shown = run_orch("jobs", "show", "gp", check=0).stdout
    for rank in (0, 1):
        assert re.search(rf"node {rank} +gp-a1-{rank}: destroyed, command completed \(exit 0\)", shown), shown
    # A LibreYOLO group: the epoch its rank 0 reports, on each node's line.
    d = {"kind": "train", "epochs": 10, "node_progress": [
        {"rank": r, "instance": f"g-a1-{r}", "instance_state": "ready", "run_state": "running", "exit_code": None,
         "epoch": 3, "unreachable_since": None} for r in (0, 1)]}
    assert node_lines(d) == [f"  node {r}   g-a1-{r}: ready, training running, epoch 3/10" for r in (0, 1)]


# -- one watcher per ledger ----------------------------------------------------------------------------
def test_a_second_watcher_leaves_at_once_and_a_bad_interval_is_refused(orch_home):
    from orchestrator.ledger import claims
    from orchestrator.reaper import watcher

    led = ledger()
    with claims.hold(led, watcher.CLAIM):
        second = run_orch("watch", env={"ORCH_WATCHER": "on"}, timeout=60, check=0)
    assert "another watcher watches this ledger" in second.stdout, second.stdout
    bad = run_orch("watch", "--interval", "nan", check=2)
    assert "interval" in bad.stderr and bad.stderr.count("\n") == 1


# -- issue 55, 1: every job is watched, a schedule's run too, with no reaper installed ------------------
def test_a_scheduled_run_started_by_hand_is_watched_and_stopped_for_max_cost_within_seconds(orch_home, tmp_path):
    configure(orch_home, "local", {"price_per_hour": 0.5})
    task = write(tmp_path / "task.yml", """
        name: capped
        resources: {cpu: true}
        run: sleep 600
        """)
    run_orch("schedule", "add", "capped", "-f", task, "--cron", "0 2 * * *", "--max-cost", "0.001", check=0)
    ran = run_orch("schedule", "run", "capped", env=WATCHED, check=0)
    name = ran.stdout.split(":")[0]
    assert ran.stderr.count("plan: ") == 1, "its plan said once, not the estimate's too: " + ran.stderr
    pid = watcher_pid(ran)
    # $0.001 at $0.5/hr is 7.2 s of machine: the watcher stops it then, not at a pass nobody makes.
    wait_for(lambda: job_state(name) in ("failed", "completed", "cancelled"), timeout=90,
             what="the watcher to end the capped run")
    job = ledger().job(name)
    assert job.state == "failed" and "--max-cost $0.001" in job.reason, job.reason
    assert "its command stopped" in job.reason and "epoch" not in job.reason, "a command counts no epochs"
    shown = json.loads(run_orch("jobs", "show", name, "--json", check=0).stdout)
    # Without a watcher it ran on unbounded (11 times the cap 30 s in); a loaded machine's looks are slow.
    assert shown["cost"] < 0.01, f"stopped near its cap, not many times over: {shown['cost']}"
    assert live_instances() == []
    wait_for(lambda: not alive(pid), timeout=30, what="the watcher to exit")


def test_a_run_a_reaper_pass_by_hand_starts_is_watched_to_its_completion(orch_home, tmp_path):
    from orchestrator.schedules import ledger_schedules

    task = write(tmp_path / "task.yml", """
        name: tick
        resources: {cpu: true}
        run: echo done > out.txt
        outputs: [out.txt]
        """)
    run_orch("schedule", "add", "-f", task, "--cron", "* * * * *", check=0)
    s = ledger_schedules.get(ledger(), "tick")
    now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    ledger_schedules.change(ledger(), s.id, due_at=now)  # due this minute, rather than a wait for the next
    passed = run_orch("reap", env=WATCHED, check=0)
    [name] = [j.name for j in ledger().jobs() if j.name.startswith("tick-")]
    assert "is watched by a detached watcher" in passed.stderr, passed.stderr
    # The pass's table shows the machine its run was given, not "no live instances" (issue 55, 8).
    assert "no live instances" not in passed.stdout, passed.stdout
    assert re.search(rf"{name}-a1 +local +\w+ +job +- +made for a job in this pass", passed.stdout), passed.stdout
    # Nobody looks again: the watcher sees the command end, pulls its output and ends the machine.
    wait_for(lambda: job_state(name) == "completed", timeout=60, what="the watcher to complete the run")
    assert (orch_home / "runs" / name / "out.txt").read_text() == "done\n"
    assert live_instances() == []


@pytest.mark.parametrize("shell_value", [None, "another-value-in-the-shell"])
def test_a_scheduled_run_with_a_secret_watched_by_the_watcher_brings_its_outputs_and_log_home(orch_home, tmp_path,
                                                                                             shell_value):
    """`orch schedule run` from a shell that no longer exports the secret (the schedule keeps it):
    the watcher, which never held it either, left every text file on the instance and destroyed it,
    the job `completed` with `pulled 0 new file(s)` and `orch jobs logs` had nothing to show. From a
    shell that exports another value under that name, the watcher hid that value and the schedule's,
    which the run got, came home in clear."""
    secret = "s3cret-" + os.urandom(6).hex()
    task = write(tmp_path / "task.yml", """
        name: keyed-nightly-report
        resources: {cpu: true}
        secrets: [KEYED_TOKEN]
        run: echo "token $KEYED_TOKEN" && echo done > out.txt
        outputs: [out.txt]
        """)
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", env={"KEYED_TOKEN": secret}, check=0)
    other = write(tmp_path / "other.yml", "name: other\nresources: {cpu: true}\nsecrets: [KEYED_TOKEN]\nrun: 'true'\n")
    run_orch("schedule", "add", "-f", other, "--cron", "0 3 * * *", env={"KEYED_TOKEN": "0"}, check=0)  # not this run's
    shell = {"KEYED_TOKEN": shell_value} if shell_value else {}
    ran = run_orch("schedule", "run", "keyed-nightly-report", env={**WATCHED, **shell}, check=0)
    name = ran.stdout.split(":")[0]
    wait_for(lambda: job_state(name) == "completed", timeout=60, what="the watcher to complete the run")
    assert (orch_home / "runs" / name / "out.txt").read_text() == "done\n", "its output came home"
    logs = run_orch("jobs", "logs", name, check=0).stdout
    assert "token ***" in logs and secret not in logs, logs
    assert f"{name}-a1" in logs, "its own text, not masked by another schedule's value: " + logs
    assert name in run_orch("jobs", check=0).stdout.split(), "`orch jobs` shows its name whole, not folded"
    assert live_instances() == []


def test_a_pass_that_ends_a_group_job_shows_its_nodes_ended_not_ready(orch_home):
    run_orch("run", "g2", "--nodes", "2", "--provider", "local", "--cpu", "--", "true", check=0)

    def ending_pass():
        p = run_orch("reap", check=0)
        return p.stdout if "job g2: completed" in p.stdout else None

    table = wait_for(ending_pass, timeout=120, what="a pass that completes the job")
    for rank in (0, 1):
        assert re.search(rf"g2-a1-{rank} +local +destroyed +job +- +its job ended it in this pass", table), table
    assert " ready " not in table, table
    assert live_instances() == []


def test_a_failed_groups_other_node_is_not_shown_running_on_a_destroyed_machine(orch_home):
    run_orch("run", "gf", "--nodes", "2", "--provider", "local", "--cpu", "--wait", "--", "bash", "-c",
             '[ "$ORCH_NODE_RANK" = 1 ] && exit 3; sleep 600', check=1)
    shown = run_orch("jobs", "show", "gf", check=0).stdout
    assert re.search(r"node 1 +gf-a1-1: destroyed, command failed \(exit 3\)", shown), shown
    assert re.search(r"node 0 +gf-a1-0: destroyed, command ended with its machine", shown), shown
    assert "destroyed, command running" not in shown and "run      running" not in shown, shown
    assert live_instances() == []
