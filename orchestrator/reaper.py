"""The controller's reaper: no instance keeps billing after its job is done.

One pass (``orch reap``) lists every provider once, brings each live instance's ledger row in
line with what its provider shows, looks at what the instance is doing, decides, and acts:

- **idle**: the training finished, crashed or never started, no interactive SSH session and no
  busy GPU, for ``idle_minutes`` (counted from the run's end, the instance's ready time, or the
  last activity its watchdog saw) -> pull the weights, then stop or destroy (rule below);
- **max runtime**: ``max_hours`` after the instance first became ready -> likewise, training or not;
- **stopped too long**: stopped longer than its break-even, ``rebuild cost / stopped $/hr`` ->
  destroy, never while the weights were not pulled since the run ended (unless ``force``);
- **protected**: reported, never acted on.

Stop or destroy (``on_idle``): ``stop`` and ``destroy`` mean what they say (a provider that
cannot stop gets destroyed). ``auto`` stops when the provider can stop and the break-even is at
least an hour, else destroys. A stopped instance is then destroyed once stopped past its
break-even, so waiting never costs more than about twice the cheaper choice in hindsight (the
"rent or buy" rule): coming back within the break-even favours stopping, a longer gap destroying.

The watchdog on the instance (``playbooks/watchdog.py``) applies the idle and deadline rules by
itself with the laptop closed; this module arms it and learns what it did. Every decision that
changes and every action is an event with actor "reaper" (or "watchdog").
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from orchestrator import policy as policies
from orchestrator import states
from orchestrator.errors import HostKeyMismatch, OrchError, SSHError

ACTOR, WATCHDOG = "reaper", "watchdog"
KEEP, STOP, DESTROY, REPORT = "keep", "stop", "destroy", "report"
MIN_STOP_WINDOW_H = 1.0  # auto: a break-even shorter than this is not worth keeping a disk for
WATCHDOG_INTERVAL_S = 5.0
# States another orch process is moving the instance through: reconcile's business, not ours.
IN_PROGRESS = frozenset({states.REQUESTED, states.PROVISIONING, states.STARTING, states.STOPPING,
                         states.DESTROYING})
WATCHDOG_SOURCE = Path(__file__).resolve().parent.parent / "playbooks" / "watchdog.py"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def utc(dt: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive; every one orch stores is UTC."""
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _epoch(dt: datetime | None) -> float | None:
    return utc(dt).timestamp() if dt else None


def _from_epoch(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, timezone.utc) if t else None


def _hm(dt: datetime | None) -> str:
    return utc(dt).strftime("%Y-%m-%d %H:%M:%SZ") if dt else "?"


def watchdog_enabled() -> bool:
    """ORCH_WATCHDOG=off leaves the controller's reaper alone on duty (benchmarks, debugging)."""
    return os.environ.get("ORCH_WATCHDOG", "on").lower() not in ("0", "off", "no", "false")


# -- the pure part ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Facts:
    """What the ledger knows about an instance's history."""

    first_ready_at: datetime | None = None
    ready_since: datetime | None = None
    stopped_since: datetime | None = None
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
    last_active_at: datetime | None = None  # the watchdog's memory of the last activity


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


def _saved(inst, action: str) -> float:
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
    elif inst.state in states.BILLING_DISK_ONLY:
        d = _decide_stopped(inst, facts, now, force)
    else:
        return Decision(KEEP, f"{inst.state}: left alone", kind=inst.state)
    if d.action in (STOP, DESTROY) and inst.protected:
        return Decision(REPORT, f"protected: would {d.action} ({d.reason})", d.saved_hr, "protected-" + d.kind)
    return d


