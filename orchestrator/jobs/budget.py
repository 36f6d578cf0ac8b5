"""The ``[budget]`` (``orchestrator.money.budget``) held for jobs: before renting (``submit``'s plan, a
relaunch's) and while they run (every look of the watcher or the reaper, ``engine.advance_all``).

Once a period's spend reaches its budget every active job is stopped: what it has comes home, its
machines are destroyed (volumes are kept: they hold data, and are reported), the job ends
``stopped`` with a reason that begins ``budget:``, and a ``budget`` webhook event is posted once per
period. At ``budget.WARN_AT`` of a period it is said, and posted, once.
"""

from __future__ import annotations

import json

from orchestrator.money import budget
from orchestrator.errors import UsageError
from orchestrator.jobs.states import ACTIVE

META = "budget:said"  # {period: the key of the period whose warning / stop was said}


def before(orch, choice, sub, dry_run: bool) -> str | None:
    """The budget line of a plan about to be rented; a plan that does not fit is refused (exit 2)
    unless this is a dry run, which shows the refusal. None: no budget set."""
    st = budget.standing(orch.ledger)
    if st is None:
        return None
    usd = sub.estimate(choice)
    why = st.fits(usd)
    if why and not dry_run:
        raise UsageError(f"job {sub.name} is refused by the budget: {why}; nothing was rented (`orch budget`)")
    return st.line(usd)


def refusal(orch, choice, job) -> str | None:
    """Why a relaunch of ``job`` on ``choice`` does not fit the budget (its own commitment aside)."""
    st = budget.standing(orch.ledger)
    if st is None:
        return None
    spent = next((j["spent"] for j in st.jobs if j["name"] == job.name), 0.0)
    usd = budget.estimate(choice.usd, choice.price_hr, job.max_hours)
    if usd is not None and choice.usd is None and job.max_hours is not None:
        usd = max(usd - spent, 0.0)  # --max-hours bounds the whole job: what it spent is part of it
    return st.fits(usd, without=job.name)


def guard(orch, stop) -> list[dict]:
    """One look at the budget while jobs run: warn once at ``WARN_AT``; once a period is spent,
    stop every active job (``stop(orch, job, why)``: ``engine.stop``). What was stopped, as
    ``advance_all`` reports each job."""
    from orchestrator import notify
    from orchestrator.text import why as _why

    st = budget.standing(orch.ledger)
    if st is None:
        return []
    said = orch.ledger.get_json_meta(META) or {}
    said = said if isinstance(said, dict) else {}
    for p in st.periods:
        if p.total >= budget.WARN_AT * p.usd and said.get(f"warned:{p.name}") != p.key and p.total < p.usd:
            said[f"warned:{p.name}"] = p.key
            orch.ledger.set_meta(META, json.dumps(said))
            text = (f"orch: budget: {100 * p.total / p.usd:.0f} % of the {p.name} budget ${p.usd:g} spent "
                    f"(${p.total:.4f} since {p.key} {st.tz}); the jobs are stopped when it is all spent")
            orch.say(text)
            notify.event("budget", text)
    p = st.reached()
    if p is None:
        return []
    why = (f"budget: the {p.name} budget ${p.usd:g} is spent (${p.total:.4f} since {p.key} {st.tz}): "
           "stopped, its machines destroyed")
    out = []
    for job in orch.ledger.jobs(ACTIVE):
        try:
            job = stop(orch, job, why)
            out.append({"name": job.name, "state": job.state, "reason": job.reason or ""})
        except Exception as e:  # noqa: BLE001 - the next look tries again; the others are still stopped
            out.append({"name": job.name, "state": job.state, "reason": f"error: {_why(e)}"})
    if said.get(f"reached:{p.name}") != p.key:
        said[f"reached:{p.name}"] = p.key
        orch.ledger.set_meta(META, json.dumps(said))
        stopped = [d["name"] for d in out if d["state"] not in ACTIVE]
        vols = ", ".join(f"{v['name']} ({v['provider']}" + (f", ${v['usd_month']:.2f}/month)" if v["usd_month"]
                                                            is not None else ")") for v in st.volumes)
        text = (f"orch: budget: the {p.name} budget ${p.usd:g} is spent (${p.total:.4f} since {p.key} {st.tz}); "
                f"jobs stopped: {', '.join(stopped) or 'none'}" + (f"; volumes kept (still billing): {vols}"
                                                                   if vols else ""))
        orch.say(text)
        notify.event("budget", text)
    return out
