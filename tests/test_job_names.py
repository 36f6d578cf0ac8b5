"""A job's name can be used again (issue 55, 4): `orch jobs rm NAME` removes an ended job (its row
and its files, asking first), `orch run --replace` re-runs an ended job's name, a dry run never
refuses for the name's files, and a running job's name stays refused. Command jobs on the local
provider, each a few seconds. Ctrl-C during `orch run --wait`: before the command started it cancels the
job; after, the job goes on."""

from __future__ import annotations

import json

from tests.conftest import run_orch
from tests.test_tasks import live_instances


def jobs_named(name: str) -> list[dict]:
    return [d for d in json.loads(run_orch("jobs", "--json", check=0).stdout) if d["name"] == name]


def test_an_ended_jobs_name_is_reused_with_replace_and_a_dry_run_never_refuses_it(orch_home):
    run_orch("run", "tiny-ft", "--cpu", "--wait", "--", "echo", "first", check=0)
    log = orch_home / "runs" / "tiny-ft" / "train.log"
    assert "first" in log.read_text()

    again = run_orch("run", "tiny-ft", "--cpu", "--", "echo", "second", check=2)
    [line] = again.stderr.strip().splitlines()
    assert "already holds job tiny-ft's files" in line and "--replace" in line and "orch jobs rm tiny-ft" in line
    assert len(jobs_named("tiny-ft")) == 1, "nothing recorded"

    dry = run_orch("run", "tiny-ft", "--cpu", "--dry-run", "--", "echo", "second", check=0)
    assert "nothing rented" in dry.stdout + dry.stderr

    replaced = run_orch("run", "tiny-ft", "--cpu", "--replace", "--wait", "--", "echo", "second", check=0)
    assert "replaces job tiny-ft (completed" in replaced.stderr, replaced.stderr
    [job] = jobs_named("tiny-ft")
    assert job["state"] == "completed" and len(job["attempts"]) == 1, job
    text = log.read_text()
    assert "second" in text and "first" not in text, "the old job's files went with it"
    assert live_instances() == []


def test_a_running_jobs_name_stays_refused_even_with_replace_and_cannot_be_removed(orch_home):
    run_orch("run", "busy", "--cpu", "--", "sleep", "600", check=0)
    refused = run_orch("run", "busy", "--cpu", "--replace", "--", "echo", "x", check=2)
    assert "a job named 'busy' is already running" in refused.stderr, refused.stderr
    rm = run_orch("jobs", "rm", "busy", "--yes", check=2)
    assert "busy is running: `orch jobs cancel busy` first" in rm.stderr
    [job] = jobs_named("busy")
    assert job["state"] == "running" and len(job["attempts"]) == 1
    run_orch("jobs", "cancel", "busy", check=0)
    assert live_instances() == []


def test_jobs_rm_asks_first_then_removes_the_row_and_its_files(orch_home):
    run_orch("run", "gone", "--cpu", "--wait", "--", "echo", "hi", check=0)
    folder = orch_home / "runs" / "gone"
    assert folder.is_dir()
    asked = run_orch("jobs", "rm", "gone", check=2)  # no terminal to ask on
    assert "add --yes" in asked.stderr and folder.is_dir() and jobs_named("gone")
    done = run_orch("jobs", "rm", "gone", "--yes", check=0)
    assert "job gone removed" in done.stdout
    assert not folder.exists() and jobs_named("gone") == []
    assert not (orch_home / "runs" / "gone-a1").is_symlink(), "no link left to the folder it removed"
    assert "no job named 'gone'" in run_orch("jobs", "rm", "gone", "--yes", check=2).stderr
    run_orch("run", "gone", "--cpu", "--wait", "--", "echo", "hi", check=0)  # the name is free again
    assert jobs_named("gone")[0]["state"] == "completed"


# -- issue 55, 8: Ctrl-C during `orch run --wait` -------------------------------------------------------
def interrupt_when(proc, marker: str) -> tuple[str, str]:
    """Ctrl-C to ``proc`` once its stderr shows ``marker``; (what it printed before, after)."""
    import signal

    seen = ""
    for line in proc.stderr:
        seen += line
        if marker in line:
            break
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    return seen, rest


def test_ctrl_c_before_the_command_started_cancels_the_job_and_rents_no_second_attempt(orch_home):
    from tests.clouds import local_billing, orch_proc
    from tests.test_watcher import WATCHED, ledger

    # A user's environment: the watcher on. It relaunched the interrupted attempt (a second rental).
    proc = orch_proc("run", "reflex", "--cpu", "--wait", "--", "sleep", "600", env=WATCHED)
    seen, rest = interrupt_when(proc, "renting on local")
    assert proc.returncode == 130, seen + rest
    assert "interrupted before job reflex's command started: cancelling it" in rest, seen + rest
    assert "job reflex: cancelled; nothing of it is left rented" in rest, seen + rest
    job = ledger().job("reflex")
    assert job.state == "cancelled", job.reason
    assert len(ledger().attempts(job.id)) == 1 and live_instances() == [] and local_billing(orch_home) == set()


def test_ctrl_c_after_the_command_started_detaches_and_says_so(orch_home):
    from tests.clouds import orch_proc

    proc = orch_proc("run", "goes-on", "--cpu", "--wait", "--", "sleep", "600")
    seen, rest = interrupt_when(proc, "attempt 1 running on local")
    assert proc.returncode == 130 and "its command has started, so the job goes on" in rest, seen + rest
    assert "orch jobs cancel goes-on" in rest
    [job] = jobs_named("goes-on")
    assert job["state"] == "running" and len(live_instances()) == 1
    run_orch("jobs", "cancel", "goes-on", check=0)
    assert live_instances() == []