def _decide_ready(inst, pol, facts: Facts, obs: Observed, now: datetime) -> Decision:
    be = break_even_hours(facts.rebuild_cost, inst.stopped_price_hr)
    to_deadline = None
    if pol.max_hours and facts.first_ready_at:
        to_deadline = (utc(facts.first_ready_at) + timedelta(hours=pol.max_hours) - now).total_seconds()
    if to_deadline is not None and to_deadline <= 0:
        action, why = idle_action(pol, facts.can_stop, be, inst.provider)
        return Decision(action, f"max runtime {pol.max_hours:g} h reached (ready since "
                                f"{_hm(facts.first_ready_at)}); {why}", _saved(inst, action), "deadline")
    if not obs.reachable:
        return Decision(KEEP, f"unreachable over SSH ({obs.error}): idleness unknown", kind="unreachable",
                        wake_in=to_deadline)
    busy = []
    if obs.training_alive:
        busy.append(f"training {obs.run_state or 'running'}")
    if obs.sessions:
        busy.append(f"{obs.sessions} interactive SSH session(s)")
    if obs.gpu_util is not None and obs.gpu_util >= 10:
        busy.append(f"GPU {obs.gpu_util:.0f}% busy")
    if busy:
        return Decision(KEEP, "busy: " + ", ".join(busy), kind="busy", wake_in=to_deadline)
    since = max(t for t in (utc(facts.ready_since), utc(obs.run_ended_at), utc(obs.last_active_at),
                            utc(facts.first_ready_at), datetime.min.replace(tzinfo=timezone.utc)) if t)
    idle_min = max((now - since).total_seconds(), 0.0) / 60
    digits = 2 if pol.idle_minutes < 1 else 1
    if obs.run_state in ("completed", "failed", "crashed"):
        what = f"training {obs.run_state} at {_hm(obs.run_ended_at)}"
    else:
        what = "no training ran" if obs.run_state is None else f"training {obs.run_state}, not running"
    what += ", no interactive SSH session" + (", GPU idle" if obs.gpu_util is not None else "")
    if idle_min < pol.idle_minutes:
        left = (pol.idle_minutes - idle_min) * 60
        return Decision(KEEP, f"idle {idle_min:.{digits}f} of {pol.idle_minutes:g} min ({what})", kind="waiting",
                        wake_in=min(left, to_deadline) if to_deadline is not None else left)
    action, why = idle_action(pol, facts.can_stop, be, inst.provider)
    return Decision(action, f"idle {idle_min:.{digits}f} min, limit {pol.idle_minutes:g} ({what}); {why}",
                    _saved(inst, action), "idle")


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


# -- what the ledger knows ------------------------------------------------------------------------
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


def facts(orch, inst, run=None, now: datetime | None = None) -> Facts:
    events = [e for e in orch.ledger.events(inst.id) if e.from_state != e.to_state]  # transitions, not notes
    pol = policies.of(inst)
    first_ready = next((e.at for e in events if e.to_state == states.READY), None)
    ready_since = next((e.at for e in reversed(events) if e.to_state == states.READY), None)
    stopped_since = None
    if inst.state in states.BILLING_DISK_ONLY:
        stopped_since = next((e.at for e in reversed(events) if e.to_state == inst.state), None)
    first_run = min((r for r in orch.ledger.runs() if r.instance_id == inst.id), key=lambda r: r.id, default=None)
    estimated = pol.rebuild_cost is None
    cost = estimate_rebuild(inst, events, first_run) if estimated else float(pol.rebuild_cost)
    try:
        can_stop = orch.provider(inst.provider).capabilities.stop
    except OrchError:
        can_stop = False
    return Facts(first_ready_at=utc(first_ready), ready_since=utc(ready_since), stopped_since=utc(stopped_since),
                 rebuild_cost=cost, rebuild_estimated=estimated, can_stop=can_stop,
                 weights_safe=weights_safe(run, stopped_since, utc(now) or utcnow()))


# -- looking at a ready instance ------------------------------------------------------------------
class _NoWrites:
    """Stands in for Orch where training.digest would update the run row: a dry run writes nothing."""

    class ledger:  # noqa: N801 - mirrors Orch.ledger
        @staticmethod
        def update_run(run_id, **fields):
            return None


def _upload_watchdog(c, work: str) -> str:
    from orchestrator import remote

    return remote.put_text(c, WATCHDOG_SOURCE.read_text(), f"{work}/bin/watchdog.py", 0o644)


def _python(c) -> str:
    """The instance's Python: the one provisioning chose, else any python3 (the watchdog needs no more)."""
    from orchestrator import remote

    out = remote.run(c, 'cat "$HOME/.orch/python" 2>/dev/null || command -v python3 || command -v python',
                     check=False).strip()
    if not out:
        raise SSHError("no Python on the instance")
    return out.splitlines()[-1]


def _json_line(out: str, marker: str) -> dict:
    for line in reversed(out.splitlines()):
        if line.startswith(marker):
            return json.loads(line[len(marker):])
    raise SSHError(f"the instance printed no {marker.strip()} line: {out.strip()[-200:]}")


