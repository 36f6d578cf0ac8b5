"""The controller's reaper: no instance keeps billing after its job is done.

One pass (``orch reap``) lists every provider once, brings each live instance's ledger row in line
with what its provider shows (``sync``), looks at what a ready instance is doing (one SSH
connection: the watchdog's probe and the run's status), decides by the rules in ``rules``, and
acts: pull the weights, then stop or destroy. The watchdog on the instance applies the idle and
deadline rules by itself with the laptop closed (``watchdog``); this pass re-arms one that died
and learns what it did. Every decision that changes and every action is an event with actor
"reaper" (or "watchdog").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from orchestrator import parallel as par
from orchestrator.money import policy as policies
from orchestrator import states
from orchestrator.ledger import ledger_sql
from orchestrator.reaper import rules
from orchestrator.instances import watchdog
from orchestrator.ledger import ledger_snapshot
from orchestrator.errors import OrchError, SSHError
from orchestrator.provider import Status
from orchestrator.reaper.rules import DESTROY, KEEP, REPORT, STOP, Decision, Observed  # noqa: F401  (the reaper's words)
from orchestrator.instances.sync import sync
from orchestrator.text import clean
from orchestrator.text import why as _why

ACTOR = "reaper"
LAST_PASS = "reaper:last_pass"
# What the provider shows of an instance in each steady ledger state.
_SHOWN = {states.READY: Status.RUNNING, states.UNATTENDED: Status.RUNNING, states.STOPPED: Status.STOPPED,
          states.PREEMPTED: Status.STOPPED, states.SCHEDULING: Status.SCHEDULING, states.BROKEN: Status.BROKEN}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# -- looking at a ready instance ------------------------------------------------------------------
class _NoWrites:
    """Stands in for Orch where runs.digest would update the run row: a dry run writes nothing."""

    class ledger:  # noqa: N801 - mirrors Orch.ledger
        @staticmethod
        def update_run(run_id, **fields):
            return None


def look(orch, inst, run, writes: bool = True) -> tuple[Observed, dict]:
    """One SSH connection: the watchdog's probe (activity, its state file) and the run's status."""
    from orchestrator.runs import runs
    from playbooks import host
    from playbooks import runs as run_tasks

    with orch.connect(inst) as c:
        probe = host.script(c, "watchdog.py", "probe", host.workdir(c))
        raw = run_tasks.status(c, run.run_dir, run.pid) if run is not None and run.run_dir else None
    view = runs.digest(orch if writes else _NoWrites, run, raw) if raw is not None else None
    run_state = view["state"] if view else (run.state if run else None)
    ended = None
    if view and view["state"] in ("completed", "failed") and view.get("updated_at"):
        ended = runs.parse_time(view["updated_at"])
        ended = min(ended, utcnow()) if ended else None
    if view and view["state"] == "crashed" or (ended is None and run_state in ("completed", "failed")):
        fresh = orch.ledger.latest_run(inst.id) if writes else run
        ended = rules.utc(fresh.ended_at) if fresh and fresh.ended_at else utcnow()  # first seen dead
    state = probe.get("state") if isinstance(probe.get("state"), dict) else {}
    last = state.get("last_active_at")
    sessions, gpu = probe.get("sessions"), probe.get("gpu_util")
    obs = Observed(reachable=True, run_state=run_state,
                   training_alive=bool(probe.get("training")) or bool(view and view["state"] in ("running", "starting",
                                                                                                 "stalled")),
                   run_ended_at=ended, sessions=sessions if isinstance(sessions, int) else 0,
                   gpu_util=float(gpu) if isinstance(gpu, (int, float)) and not isinstance(gpu, bool) else None,
                   last_active_at=datetime.fromtimestamp(last, timezone.utc) if isinstance(last, (int, float)) and
                   0 < last < time.time() + 60 else None)
    return obs, probe


# -- acting ---------------------------------------------------------------------------------------
def pull(orch, inst, run, why: str) -> str:
    from orchestrator.runs import runs

    got, where = runs.pull(orch, inst, run)
    watchdog.mark_pulled(orch, inst)
    text = f"pulled {len(got)} new file(s) to {where} ({why})" if got else f"weights already home in {where} ({why})"
    orch.ledger.note(inst.id, text, orch.actor)
    return text


def act(orch, inst, run, d: Decision, force: bool = False) -> Decision:
    """Pull the weights, then stop or destroy. A pull that fails turns a destroy into a stop (the
    disk keeps them) or, where the provider cannot stop, into a report; ``force`` destroys anyway.
    A broken instance is destroyed whatever the pull gave: it will not run again."""
    if inst.state in (states.READY, states.BROKEN) and run is not None and run.run_dir:
        try:
            pull(orch, inst, run, f"before {'stopping' if d.action == STOP else 'destroying'}")
        except OrchError as e:
            problem = f"weights could not be pulled ({_why(e)})"
            if inst.state == states.BROKEN:
                d = replace(d, reason=f"{d.reason}; {problem}: what was pulled before is in {orch.home / 'runs'}")
            elif d.action == DESTROY and not force:
                if not watchdog.history(orch, inst).can_stop:
                    orch.ledger.note(inst.id, f"not destroyed: {problem}; {d.reason}", orch.actor)
                    return Decision(REPORT, f"not destroyed: {problem}; {d.reason}", d.saved_hr, "unpulled")
                d = Decision(STOP, f"{d.reason}; {problem}: stopping instead, the disk keeps them",
                             rules.saved(inst, STOP), d.kind)
            else:
                d = replace(d, reason=f"{d.reason}; {problem}" + ("" if d.action == DESTROY else ", the disk keeps them"))
    if d.action == STOP:
        orch.stop(inst, reason=d.reason)
    else:
        orch.down(inst, reason=d.reason)
    return d


# -- one pass -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    name: str
    provider: str
    state: str
    action: str  # keep, stop, destroy, report, skip, gone, error; job (``duty``: what its jobs did in the pass)
    reason: str
    saved_hr: float = 0.0
    acted: bool = False
    instance_id: str = ""
    wake_in: float | None = None  # --watch wakes then rather than a whole interval later

    def to_dict(self) -> dict:
        return dict(vars(self))  # every field a plain value: asdict's deep copy cost 0.2 ms an outcome


class _PassLock:
    """One pass at a time per ORCH_HOME (a scheduled pass and a manual one would pull twice)."""

    def __init__(self, home: Path):
        self.path = Path(home) / "reaper.lock"

    def __enter__(self):
        import fcntl

        self.f = open(self.path, "w")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.f.close()
            raise OrchError("another `orch reap` pass is running on this ledger") from None
        return self

    def __exit__(self, *exc):
        self.f.close()


def reap(orch, dry_run: bool = False, force: bool = False, now: Callable[[], datetime] | None = None,
         after: Callable[[], None] | None = None, parallel: int | None = None) -> list[Outcome]:
    """One pass over every live instance of every provider (one listing per provider). ``after``
    runs at the end of the pass, under its lock (the jobs it advances, say). ``parallel``: how many
    instances are looked at over SSH (and asked for by id) at once (``parallel.bound``)."""
    import json

    clock = now or utcnow
    bound = par.bound(parallel)
    started = time.monotonic()
    outcomes: list[Outcome] = []
    listings: dict[str, dict] = {}  # provider -> {provider id: Remote}, as reconcile listed it for this pass
    with _PassLock(orch.home):
        if not dry_run:
            outcomes += _reconcile(orch, listings)  # first: what failed creates left, rows a failure left half-way
        fleet = ledger_snapshot.read(orch.ledger, live_only=True)  # rows, events and runs: one query per table
        live = fleet.instances
        for provider_name in sorted({i.provider for i in live}):
            group = [i for i in live if i.provider == provider_name]
            try:
                listing = listings.get(provider_name)
                if listing is None:  # reconcile did not list it (a dry run; a provider reconcile could not ask)
                    with ledger_snapshot.quiet_gc():
                        listing = {r.provider_id: r for r in orch.provider(provider_name).list()}
            except Exception as e:  # noqa: BLE001 - a failed listing is never read as "nothing there"
                outcomes += [Outcome(i.name, i.provider, i.state, "skip",
                                     f"{provider_name} listing failed ({_why(e)}): left alone", instance_id=i.id)
                             for i in group]
                continue
            with ledger_snapshot.quiet_gc():  # thousands of rows, decisions and outcomes, no cycle among them
                outcomes += _group(orch, group, listing, fleet, dry_run, force, clock, bound)
        outcomes += _volumes(orch, clock(), dry_run)
        if after is not None and not dry_run:
            after()
        if not dry_run:
            summary = {"at": utcnow().isoformat(), "seconds": round(time.monotonic() - started, 2),
                       "outcomes": [o.to_dict() for o in outcomes]}
            orch.ledger.set_meta(LAST_PASS, json.dumps(summary))
    ledger_snapshot.release_gc()  # the pass's rows go back to the collector (see ``ledger_snapshot.quiet_gc``)
    return outcomes


def _volumes(orch, now: datetime, dry_run: bool) -> list[Outcome]:
    """Each volume unattached past ``volume_idle_days``: reported (``volumes.idle``), never deleted."""
    from orchestrator.volumes import volumes

    try:
        found = volumes.idle(orch, now, dry_run)
    except Exception as e:  # noqa: BLE001 - the pass goes on: its instances were the urgent part
        orch.say(f"volumes not looked at: {_why(e)}")
        return []
    return [Outcome(v["name"], v["provider"], v["state"], v["action"], v["reason"]) for v in found]


def _reconcile(orch, listings: dict) -> list[Outcome]:
    """``orch reconcile`` at the start of every pass: an instance that a create made and then
    failed to report (its lookup missed: listings lag a launch) is adopted, a row a failure left
    ``requested`` or ``destroying`` is settled, without anyone typing ``orch reconcile``. Its
    events say what it did (actor "reconcile"); a provider it cannot ask is left to this pass.
    Returns the pass's outcomes for the rows it ended (what it adopted, the pass looks at next)."""
    from orchestrator.instances import reconcile

    try:
        with ledger_snapshot.quiet_gc():  # its listing is the pass's: thousands of remotes, no cycle among them
            report = reconcile.reconcile(orch, unsettled_only=True, listings=listings)  # the pass syncs the rest
    except Exception as e:  # noqa: BLE001 - the pass goes on: reconcile's trouble is no reason to stop reaping
        orch.say(f"reconcile failed: {_why(e)}")
        return []
    ended = []
    for iid in (iid for p in report.providers for iid in p.ended):
        now = orch.ledger.get(iid)
        ended.append(Outcome(now.name, now.provider, now.state, "gone", orch.ledger.events(now.id)[-1].reason,
                             instance_id=now.id))
    for p in report.providers:
        for name in p.adopted:
            orch.say(f"{name}: adopted from {p.provider} (it carries orch's tag; the ledger did not hold it)")
        for trouble in ([p.error] if p.error else []) + p.problems:
            orch.say(f"reconcile: {p.provider}: {trouble}")
    return ended


