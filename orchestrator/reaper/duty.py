"""One pass of what orch does unattended, as ``orch reap`` (and so the scheduled reaper) runs it:
the fleet reaped (``reaper``), then every active job advanced (``jobs``), then every schedule's due
run started (``scheduling``: after the jobs, so a run that just ended no longer counts as running),
under the pass's lock."""

from __future__ import annotations

from datetime import datetime
from typing import Callable

from orchestrator.reaper import reaper
from orchestrator.text import clean


def one_pass(orch, dry_run: bool = False, force: bool = False, parallel: int | None = None,
             now: Callable[[], datetime] | None = None) -> tuple[list, list]:
    """One pass as ``orch reap`` runs it: (its outcomes, every job advanced and every scheduled run
    started or skipped at its end, under its lock; a real pass only: a dry run neither advances
    jobs nor imports them). ``now``: the schedules' clock (a test's own: the fleet and the jobs keep
    real time)."""
    # A schedule's run got the secrets stored for its schedule, which this process does not hold
    # (never the reaper's own): each run's text is hidden with its own schedule's values alone, as
    # its step is taken (``jobs.record.hiding``) and as it is pulled (``runs``), never with every
    # schedule's (another schedule's "0" would mask every digit of this run's log).
    advanced: list[dict] = []

    def advance_jobs() -> None:
        from orchestrator import jobs
        from orchestrator.schedules import scheduling

        advanced.extend(jobs.advance_all(orch))
        advanced.extend(scheduling.run_due(orch, now() if now else None))

    outcomes = reaper.reap(orch, dry_run=dry_run, force=force, parallel=parallel, after=advance_jobs)
    if advanced and not dry_run:
        outcomes = as_left(orch, outcomes)
    if advanced and not dry_run and not any("watched" in d for d in advanced):  # a run started said its own
        # A job left active (a scheduled run just started, one nobody watched) is watched from now
        # on, not at the next pass: with no reaper installed that pass may never come.
        from orchestrator.reaper import watcher

        line = watcher.ensure_active(orch)
        if line:
            orch.say(line)
    return outcomes, advanced


def as_left(orch, outcomes: list) -> list:
    """The pass's outcomes as its jobs' step left the fleet: the fleet is looked at before the jobs
    move, so a machine a job ended in this pass showed `ready keep`, and one a job made (a
    schedule's run just launched) was missing, the table saying `no live instances`."""
    from orchestrator import states

    live = {i.id: i for i in orch.ledger.instances(live_only=True)}
    for o in outcomes:
        if o.instance_id and o.instance_id not in live and o.state in states.LIVE:
            row = orch.ledger.get(o.instance_id)
            if row is not None and row.state not in states.LIVE:
                o.state, o.action, o.reason = row.state, "job", "its job ended it in this pass"
    seen = {o.instance_id for o in outcomes}
    outcomes += [reaper.Outcome(i.name, i.provider, i.state, "job", "made for a job in this pass",
                                instance_id=i.id) for i in live.values() if i.id not in seen]
    return outcomes


def show_pass(outcomes: list, advanced: list, dry_run: bool, as_json: bool) -> None:
    """A pass as ``orch reap`` prints it: the table (or JSON), then each job it advanced."""
    import json
    import sys

    if as_json:
        print(json.dumps([o.to_dict() for o in outcomes], indent=2, sort_keys=True, default=str))
        return
    sys.stdout.write(reaper.table(outcomes, dry_run))
    for j in advanced:
        print(f"job {j['name']}: {j['state']}" + (f" ({clean(j['reason'], 1000)})" if j["reason"] else ""), flush=True)
        if j.get("watched"):
            print(j["watched"], file=sys.stderr, flush=True)


def fast(dry_run: bool, as_json: bool) -> None:
    """``orch reap [--dry-run] [--json]`` (one pass, what a schedule runs) as ``cli.main`` answers it,
    without Typer (0.2 s of start-up, pydantic included): the pass opens the ledger lazily, and one
    that changes nothing never imports SQLAlchemy."""
    import sys

    from orchestrator.instances.lifecycle import Orch

    orch = Orch.open(actor=reaper.ACTOR, say=lambda msg: print(msg, file=sys.stderr, flush=True), lazy=True)
    show_pass(*one_pass(orch, dry_run=dry_run), dry_run, as_json)