def look(orch, inst, run, writes: bool = True) -> tuple[Observed, dict]:
    """One SSH connection: the watchdog's probe (activity, its state file) and the run's status."""
    from orchestrator import remote, training
    from playbooks import train

    with orch.connect(inst) as c:
        work = train.workdir(c)
        script = _upload_watchdog(c, work)
        probe = _json_line(remote.run(c, f"{shlex.quote(_python(c))} {script} probe {shlex.quote(work)}"),
                           "ORCH_WATCHDOG ")
        raw = train.status(c, run.run_dir, run.pid) if run is not None and run.run_dir else None
    view = training.digest(orch if writes else _NoWrites, run, raw) if raw is not None else None
    run_state = view["state"] if view else (run.state if run else None)
    ended = None
    if view and view["state"] in ("completed", "failed") and view.get("updated_at"):
        try:
            ended = utc(datetime.fromisoformat(str(view["updated_at"]).replace("Z", "+00:00")))
        except ValueError:
            ended = None
    if view and view["state"] == "crashed" or (ended is None and run_state in ("completed", "failed")):
        fresh = orch.ledger.latest_run(inst.id) if writes else run
        ended = utc(fresh.ended_at) if fresh and fresh.ended_at else utcnow()  # first seen dead
    state = probe.get("state") or {}
    obs = Observed(reachable=True, run_state=run_state,
                   training_alive=bool(probe["training"]) or bool(view and view["state"] in ("running", "starting",
                                                                                           "stalled")),
                   run_ended_at=ended, sessions=int(probe["sessions"]), gpu_util=probe.get("gpu_util"),
                   last_active_at=_from_epoch(state.get("last_active_at")))
    return obs, probe


# -- the watchdog ---------------------------------------------------------------------------------
def self_stop_commands(provider, inst) -> dict[str, str]:
    """The shell commands with which the instance stops / destroys itself (keys from its environment)."""
    from providers.local import LocalProvider

    caps = provider.capabilities
    if isinstance(provider, LocalProvider):
        # A local instance is a folder on this machine: it stops itself the way the provider does.
        def local(verb: str) -> str:
            code = ("from pathlib import Path\nfrom providers.local import LocalProvider\n"
                    f"LocalProvider(None, Path({str(provider.home)!r})).{verb}({inst.provider_id!r})\n")
            return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"

        return {"stop": local("stop"), "destroy": local("destroy")}
    commands = {}
    for verb, can in (("stop", caps.self_stop), ("destroy", caps.self_destroy)):
        command = provider.self_stop_command(destroy=verb == "destroy") if can else None
        if command:
            commands[verb] = command
    return commands


def watchdog_config(orch, inst, work: str, commands: dict[str, str]) -> dict[str, Any]:
    pol = policies.of(inst)
    f = facts(orch, inst, orch.ledger.latest_run(inst.id))
    be = break_even_hours(f.rebuild_cost, inst.stopped_price_hr)
    action, why = idle_action(pol, "stop" in commands, be, inst.provider, can_destroy="destroy" in commands)
    return {"name": inst.name, "instance": inst.id, "work": work, "interval": WATCHDOG_INTERVAL_S,
            "idle_minutes": pol.idle_minutes, "max_hours": pol.max_hours,
            "first_ready_at": _epoch(f.first_ready_at) or time.time(), "idle_action": action,
            "deadline_action": action, "why": why, "protected": bool(inst.protected),
            "gpu": not inst.cpu_only, "commands": commands}