# Ledger states in which a pass may reach the instance over SSH (a look, a pull before acting):
# those are looked at side by side; every other instance is decided in line, in microseconds.
_OVER_SSH = frozenset({states.READY, states.BROKEN})


def _group(orch, group: list, listing: dict, fleet, dry_run: bool, force: bool, clock, bound: int) -> list[Outcome]:
    """One provider's instances: those missing from its listing asked for by id (a listing can
    lag), then each decided; at most ``bound`` provider asks or SSH looks at once."""
    provider = orch.provider(group[0].provider)
    missing = [i for i in group if i.provider_id is not None and i.provider_id not in listing]
    asks = 1 if provider.embedded else bound  # an embedded provider answers from this disk: threads only add switching
    for inst, (remote, error) in zip(missing, par.each(lambda i: provider.get(i.provider_id), missing, asks)):
        listing[inst.provider_id] = error if error is not None else remote

    def one(inst) -> Outcome:
        return _one(orch, inst, listing, dry_run, force, clock, fleet)

    results: list = [None] * len(group)
    slow = [k for k, inst in enumerate(group) if inst.state in _OVER_SSH]
    for k, (outcome, error) in zip(slow, par.each(lambda k: one(group[k]), slow, bound)):
        results[k] = outcome if error is None else _failed(group[k], error)
    for k, inst in enumerate(group):
        if results[k] is None:
            try:
                results[k] = one(inst)
            except Exception as e:  # noqa: BLE001 - one instance's trouble must not stop the pass
                results[k] = _failed(inst, e)
    return results


