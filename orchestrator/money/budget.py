"""A budget over everything orch rents: ``[budget] daily_usd`` and ``monthly_usd`` in config.toml,
calendar periods in ``timezone`` (default UTC), read from the ledger's dollars.

**Spent** in a period is what ``orch cost`` counts from the period's start: every instance's time
at the price paid (``cost``) and every volume's GB-months (``volumes``), with the instances of the
jobs a schedule launched counted apart (``schedules``). **Committed** is what the active jobs'
plans still expect to spend (each job's estimate less what it spent so far; a job with no estimate
commits nothing and is listed). **Left** is the budget less both. One ledger, one budget: a team on
one PostgreSQL ledger shares it, whoever rented.

What is checked against it: ``jobs.budget`` (before renting, and each look of the watcher or the
reaper while jobs run). This module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from orchestrator import config
from orchestrator.errors import UsageError
from orchestrator.text import row_json

PERIODS = ("daily", "monthly")
WARN_AT = 0.8  # the share of a period's budget spent that is said (and posted) once


def estimate(usd: float | None, price_hr: float | None, max_hours: float | None) -> float | None:
    """A plan's estimate for the whole job: its own (a training's epochs), else its $/hr for the
    job's --max-hours (a deadline bounds a command); None where neither is known."""
    if usd is not None:
        return usd
    if price_hr is not None and max_hours is not None:
        return price_hr * max_hours
    return None


def limits() -> tuple[list[tuple[str, float]], str]:
    """([(period, $)], the time zone's name) from config.toml; no period: no budget."""
    section = config.get("budget", {}) or {}
    return ([(p, float(section[f"{p}_usd"])) for p in PERIODS if section.get(f"{p}_usd") is not None],
            section.get("timezone") or "UTC")


def period_start(period: str, now: datetime, tz: str) -> tuple[datetime, str]:
    """(where ``period`` began before ``now``, in UTC; its key: 2026-12-07 or 2026-12) in zone ``tz``."""
    from orchestrator.schedules import cron

    local = now.astimezone(cron.zone(tz, "budget.timezone"))
    begin = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "monthly":
        begin = begin.replace(day=1)
    key = f"{begin:%Y-%m-%d}" if period == "daily" else f"{begin:%Y-%m}"
    return begin.astimezone(timezone.utc), key


@dataclass
class Period:
    name: str  # daily | monthly
    usd: float
    since: datetime  # UTC
    key: str  # which day or month, in the budget's zone
    spent: dict = field(default_factory=dict)  # instances, volumes, schedules, total ($)

    @property
    def total(self) -> float:
        return self.spent.get("total", 0.0)


@dataclass
class Standing:
    """Each period's budget, what it spent, and what the active jobs commit."""

    periods: list[Period]
    tz: str
    jobs: list[dict]  # each active job: name, estimate, spent, committed
    volumes: list[dict]  # the volumes that bill now (kept when jobs are stopped)

    def committed(self, without: str | None = None) -> float:
        return sum(j["committed"] for j in self.jobs if j["name"] != without)

    def left(self, without: str | None = None) -> float:
        """What the tightest period has left after what it spent and what the jobs commit
        (``without``: that job's own commitment left out, for its own relaunch)."""
        c = self.committed(without)
        return min(p.usd - p.total - c for p in self.periods)

    def reached(self) -> Period | None:
        """The first period whose spend reached its budget."""
        return next((p for p in self.periods if p.total >= p.usd), None)

    def fits(self, usd: float | None, without: str | None = None) -> str | None:
        """Why a plan estimated at ``usd`` does not fit what is left (None: it fits). With no
        estimate, only a budget already used up refuses it."""
        left = self.left(without)
        p = min(self.periods, key=lambda p: p.usd - p.total)
        where = f"the {p.name} budget ${p.usd:g} ({p.key} {self.tz}: ${p.total:.4f} spent, " \
                f"${self.committed(without):.4f} committed by running jobs, ${max(left, 0):.4f} left)"
        if usd is None:
            return f"nothing is left of {where}" if left <= 0 else None
        return f"the plan's estimate ${usd:.4f} does not fit {where}" if usd > left else None

    def line(self, usd: float | None) -> str:
        """The budget line of a dry run."""
        left = self.left()
        why = self.fits(usd)
        if why:
            return f"budget: refused: {why}"
        tail = f"${usd:.4f} of ${left:.4f} left" if usd is not None else \
            f"no estimate: ${left:.4f} left, the budget is enforced while it runs"
        return "budget: fits, " + tail + " (" + ", ".join(f"{p.name} ${p.usd:g}" for p in self.periods) + ")"

    def to_dict(self) -> dict:
        return {"timezone": self.tz, "committed_usd": round(self.committed(), 6), "left_usd": round(self.left(), 6),
                "periods": [{"period": p.name, "budget_usd": p.usd, "since": p.since.isoformat(), "key": p.key,
                             "spent": {k: round(v, 6) for k, v in p.spent.items()},
                             "left_usd": round(p.usd - p.total - self.committed(), 6),
                             "spent_share": round(p.total / p.usd, 4)} for p in self.periods],
                "jobs": self.jobs, "volumes": self.volumes}

    def lines(self) -> list[str]:
        """What ``orch budget`` and ``orch cost`` print of it."""
        out = []
        for p in self.periods:
            s = p.spent
            left = p.usd - p.total - self.committed()  # below 0 once crossed: said as what it is over by
            left_text = f"left ${left:.4f}" if left >= 0 else f"nothing left (${-left:.4f} over)"
            out.append(f"budget {p.name:<8} ${p.usd:g} since {p.since.astimezone(_zone(self.tz)):%Y-%m-%d %H:%M} "
                       f"{self.tz}: spent ${p.total:.4f} ({100 * p.total / p.usd:.0f} %: instances "
                       f"${s['instances']:.4f}, volumes ${s['volumes']:.4f}, schedules ${s['schedules']:.4f}), "
                       f"committed ${self.committed():.4f}, {left_text}")
        for j in self.jobs:
            est = f"estimate ${j['estimate']:.4f}" if j["estimate"] is not None else "no estimate"
            out.append(f"  job {j['name']}: {est}, spent ${j['spent']:.4f}, committed ${j['committed']:.4f}")
        return out