def arm(orch, inst) -> bool:
    """Start the watchdog on a ready instance, or hand a running one its new config (it re-reads
    it every check). Never raises: an instance without a watchdog still has the controller's reaper."""
    if not watchdog_enabled():
        return False
    from orchestrator import remote
    from playbooks import train

    try:
        commands = self_stop_commands(orch.provider(inst.provider), inst)
        with orch.connect(inst) as c:
            work = train.workdir(c)
            script = _upload_watchdog(c, work)
            cfg = watchdog_config(orch, inst, work, commands)
            path = remote.put_text(c, json.dumps(cfg, indent=1), f"{work}/watchdog-config.json", 0o600)
            q = shlex.quote
            remote.run(c, f"cd {q(work)} && setsid nohup {q(_python(c))} {script} run {q(path)} "
                          f">> {q(work + '/watchdog.log')} 2>&1 < /dev/null &")
    except Exception as e:  # noqa: BLE001 - reported; up must not fail for want of a watchdog
        why = _why(e)
        orch.say(f"      watchdog not started on {inst.name} ({why}); `orch reap` still applies its policy")
        orch.ledger.note(inst.id, f"watchdog not started: {why}", orch.actor)
        return False
    summary = {"armed_at": utcnow().isoformat(), "idle_action": cfg["idle_action"], "idle_minutes": cfg["idle_minutes"],
               "max_hours": cfg["max_hours"], "commands": sorted(commands), "protected": cfg["protected"]}
    orch.ledger.set_meta(f"watchdog:{inst.id}", json.dumps(summary))
    deadline = f" or past {cfg['max_hours']:g} h" if cfg["max_hours"] else ""
    orch.say(f"      watchdog: idle {cfg['idle_minutes']:g} min{deadline} -> {cfg['idle_action']}"
             + (" (protected: report only)" if cfg["protected"] else ""))
    if not commands:
        orch.ledger.note(inst.id, f"watchdog armed, report only: {inst.provider} gives no self-stop", orch.actor)
    return True


def _armed(orch, inst) -> dict | None:
    return orch.ledger.get_json_meta(f"watchdog:{inst.id}")


def _armed_now(orch, inst) -> dict | None:
    """The watchdog record, if it was armed during the instance's current ready period."""
    armed = _armed(orch, inst)
    if not armed:
        return None
    ready_since = facts(orch, inst).ready_since
    at = utc(datetime.fromisoformat(armed["armed_at"]))
    return armed if ready_since is None or at >= ready_since - timedelta(seconds=5) else None


def settle(orch, inst, remote):
    """Orch.sync, knowing that a ready instance which stopped or vanished by itself was most
    likely stopped by its own watchdog; the watchdog's state file tells for sure once it is back."""
    armed = _armed_now(orch, inst) if inst.state == states.READY else None
    if armed:
        gone = remote is None or remote.status == "gone"
        rule = f"idle {armed['idle_minutes']:g} min" + (f" or max {armed['max_hours']:g} h" if armed["max_hours"] else "")
        if remote is not None and remote.status == "stopped" and not inst.spot and "stop" in armed["commands"]:
            return orch.ledger.transition(inst.id, states.STOPPED, actor=WATCHDOG, expect=states.READY,
                                          reason=f"stopped from inside while its watchdog was armed ({rule} -> "
                                                 f"{armed['idle_action']}); its state file says why once it is back")
        if gone and "destroy" in armed["commands"] and armed["idle_action"] == DESTROY:
            orch.ledger.transition(inst.id, states.DESTROYING, actor=WATCHDOG, expect=states.READY,
                                   reason=f"gone at the provider: its watchdog destroys it ({rule})")
            return orch.ledger.transition(inst.id, states.DESTROYED, actor=WATCHDOG,
                                          reason="confirmed gone at the provider")
    return orch.sync(inst, remote)


def learn(orch, inst, state: dict | None) -> None:
    """Record in the ledger what the watchdog did (once per action): the next read after it acted."""
    if not state or not state.get("action"):
        return
    action = state["action"]
    at = float(action.get("at") or 0)
    since = _epoch(facts(orch, inst).ready_since) or 0
    if action.get("rc") is None and not action.get("error") and at >= since and time.time() - at < 60:
        return  # still in flight in this ready period: its outcome comes with the next look
    key, seen = f"watchdog-seen:{inst.id}", f"{action.get('at')}:{action.get('rc')}:{bool(action.get('error'))}"
    if orch.ledger.get_meta(key) == seen:
        return
    when = _hm(_from_epoch(action.get("at")))
    if action.get("error"):
        text = f"watchdog tried to {action['what']} it at {when} ({action['reason']}) and failed: {action['error']}"
    elif inst.state == states.READY and action.get("rc") is None:
        text = f"watchdog had run its self-{action['what']} at {when}: {action['reason']}"
    else:
        text = f"watchdog ran its self-{action['what']} at {when} (exit {action.get('rc')}): {action['reason']}"
    orch.ledger.note(inst.id, text, WATCHDOG)
    orch.ledger.set_meta(key, seen)


def read_state(orch, inst) -> dict | None:
    from playbooks import train

    with orch.connect(inst) as c:
        work = train.workdir(c)
        try:
            with c.sftp().open(f"{work}/watchdog.json") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None