def _failed(inst, e: Exception) -> Outcome:
    return Outcome(inst.name, inst.provider, inst.state, "error", _why(e), instance_id=inst.id)


def _one(orch, inst, listing: dict, dry_run: bool, force: bool, clock, fleet=None) -> Outcome:
    def outcome(action, reason, saved=0.0, acted=False, state=None, wake_in=None):
        return Outcome(inst.name, inst.provider, state or inst.state, action, reason, saved, acted, inst.id, wake_in)

    if inst.state in states.IN_PROGRESS and inst.provider_id is not None and _claimed(orch, inst):
        return outcome("skip", f"{inst.state}: another orch command is moving it")
    if inst.provider_id is None:
        return outcome("skip", f"{inst.state}: not created yet (`orch reconcile` settles it)")
    remote = listing.get(inst.provider_id)
    if remote is None:
        remote = orch.provider(inst.provider).get(inst.provider_id)  # asked by id: a listing can lag
    elif isinstance(remote, Exception):
        raise remote  # the ask by id failed (``_group``)
    if dry_run:
        if inst.state in states.IN_PROGRESS:
            return outcome(REPORT, f"{inst.state}, and no orch command is moving it: a real pass settles it")
        if remote.status != _SHOWN.get(inst.state):
            return outcome(REPORT, f"the provider shows it {remote.status.value}: a real pass records that first")
    else:
        before = inst.state
        inst = sync(orch, inst, remote)
        if inst.state not in states.LIVE:
            return outcome("gone", orch.ledger.events(inst.id)[-1].reason, state=inst.state)
        if inst.state != before:
            orch.say(f"{inst.name}: {before} -> {inst.state} (as its provider shows it)")
            fleet = None  # its history has grown: the rules read it from the ledger
        if inst.state in states.IN_PROGRESS:
            return outcome(KEEP, f"{inst.state}: settling (an interrupted orch left it so)")
    run = fleet.latest_run(inst.id) if fleet is not None else orch.ledger.latest_run(inst.id)
    obs = Observed()
    if inst.state == states.READY:
        obs, run = _look_ready(orch, inst, run, dry_run)
    now = clock()
    d = rules.decide(inst, policies.of(inst), watchdog.history(orch, inst, run, fleet), obs, now, force)
    if d.action in (STOP, DESTROY) and d.kind == "idle":
        d = _group_busy(orch, inst, d)
    if d.kind == "busy" and not dry_run:  # the last sign of activity this controller saw
        orch.ledger.remember(inst.id, busy_seen_at=rules.utc(now).isoformat())
    if dry_run or d.action not in (STOP, DESTROY):
        if not dry_run:
            _note_if_changed(orch, inst, d)
        return outcome(d.action, d.reason, d.saved_hr, wake_in=d.wake_in)
    d = act(orch, inst, run, d, force)
    inst = orch.ledger.get(inst.id)
    _note_if_changed(orch, inst, d, acted=d.action in (STOP, DESTROY))
    return outcome(d.action, d.reason, d.saved_hr, acted=d.action in (STOP, DESTROY), state=inst.state)


