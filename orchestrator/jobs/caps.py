"""What a job may spend: its cost so far (every attempt, every node), ``--max-cost`` and
``--max-hours``, and the policy each attempt's machines are rented with, so that the caps hold
with the laptop closed (the watchdog's deadline) and no machine is ended before a reaper pass
has pulled it (the idle floor)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orchestrator.errors import OrchError
from orchestrator.jobs import record
from orchestrator.text import row_json

REAPER_EVERY_S = 300.0  # the reaper's interval when no schedule is installed (`orch reaper install`'s default)
IDLE_PASSES = 3  # a job's instance idles at least this many reaper intervals before it may be ended


def cost(orch, job) -> float:
    """What every attempt's instance cost (running and stopped, at the price paid), until now."""
    from orchestrator.jobs import group

    total, seen = 0.0, set()
    for attempt in orch.ledger.attempts(job.id):
        inst = orch.ledger.get(attempt.instance_id) if attempt.instance_id else None
        key = (inst.group_id or inst.id) if inst is not None else None
        if inst is not None and key not in seen:  # a group carried on by a replacement counts once
            seen.add(key)
            total += group.cost(orch, inst)  # every node of a group attempt, replaced ones included
    return total


def reaper_every(ledger) -> float:
    info = ledger.get_json_meta("reaper:schedule")
    every = info.get("every") if isinstance(info, dict) else None
    return float(every) if isinstance(every, (int, float)) and every > 0 else REAPER_EVERY_S


def idle_floor_minutes(ledger) -> float:
    return IDLE_PASSES * reaper_every(ledger) / 60


def deadline_hours(orch, job, price_hr: float | None) -> float | None:
    """Hours an attempt may still run: to --max-hours after the job began, and what --max-cost still
    pays for at ``price_hr``. None: no cap. At or below zero: the job must stop."""
    left = []
    if job.max_hours:
        left.append((record.utc(job.created_at) + timedelta(hours=job.max_hours) - record.now()).total_seconds() / 3600)
    if job.max_cost is not None and price_hr:
        left.append((job.max_cost - cost(orch, job)) / price_hr)
    return min(left) if left else None


class CapReached(OrchError):
    """--max-cost or --max-hours leaves nothing for another attempt."""


def over_cap(orch, job, inst=None) -> str | None:
    """Why the job must stop now: its cost (looking one reaper interval ahead on a running
    instance, so the cap is not crossed before the next look) or its deadline."""
    spent = cost(orch, job)
    if job.max_cost is not None:
        from orchestrator.jobs import group

        ahead = (group.hourly(orch, inst) if inst is not None else 0.0) * reaper_every(orch.ledger) / 3600
        if spent + ahead >= job.max_cost:
            return (f"--max-cost ${job.max_cost:g} reached (${spent:.4f} spent"
                    + (f", ${ahead:.4f} more before the next look" if ahead else "") + ")")
    if job.max_hours and record.now() >= record.utc(job.created_at) + timedelta(hours=job.max_hours):
        return f"--max-hours {job.max_hours:g} reached"
    return None


def attempt_policy(orch, job, js, price_hr: float | None) -> str:
    """The base policy, with the idle floor (at least IDLE_PASSES reaper intervals: neither the
    watchdog nor the reaper's idle rule ends a machine whose work just finished before a pass has
    pulled it) and the job's deadline (--max-hours, and the hours --max-cost still pays for)."""
    from orchestrator.money import policy as policies

    base = policies.Policy(**row_json(js.policy, {}))
    hours = deadline_hours(orch, job, price_hr)
    if hours is not None and hours <= 0:
        raise CapReached(over_cap(orch, job) or "no money or time left for another attempt")
    pol = replace(base, idle_minutes=max(base.idle_minutes, idle_floor_minutes(orch.ledger)),
                  max_hours=min(h for h in (hours, base.max_hours or None) if h) if (hours or base.max_hours) else 0.0)
    return pol.to_json()