def rearm(orch, inst) -> bool:
    """After a start: learn what the last watchdog did (its state file survives the stop), then
    start a fresh one, which begins a new state file."""
    try:
        learn(orch, inst, read_state(orch, inst))
    except HostKeyMismatch:
        raise
    except OrchError:
        pass
    return arm(orch, inst)


def observe(orch, inst):
    """``Orch.refresh`` for ``orch status NAME``, plus what the watchdog did since the last look."""
    if inst.provider_id is None or inst.state not in states.LIVE:
        return inst
    inst = settle(orch, inst, orch.provider(inst.provider).get(inst.provider_id))
    if inst.state == states.READY:
        try:
            learn(orch, inst, read_state(orch, inst))
        except HostKeyMismatch:
            raise  # possible interception: a refusal, never something to pass over
        except OrchError:
            pass  # unreachable: the caller reports that when it reads the run
    return inst


# -- acting ---------------------------------------------------------------------------------------
def mark_pulled(orch, inst) -> None:
    """Tell the watchdog the weights are home (it destroys only after that)."""
    from orchestrator import remote
    from playbooks import train

    with orch.connect(inst) as c:
        remote.put_text(c, json.dumps({"pulled_at": utcnow().isoformat()}), f"{train.workdir(c)}/pulled.json")


def pull(orch, inst, run, why: str) -> str:
    from orchestrator import training

    got, where = training.pull(orch, inst, run)
    mark_pulled(orch, inst)
    text = f"pulled {len(got)} new file(s) to {where} ({why})" if got else f"weights already home in {where} ({why})"
    orch.ledger.note(inst.id, text, orch.actor)
    return text


def act(orch, inst, run, d: Decision, force: bool = False) -> Decision:
    """Pull the weights, then stop or destroy. A pull that fails turns a destroy into a stop (the
    disk keeps them) or, where the provider cannot stop, into a report; ``force`` destroys anyway."""
    if inst.state == states.READY and run is not None and run.run_dir:
        try:
            pull(orch, inst, run, f"before {'stopping' if d.action == STOP else 'destroying'}")
        except OrchError as e:
            problem = f"weights could not be pulled ({_why(e)})"
            if d.action == DESTROY and not force:
                if not facts(orch, inst).can_stop:
                    orch.ledger.note(inst.id, f"not destroyed: {problem}; {d.reason}", orch.actor)
                    return Decision(REPORT, f"not destroyed: {problem}; {d.reason}", d.saved_hr, "unpulled")
                d = Decision(STOP, f"{d.reason}; {problem}: stopping instead, the disk keeps them",
                             _saved(inst, STOP), d.kind)
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
    action: str  # keep, stop, destroy, report, skip, gone, error
    reason: str
    saved_hr: float = 0.0
    acted: bool = False
    instance_id: str = ""
    wake_in: float | None = None  # --watch wakes then rather than a whole interval later

    def to_dict(self) -> dict:
        return asdict(self)


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


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


def reap(orch, dry_run: bool = False, force: bool = False, now: Callable[[], datetime] | None = None) -> list[Outcome]:
    """One pass over every live instance of every provider (one listing per provider)."""
    clock = now or utcnow
    started = time.monotonic()
    outcomes: list[Outcome] = []
    with _PassLock(orch.home):
        live = orch.ledger.instances(live_only=True)
        for provider_name in sorted({i.provider for i in live}):
            group = [i for i in live if i.provider == provider_name]
            try:
                listing = {r.provider_id: r for r in orch.provider(provider_name).list()}
            except Exception as e:  # noqa: BLE001 - a failed listing is never read as "nothing there"
                outcomes += [Outcome(i.name, i.provider, i.state, "skip",
                                     f"{provider_name} listing failed ({_why(e)}): left alone", instance_id=i.id)
                             for i in group]
                continue
            for inst in group:
                try:
                    outcomes.append(_one(orch, inst, listing, dry_run, force, clock))
                except Exception as e:  # noqa: BLE001 - one instance's trouble must not stop the pass
                    outcomes.append(Outcome(inst.name, inst.provider, inst.state, "error", _why(e), instance_id=inst.id))
        if not dry_run:
            summary = {"at": utcnow().isoformat(), "seconds": round(time.monotonic() - started, 2),
                       "outcomes": [o.to_dict() for o in outcomes]}
            orch.ledger.set_meta("reaper:last_pass", json.dumps(summary))
    return outcomes