def _group_busy(orch, inst, d: Decision) -> Decision:
    """A node is idle only when its whole group is: while another node trains (or has a session),
    none is stopped or destroyed alone (``groups.busy``)."""
    from orchestrator.instances import groups
    from playbooks.on_instance.watchdog import busy_reasons

    def is_busy(node) -> bool:
        if node.state != states.READY:
            return False
        try:
            obs, _ = look(orch, node, orch.ledger.latest_run(node.id), writes=False)
        except SSHError:
            return False
        except OrchError:
            # The same pass may be stopping this node right now (its row went to STOPPING before the
            # provider's stop): a look at a host going down fails in many ways, not only as SSH.
            # A node no longer ready is not busy; one still ready that cannot be read is an error.
            now = orch.ledger.get(node.id)
            if now is None or now.state != states.READY:
                return False
            raise
        return bool(busy_reasons("training" if obs.training_alive else None, obs.sessions, obs.gpu_util))

    if not groups.busy(orch, inst, is_busy):
        return d
    return Decision(KEEP, f"{d.reason}; but another node of group {inst.group_name} is busy: a group is ended as one",
                    kind="group-busy")


def _claimed(orch, inst) -> bool:
    from orchestrator.ledger import claims

    return claims.busy(orch.ledger, inst.name)


