"""The reaper's rules, pure: what to do with one instance, from its row, its policy, its history
and what it is doing. No SSH, no SQL, a clock passed in: every rule is testable on its own.

- **idle**: the training finished, crashed or never started, no interactive SSH session and no
  busy GPU (the watchdog's own definition, ``watchdog.busy_reasons``), for ``idle_minutes``
  (counted from the run's end, the instance's ready time, or the last activity seen) -> stop or
  destroy (rule below);
- **max runtime**: ``max_hours`` after the instance first became ready -> likewise, busy or not;
- **unattended**: running at the provider though orch neither started nor prepared it -> idle
  from when orch first saw it so, then likewise;
- **broken**: its container exited or its host dropped -> destroy (after pulling what can be);
- **stopped too long**: stopped longer than its break-even, ``rebuild cost / stopped $/hr`` ->
  destroy, never while the weights were not pulled since the run ended (unless ``force``);
- **protected**: reported, never acted on.

Stop or destroy (``on_idle``): ``stop`` and ``destroy`` mean what they say (a provider that
cannot stop gets destroyed). ``auto`` stops when the provider can stop and the break-even is at
least an hour, else destroys. A stopped instance is then destroyed once stopped past its
break-even, so waiting never costs more than about twice the cheaper choice in hindsight (the
"rent or buy" rule): coming back within the break-even favours stopping, a longer gap destroying.
The break-even is the arithmetic of "Training on a rented GPU": a stopped disk bills ``GB × $/GB-month / 730`` per hour,
against what setting the machine up again costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from orchestrator.money import policy as policies
from orchestrator import states
from playbooks.on_instance.watchdog import busy_reasons

KEEP, STOP, DESTROY, REPORT = "keep", "stop", "destroy", "report"
MIN_STOP_WINDOW_H = 1.0  # auto: a break-even shorter than this is not worth keeping a disk for


def utc(dt: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive; every one orch stores is UTC."""
    if dt is None or dt.tzinfo is timezone.utc:  # the ledger's own: as it is (a pass over 10,000 asks 60,000 times)
        return dt
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def hm(dt: datetime | None) -> str:
    return utc(dt).strftime("%Y-%m-%d %H:%M:%SZ") if dt else "?"


@dataclass(frozen=True)
class Facts:
    """What the ledger knows about an instance's history."""

    first_ready_at: datetime | None = None
    ready_since: datetime | None = None
    stopped_since: datetime | None = None  # since it entered its current disk-only state
    state_since: datetime | None = None  # since it entered its current state, whatever it is
    rebuild_cost: float = 0.0
    rebuild_estimated: bool = True
    can_stop: bool = True
    weights_safe: bool = True


@dataclass(frozen=True)
class Observed:
    """What a ready instance is doing right now."""

    reachable: bool = True
    error: str | None = None
    run_state: str | None = None  # None: no run; else starting/running/stalled/completed/failed/crashed
    training_alive: bool = False
    run_ended_at: datetime | None = None
    sessions: int = 0
    gpu_util: float | None = None
    last_active_at: datetime | None = None  # the watchdog's (or this controller's) last sight of activity


@dataclass(frozen=True)
class Decision:
    action: str  # keep, stop, destroy or report
    reason: str
    saved_hr: float = 0.0
    kind: str = ""  # what kind of reason, so an unchanged decision is not logged every pass
    wake_in: float | None = None  # seconds until this decision would change by the clock alone


def break_even_hours(rebuild_cost: float, stopped_hr: float) -> float | None:
    """How long a stopped disk may bill before rebuilding would have been cheaper (None: never)."""
    if stopped_hr <= 0:
        return None
    return max(rebuild_cost, 0.0) / stopped_hr


def idle_action(pol: policies.Policy, can_stop: bool, break_even_h: float | None, provider: str,
                can_destroy: bool = True) -> tuple[str, str]:
    """Stop or destroy, and why (the rule in this module's docstring)."""
    if pol.on_idle == "destroy" and can_destroy:
        return DESTROY, "on_idle=destroy"
    if not can_stop:
        return DESTROY, f"stop is not supported by {provider}"
    if pol.on_idle == "stop" or not can_destroy:
        return STOP, "on_idle=stop" if pol.on_idle == "stop" else "stop (cannot destroy from here)"
    if break_even_h is None:
        return STOP, "auto: stopped, its disk bills nothing"
    if break_even_h < MIN_STOP_WINDOW_H:
        return DESTROY, (f"auto: break-even {break_even_h:.2f} h is under {MIN_STOP_WINDOW_H:g} h, "
                         "rebuilding beats keeping the disk")
    return STOP, f"auto: stopped; destroyed if still stopped after its {break_even_h:.1f} h break-even"