def _zone(tz: str):
    from orchestrator.schedules import cron

    return cron.zone(tz, "budget.timezone")


def standing(ledger, now: datetime | None = None) -> Standing | None:
    """The budget as the ledger has it now; None where config.toml sets none."""
    from orchestrator.money import cost
    from orchestrator.ledger import ledger_snapshot
    from orchestrator.volumes import volumes

    wanted, tz = limits()
    if not wanted:
        return None
    now = now or datetime.now(timezone.utc)
    snap = ledger_snapshot.read(ledger)
    active, scheduled = _jobs(ledger)
    members = _members(snap)
    of_schedules = {i for ids in scheduled.values() for i in _instances(ids, members)}
    periods = []
    for name, usd in wanted:
        since, key = period_start(name, now, tz)
        rows, _ = cost.report(snap, since=since, until=now)
        on_schedules = sum(r.total_usd for r in rows if r.instance_id in of_schedules)
        vols = sum(v["usd"] for v in volumes.costs(ledger, since))
        on_instances = sum(r.total_usd for r in rows) - on_schedules
        periods.append(Period(name, usd, since, key, {"instances": on_instances, "volumes": vols,
                                                      "schedules": on_schedules,
                                                      "total": on_instances + vols + on_schedules}))
    jobs = []
    for job, ids in active:
        spent = sum(cost.instance_cost(i, snap.events_of(i.id), snap.runs_of(i.id), until=now).total_usd
                    for i in snap.instances if i.id in _instances(ids, members))
        plan = row_json(job.plan, {})
        est = estimate(plan.get("usd"), plan.get("price_hr"), job.max_hours)
        jobs.append({"name": job.name, "state": job.state, "estimate": est, "spent": round(spent, 6),
                     "committed": round(max(est - spent, 0.0), 6) if est is not None else 0.0})
    billing = [{"name": v["name"], "provider": v["provider"], "usd_month": v["usd_month"]}
               for v in volumes.listing(ledger)]
    return Standing(periods, tz, jobs, billing)


def show_cost(ledger, name: str | None = None, since: datetime | None = None, as_json: bool = False) -> None:
    """``orch cost``, and this period against the budget below it (the whole fleet's only)."""
    from orchestrator.money import cost

    cost.show(ledger, name, since, as_json, standing(ledger) if name is None else None)


def check(ledger, usd: float | None, what: str, without: str | None = None) -> str | None:
    """Refuse (exit 2: nothing rented) ``what`` whose estimate ``usd`` does not fit the budget;
    the dry run's budget line where it fits (None: no budget set)."""
    st = standing(ledger)
    if st is None:
        return None
    why = st.fits(usd, without)
    if why:
        raise UsageError(f"{what} is refused by the budget: {why}; nothing was rented (`orch budget`)")
    return st.line(usd)


def _members(snap) -> dict[str, set[str]]:
    """Each instance id -> the ids of its group (itself alone when it is none)."""
    by_group: dict[str, set[str]] = {}
    for i in snap.instances:
        if getattr(i, "group_id", None):
            by_group.setdefault(i.group_id, set()).add(i.id)
    return {i.id: by_group.get(getattr(i, "group_id", None) or "", {i.id}) for i in snap.instances}


def _instances(ids: set[str], members: dict[str, set[str]]) -> set[str]:
    return {m for i in ids for m in members.get(i, {i})}


def _jobs(ledger) -> tuple[list[tuple], dict[str, set[str]]]:
    """(each job not ended with its attempts' instance ids, {job id: instance ids} of the jobs a
    schedule launched)."""
    from sqlmodel import select

    from orchestrator.schedules import ledger_schedules
    from orchestrator.ledger.ledger import Attempt, Job

    with ledger.session(write=False) as s:
        jobs = list(s.exec(select(Job)))
        pairs = list(s.exec(select(Attempt.job_id, Attempt.instance_id).where(Attempt.instance_id.is_not(None))))
    by_job: dict[str, set[str]] = {}
    for job_id, instance_id in pairs:
        by_job.setdefault(job_id, set()).add(instance_id)
    from_schedules = ledger_schedules.of_jobs(ledger, [j.id for j in jobs])
    active = [(j, by_job.get(j.id, set())) for j in jobs if j.ended_at is None]
    return active, {jid: by_job.get(jid, set()) for jid in from_schedules}
