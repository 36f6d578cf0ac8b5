"""The controller's side of the on-instance watchdog (``playbooks/on_instance/watchdog.py``): its
config, arming it (``orch up``, ``orch start``, a reaper pass that finds it dead), and learning
what it did. What orch remembers of it lives in the instance's ledger memory:

- ``watchdog``: the summary of the last arm (when, the rule, which self-stop commands it has);
- ``watchdog_seen``: the last action of its already recorded as an event (recorded once);
- ``watchdog_acted``: the last stop or destroy its state file showed (begun, or done), for ``mark``.

Who stopped or ended an instance is never inferred from the watchdog being armed: ``mark`` says it
was the watchdog only on the watchdog's own word, read in its state file or kept by the provider
(``Remote.ended_by``); anything else was done from outside orch (``sync``).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator.money import policy as policies
from orchestrator.reaper import rules
from orchestrator.provider import features
from orchestrator.errors import OrchError, SSHError
from orchestrator.text import why as _why

ACTOR = "watchdog"
INTERVAL_S = 5.0


def enabled() -> bool:
    """ORCH_WATCHDOG=off leaves the controller's reaper alone on duty (benchmarks, debugging)."""
    return os.environ.get("ORCH_WATCHDOG", "on").lower() not in ("0", "off", "no", "false")


def history(orch, inst, run=None, fleet=None) -> rules.Facts:
    """The rules' facts for ``inst``, from the ledger, or from ``fleet`` (a ``snapshot`` of it
    already read: the reaper's pass reads the whole fleet's events and runs in one query each)."""
    try:
        can_stop = features.can_stop(orch.provider(inst.provider), inst.spot)
    except OrchError:
        can_stop = False
    rows = fleet if fleet is not None else orch.ledger
    events = fleet.events_of(inst.id) if fleet is not None else orch.ledger.events(inst.id)
    return rules.facts(inst, events, rows.first_run(inst.id), run if run is not None else rows.latest_run(inst.id),
                       can_stop, datetime.now(timezone.utc))


def config(orch, inst, work: str, commands: dict[str, str]) -> dict[str, Any]:
    pol = policies.of(inst)
    f = history(orch, inst)
    be = rules.break_even_hours(f.rebuild_cost, inst.stopped_price_hr)
    action, why = rules.idle_action(pol, "stop" in commands, be, inst.provider, can_destroy="destroy" in commands)
    try:  # where a spot interruption notice is read (an instance metadata service), if anywhere
        notice_url = orch.provider(inst.provider).notice_url(bool(inst.spot))
    except OrchError:
        notice_url = None
    return {"name": inst.name, "instance": inst.id, "work": work, "interval": INTERVAL_S, "notice_url": notice_url,
            "idle_minutes": pol.idle_minutes, "max_hours": pol.max_hours,
            "first_ready_at": f.first_ready_at.timestamp() if f.first_ready_at else time.time(),
            "idle_action": action, "deadline_action": action, "why": why, "protected": bool(inst.protected),
            "gpu": not inst.cpu_only, "commands": commands}


def arm(orch, inst) -> bool:
    """Start the watchdog on a ready instance, or hand a running one its new config (it re-reads
    it every check). Never raises: an instance without a watchdog still has the controller's reaper."""
    if not enabled():
        return False
    from orchestrator.ssh import remote
    from playbooks import host

    try:
        commands = features.self_end_commands(orch.provider(inst.provider), inst.provider_id, inst.spot)
        with orch.connect(inst) as c:
            work = host.workdir(c)
            script = host.upload(c, "watchdog.py")
            cfg = config(orch, inst, work, commands)
            path = remote.put_text(c, json.dumps(cfg, indent=1), f"{work}/watchdog-config.json", 0o600)
            host.detach(c, [host.python(c), script, "run", path], f"{work}/watchdog.log", cwd=work)
    except Exception as e:  # noqa: BLE001 - reported; up must not fail for want of a watchdog
        why = _why(e)
        orch.say(f"      watchdog not started on {inst.name} ({why}); `orch reap` still applies its policy")
        orch.ledger.note(inst.id, f"watchdog not started: {why}", orch.actor)
        return False
    summary = {"armed_at": datetime.now(timezone.utc).isoformat(), "idle_action": cfg["idle_action"],
               "idle_minutes": cfg["idle_minutes"], "max_hours": cfg["max_hours"], "commands": sorted(commands),
               "protected": cfg["protected"]}
    orch.ledger.remember(inst.id, watchdog=summary)
    hours, deadline = cfg["max_hours"], ""
    if hours:  # a job's: the hours --max-cost still pays for (0.0999047), said as a person would
        deadline = f" or past {round(hours, 2):g} h" if hours >= 1 else f" or past {round(hours * 60, 1):g} min"
    orch.say(f"      watchdog: idle {cfg['idle_minutes']:g} min{deadline} -> {cfg['idle_action']}"
             + (" (protected: report only)" if cfg["protected"] else ""))
    if not commands:
        orch.ledger.note(inst.id, f"watchdog armed, report only: {inst.provider} gives no self-stop", orch.actor)
    return True