def saved(inst, action: str) -> float:
    """$/hr that ``action`` stops billing."""
    if action == STOP:
        return max(inst.price_hr - inst.stopped_price_hr, 0.0)
    if action == DESTROY:
        return inst.stopped_price_hr if inst.state in states.BILLING_DISK_ONLY else inst.price_hr
    return 0.0


def decide(inst, pol: policies.Policy, facts: Facts, obs: Observed, now: datetime,
           force: bool = False) -> Decision:
    """keep / stop / destroy / report for one instance, from its row, policy, history and activity."""
    now = utc(now)
    if inst.state == states.READY:
        d = _decide_ready(inst, pol, facts, obs, now)
    elif inst.state == states.UNATTENDED:
        d = _decide_unattended(inst, pol, facts, now)
    elif inst.state == states.BROKEN:
        d = Decision(DESTROY, f"broken since {hm(facts.state_since)}: its container exited or its host dropped, "
                              "and it will not run again by itself", saved(inst, DESTROY), "broken")
    elif inst.state in states.BILLING_DISK_ONLY:
        d = _decide_stopped(inst, facts, now, force)
    else:
        return Decision(KEEP, f"{inst.state}: left alone", kind=inst.state)
    if d.action in (STOP, DESTROY) and inst.protected:
        return Decision(REPORT, f"protected: would {d.action} ({d.reason})", d.saved_hr, "protected-" + d.kind)
    return d


def _deadline(pol, facts: Facts, now: datetime) -> float | None:
    """Seconds left until ``max_hours`` after the first ready; None without a deadline."""
    if not pol.max_hours or not facts.first_ready_at:
        return None
    return (utc(facts.first_ready_at) + timedelta(hours=pol.max_hours) - now).total_seconds()


def _decide_ready(inst, pol, facts: Facts, obs: Observed, now: datetime) -> Decision:
    be = break_even_hours(facts.rebuild_cost, inst.stopped_price_hr)
    to_deadline = _deadline(pol, facts, now)
    if to_deadline is not None and to_deadline <= 0:
        action, why = idle_action(pol, facts.can_stop, be, inst.provider)
        return Decision(action, f"max runtime {pol.max_hours:g} h reached (ready since "
                                f"{hm(facts.first_ready_at)}); {why}", saved(inst, action), "deadline")
    if not obs.reachable:
        return Decision(KEEP, f"unreachable over SSH ({obs.error}): idleness unknown", kind="unreachable",
                        wake_in=to_deadline)
    busy = busy_reasons(f"training {obs.run_state or 'running'}" if obs.training_alive else None, obs.sessions,
                        obs.gpu_util)
    if busy:
        return Decision(KEEP, "busy: " + ", ".join(busy), kind="busy", wake_in=to_deadline)
    since = max(t for t in (utc(facts.ready_since), utc(obs.run_ended_at), utc(obs.last_active_at),
                            utc(facts.first_ready_at), datetime.min.replace(tzinfo=timezone.utc)) if t)
    if obs.run_state in ("completed", "failed", "crashed"):
        what = f"training {obs.run_state} at {hm(obs.run_ended_at)}"
    else:
        what = "no training ran" if obs.run_state is None else f"training {obs.run_state}, not running"
    what += ", no interactive SSH session" + (", GPU idle" if obs.gpu_util is not None else "")
    return _idle(inst, pol, facts, be, since, now, what, to_deadline)


def _decide_unattended(inst, pol, facts: Facts, now: datetime) -> Decision:
    be = break_even_hours(facts.rebuild_cost, inst.stopped_price_hr)
    since = utc(facts.state_since) or now
    return _idle(inst, pol, facts, be, since, now, f"running at the provider since {hm(since)} though orch neither "
                                                  "started nor prepared it", _deadline(pol, facts, now))