def _one(orch, inst, listing: dict, dry_run: bool, force: bool, clock) -> Outcome:
    def outcome(action, reason, saved=0.0, acted=False, state=None, wake_in=None):
        return Outcome(inst.name, inst.provider, state or inst.state, action, reason, saved, acted, inst.id, wake_in)

    if inst.state in IN_PROGRESS or inst.provider_id is None:
        return outcome("skip", f"{inst.state}: another orch command is moving it (or `orch reconcile` will)")
    remote = listing.get(inst.provider_id)
    if dry_run:
        shown = remote.status if remote is not None else "gone"
        expected = {states.READY: "running", states.STOPPED: "stopped", states.PREEMPTED: "stopped"}[inst.state]
        if shown != expected:
            return outcome(REPORT, f"the provider shows it {shown}: a real pass records that first")
    else:
        before = inst.state
        inst = settle(orch, inst, remote)
        if inst.state not in states.LIVE:
            return outcome("gone", orch.ledger.events(inst.id)[-1].reason, state=inst.state)
        if inst.state != before:
            orch.say(f"{inst.name}: {before} -> {inst.state} (as its provider shows it)")
    run = orch.ledger.latest_run(inst.id)
    obs = Observed()
    if inst.state == states.READY:
        obs, run = _look_ready(orch, inst, run, dry_run)
    now = clock()
    pol = policies.of(inst)
    d = decide(inst, pol, facts(orch, inst, run, now), obs, now, force)
    if d.kind == "busy" and not dry_run:  # the last sign of activity this controller saw
        orch.ledger.set_meta(f"reaper-busy:{inst.id}", utc(now).isoformat())
    if dry_run or d.action not in (STOP, DESTROY):
        if not dry_run:
            _note_if_changed(orch, inst, d)
        return outcome(d.action, d.reason, d.saved_hr, wake_in=d.wake_in)
    d = act(orch, inst, run, d, force)
    inst = orch.ledger.get(inst.id)
    _note_if_changed(orch, inst, d, acted=d.action in (STOP, DESTROY))
    return outcome(d.action, d.reason, d.saved_hr, acted=d.action in (STOP, DESTROY), state=inst.state)


def _look_ready(orch, inst, run, dry_run: bool):
    try:
        obs, probe = look(orch, inst, run, writes=not dry_run)
    except SSHError as e:
        return Observed(reachable=False, error=_why(e)), run
    seen_busy = orch.ledger.get_meta(f"reaper-busy:{inst.id}")
    if seen_busy:
        last = max(t for t in (obs.last_active_at, datetime.fromisoformat(seen_busy)) if t)
        obs = replace(obs, last_active_at=last)
    if dry_run:
        return obs, run
    learn(orch, inst, probe.get("state"))
    run = orch.ledger.latest_run(inst.id)
    # A finished run is brought home at once, so a later stop or destroy (the watchdog's too) is safe.
    if run is not None and run.run_dir and obs.run_state in ("completed", "failed", "crashed") and \
            not weights_safe(run, None, utcnow()):
        try:
            pull(orch, inst, run, f"training {obs.run_state}")
            run = orch.ledger.latest_run(inst.id)
        except OrchError as e:
            orch.ledger.note(inst.id, f"could not pull the finished run: {_why(e)}", orch.actor)
    if not probe.get("alive") and watchdog_enabled():
        if arm(orch, inst):
            orch.ledger.note(inst.id, "watchdog re-armed: it was not running", orch.actor)
    return obs, run


def _note_if_changed(orch, inst, d: Decision, acted: bool = False) -> None:
    """A decision is an event when it differs from the last one (not every pass's 'still idle')."""
    key = f"reaper:{inst.id}"
    now_key = f"{d.action}:{d.kind}"
    if orch.ledger.get_meta(key) == now_key:
        return
    orch.ledger.set_meta(key, now_key)
    if not acted:  # an action is already an event: the transition carries its reason
        orch.ledger.note(inst.id, f"{d.action}: {d.reason}", orch.actor)


def last_pass(ledger) -> dict | None:
    return ledger.get_json_meta("reaper:last_pass")


__all__ = ["Decision", "Facts", "Observed", "Outcome", "arm", "break_even_hours", "decide", "idle_action",
           "observe", "reap", "settle"]