def _look_ready(orch, inst, run, dry_run: bool):
    try:
        obs, probe = look(orch, inst, run, writes=not dry_run)
    except SSHError as e:
        return Observed(reachable=False, error=_why(e)), run
    seen_busy = ledger_sql.memory(inst).get("busy_seen_at")  # the row read at the pass's start: no query
    if isinstance(seen_busy, str):
        try:
            obs = replace(obs, last_active_at=max(t for t in (obs.last_active_at,
                                                              datetime.fromisoformat(seen_busy)) if t))
        except ValueError:
            pass
    if dry_run:
        return obs, run
    watchdog.learn(orch, inst, probe.get("state"))
    run = orch.ledger.latest_run(inst.id)
    # A finished run is brought home at once, so a later stop or destroy (the watchdog's too) is safe.
    if run is not None and run.run_dir and obs.run_state in ("completed", "failed", "crashed") and \
            not rules.weights_safe(run, None, utcnow()):
        try:
            pull(orch, inst, run, f"training {obs.run_state}")
            run = orch.ledger.latest_run(inst.id)
        except OrchError as e:
            orch.ledger.note(inst.id, f"could not pull the finished run: {_why(e)}", orch.actor)
    if not probe.get("alive") and watchdog.enabled():
        if watchdog.arm(orch, inst):
            orch.ledger.note(inst.id, "watchdog re-armed: it was not running", orch.actor)
    return obs, run


def _note_if_changed(orch, inst, d: Decision, acted: bool = False) -> None:
    """A decision is an event when it differs from the last one (not every pass's 'still idle')."""
    now_key = f"{d.action}:{d.kind}"
    if ledger_sql.memory(inst).get("decision") == now_key:  # the row as the pass read it: no query
        return
    orch.ledger.remember(inst.id, decision=now_key)
    if not acted:  # an action is already an event: the transition carries its reason
        orch.ledger.note(inst.id, f"{d.action}: {clean(d.reason, 500)}", orch.actor)


def table(outcomes: list[Outcome], dry_run: bool) -> str:
    """What ``orch reap`` prints: plain columns (``text.columns``; a pass may report on thousands
    of instances, and Rich's table took seconds for them), then what acting saves."""
    from orchestrator.text import columns

    if not outcomes:
        return "no live instances\n"
    rows = []
    for o in outcomes:
        saved = f"{o.saved_hr:.4f}" if o.saved_hr else "-"
        if o.saved_hr and not o.acted:
            saved += " (would)"
        rows.append((o.name, o.provider, o.state, o.action, saved, clean(o.reason, 1000) or ""))
    text = columns(("NAME", "PROVIDER", "STATE", "DECISION", "$/HR SAVED", "REASON"), rows)
    total = sum(o.saved_hr for o in outcomes if o.acted)
    would = sum(o.saved_hr for o in outcomes if not o.acted and o.action in ("stop", "destroy"))
    if dry_run:
        text += f"dry run: nothing changed; acting would save ${would:.4f}/hr\n"
    elif total:
        text += f"saved ${total:.4f}/hr\n"
    return text


def last_pass(ledger) -> dict | None:
    return ledger.get_json_meta(LAST_PASS)


__all__ = ["Outcome", "act", "look", "reap", "table", "last_pass", "ACTOR"]