def _idle(inst, pol, facts: Facts, be, since: datetime, now: datetime, what: str, to_deadline) -> Decision:
    idle_min = max((now - since).total_seconds(), 0.0) / 60
    digits = 2 if pol.idle_minutes < 1 else 1
    if idle_min < pol.idle_minutes:
        left = (pol.idle_minutes - idle_min) * 60
        return Decision(KEEP, f"idle {idle_min:.{digits}f} of {pol.idle_minutes:g} min ({what})", kind="waiting",
                        wake_in=min(left, to_deadline) if to_deadline is not None else left)
    action, why = idle_action(pol, facts.can_stop, be, inst.provider)
    return Decision(action, f"idle {idle_min:.{digits}f} min, limit {pol.idle_minutes:g} ({what}); {why}",
                    saved(inst, action), "idle")


def _decide_stopped(inst, facts: Facts, now: datetime, force: bool) -> Decision:
    be = break_even_hours(facts.rebuild_cost, inst.stopped_price_hr)
    if be is None:
        return Decision(KEEP, f"{inst.state}: its disk bills nothing, kept", kind="free")
    since = utc(facts.stopped_since) or now
    stopped_h = max((now - since).total_seconds(), 0.0) / 3600
    basis = (f"rebuild ${facts.rebuild_cost:.2f}{' (estimated)' if facts.rebuild_estimated else ''} / "
             f"${inst.stopped_price_hr:.4f}/hr stopped")
    if stopped_h < be:
        return Decision(KEEP, f"{inst.state} {stopped_h:.1f} h of its {be:.1f} h break-even ({basis})", kind="stopped",
                        wake_in=(be - stopped_h) * 3600)
    if not facts.weights_safe and not force:
        return Decision(REPORT, f"{inst.state} {stopped_h:.1f} h, past its {be:.1f} h break-even, but its weights "
                                f"were not pulled since the run ended: `orch start {inst.name}` and `orch pull "
                                f"{inst.name}` (or `orch reap --force` to lose them)",
                        inst.stopped_price_hr, "unpulled")
    return Decision(DESTROY, f"{inst.state} {stopped_h:.1f} h, past its {be:.1f} h break-even ({basis})",
                    inst.stopped_price_hr, "stopped-too-long")


def estimate_rebuild(inst, events, first_run=None) -> float:
    """Setting it up again: the time from the request to the first ready (provisioning) and on to
    the first training start (staging the data), at the running rate, as it went the first time."""
    if not events:
        return 0.0
    requested = utc(events[0].at)
    ready = next((utc(e.at) for e in events if e.to_state == states.READY), None)
    end = ready
    if ready and first_run is not None and utc(first_run.started_at) and utc(first_run.started_at) > ready:
        end = utc(first_run.started_at)
    if end is None:
        return 0.0
    return (end - requested).total_seconds() / 3600 * inst.price_hr


def weights_safe(run, stopped_since: datetime | None, now: datetime) -> bool:
    """The run was pulled after it ended (or, stopped mid-run, right before it stopped)."""
    if run is None or not run.run_dir:
        return True
    pulled = utc(run.pulled_at)
    if pulled is None:
        return False
    if run.ended_at:
        return pulled >= utc(run.ended_at)
    return pulled >= (utc(stopped_since) or now) - timedelta(minutes=10)


def facts(inst, events, first_run, latest_run, can_stop: bool, now: datetime) -> Facts:
    """Facts from the instance's events (transitions and notes) and its first and latest runs."""
    moves = [e for e in events if e.from_state != e.to_state]
    pol = policies.of(inst)
    first_ready = next((e.at for e in moves if e.to_state == states.READY), None)
    ready_since = next((e.at for e in reversed(moves) if e.to_state == states.READY), None)
    state_since = next((e.at for e in reversed(moves) if e.to_state == inst.state), None)
    stopped_since = state_since if inst.state in states.BILLING_DISK_ONLY else None
    estimated = pol.rebuild_cost is None
    cost = estimate_rebuild(inst, moves, first_run) if estimated else float(pol.rebuild_cost)
    return Facts(first_ready_at=utc(first_ready), ready_since=utc(ready_since), stopped_since=utc(stopped_since),
                 state_since=utc(state_since), rebuild_cost=cost, rebuild_estimated=estimated, can_stop=can_stop,
                 weights_safe=weights_safe(latest_run, stopped_since, utc(now)))