def armed_now(orch, inst) -> dict | None:
    """The watchdog record, if it was armed during the instance's current ready period."""
    armed = orch.ledger.recall(inst.id, "watchdog")
    if not isinstance(armed, dict) or "armed_at" not in armed:
        return None
    ready_since = history(orch, inst).ready_since
    at = rules.utc(datetime.fromisoformat(armed["armed_at"]))
    return armed if ready_since is None or at >= ready_since - timedelta(seconds=5) else None


def learn(orch, inst, state: dict | None) -> None:
    """Record in the ledger what the watchdog did (once per action): the next read after it acted."""
    action = state.get("action") if isinstance(state, dict) else None
    if not isinstance(action, dict) or action.get("what") not in ("stop", "destroy"):
        return
    try:
        at = float(action.get("at") or 0)
    except (TypeError, ValueError):
        return
    since = history(orch, inst).ready_since
    since = since.timestamp() if since else 0
    acted = orch.ledger.recall(inst.id, "watchdog_acted")
    if at >= since and (not isinstance(acted, dict) or acted.get("at") != at):
        from orchestrator.text import clean

        orch.ledger.remember(inst.id, watchdog_acted={"what": action["what"], "at": at,
                                                      "reason": clean(action.get("reason"), 200)})
    if action.get("rc") is None and not action.get("error") and at >= since and time.time() - at < 60:
        return  # still in flight in this ready period: its outcome comes with the next look
    seen = f"{at}:{action.get('rc')}:{bool(action.get('error'))}"
    if orch.ledger.recall(inst.id, "watchdog_seen") == seen:
        return
    from orchestrator.text import clean

    when = rules.hm(datetime.fromtimestamp(at, timezone.utc)) if at else "?"
    reason = clean(action.get("reason"), 200)
    if action.get("error"):
        text = f"watchdog tried to {action['what']} it at {when} ({reason}) and failed: {clean(action['error'], 200)}"
    elif action.get("rc") is None:
        text = f"watchdog had run its self-{action['what']} at {when}: {reason}"
    else:
        text = f"watchdog ran its self-{action['what']} at {when} (exit {clean(action.get('rc'), 10)}): {reason}"
    orch.ledger.note(inst.id, text, ACTOR)
    orch.ledger.remember(inst.id, watchdog_seen=seen)


def mark(orch, inst, remote, what: str) -> str | None:
    """The watchdog's own word that it did ``what`` ("stop" or "destroy") to ``inst`` in its current
    ready period: the reason its provider kept (``Remote.ended_by``), or the action its state file
    showed when orch last read it; None where it left none (then it was not known to be the watchdog)."""
    word = getattr(remote, "ended_by", "") if remote is not None else ""
    if word:
        from orchestrator.text import clean

        return clean(word, 200)
    acted = orch.ledger.recall(inst.id, "watchdog_acted")
    if not isinstance(acted, dict) or acted.get("what") != what:
        return None
    since = history(orch, inst).ready_since
    try:
        at = float(acted.get("at") or 0)
    except (TypeError, ValueError):
        return None
    if since is not None and at < since.timestamp() - 5:
        return None  # a stop of an earlier ready period
    return str(acted.get("reason") or "?")


def read_state(orch, inst) -> dict | None:
    """The watchdog's state file (it survives a stop, on the volume)."""
    from orchestrator.ssh import remote
    from playbooks import host

    def read(c):
        try:
            with c.sftp().open(f"{host.workdir(c)}/watchdog.json") as f:
                return json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            return None

    with orch.connect(inst) as c:
        # An instance destroyed under the read (another orch's `down`): paramiko's "Server connection
        # dropped" is the SSHError its callers handle, as for a command, not an internal error.
        data = remote.dropped_is_ssh_error(c, lambda: read(c))
    return data if isinstance(data, dict) else None


def rearm(orch, inst) -> bool:
    """After a start: learn what the last watchdog did (its state file survives the stop), then
    start a fresh one, which begins a new state file."""
    try:
        learn(orch, inst, read_state(orch, inst))
    except SSHError:
        pass  # unreachable for now: the watchdog armed below reports, the next look learns
    return arm(orch, inst)


def mark_pulled(orch, inst) -> None:
    """Tell the watchdog the weights are home (it destroys only after that)."""
    from orchestrator.ssh import remote
    from playbooks import host

    with orch.connect(inst) as c:
        remote.put_text(c, json.dumps({"pulled_at": datetime.now(timezone.utc).isoformat()}),
                        f"{host.workdir(c)}/pulled.json")
