"""The one path from a request to a running job. ``orch run --data``, ``orch run -f task.yaml``,
``orch run NAME -- CMD`` (and a schedule's runs) build a ``Submission`` and call ``submit``: what
travels is made ready at home, the offers are asked once, the plan is checked against
``--max-cost`` and recorded, and the first attempt rents the very offer recorded."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.jobs import budget, engine, record, resume_copy
from orchestrator.jobs.handed import handing
from orchestrator.jobs.plan import Choice, check_plan, plan
from orchestrator.jobs.record import forget, note
from orchestrator.jobs.spec import Submission
from orchestrator.jobs.states import ACTIVE, ENDED, PLANNED


class OverEstimate(UsageError):
    """A plan whose estimate for the whole job is over the submission's ``max_estimate``: nothing
    recorded, nothing rented; the plan and its estimate go with the refusal."""

    def __init__(self, choice: Choice, usd: float, ceiling: float):
        from orchestrator.text import clean

        super().__init__(f"the best plan, {clean(choice.line, 300)}: its estimate ${usd:.4f} is over --max-cost "
                         f"${ceiling:g}; nothing rented")
        self.choice, self.usd = choice, usd


@dataclass
class Submitted:
    choice: Choice  # the plan, with the ranked offers it chose from
    job: Any = None  # None for a dry run: nothing recorded, nothing rented


def submit(orch, sub: Submission, dry_run: bool = False, fresh: bool = True) -> Submitted:
    """Plan ``sub`` once, record the plan and start its first attempt on the offer recorded; with
    ``dry_run``, only plan it. Refusals (a name in use, a plan over --max-cost) come before
    anything is recorded or rented. The offers are listed once (``fresh=False``: a listing orch's
    offers cache still holds is read again, for a dry run that asks about a plan just made)."""
    js = sub.spec
    kind = js.kind_of()
    taken = orch.ledger.job(sub.name)
    if taken is not None and taken.state in ACTIVE:
        raise UsageError(f"a job named {sub.name!r} is already {taken.state} (`orch jobs show {sub.name}`)")
    js = kind.prepare(orch, js, sub.disk_given)
    t0 = time.monotonic()
    req = js.request
    if not req.cpu and not req.offer:
        orch.say(f"plan: asking {', '.join(js.providers) if js.providers else 'every provider with a key'} for "
                 "live offers")
    choice = plan(orch, js, fresh=fresh)
    check_plan(choice, sub.max_cost)
    usd = sub.estimate(choice)
    if sub.max_estimate is not None and usd is not None and usd > sub.max_estimate:
        raise OverEstimate(choice, usd, sub.max_estimate)
    orch.say(f"plan: {choice.line}")
    said = budget.before(orch, choice, sub, dry_run)  # refused here (exit 2) when it does not fit: nothing made
    if said:
        orch.say(f"      {said}")
    if dry_run:
        return Submitted(choice)
    if sub.max_cost is not None and choice.usd is None:
        orch.say(f"      no estimate for this offer: --max-cost ${sub.max_cost:g} is enforced while it runs")
    if sub.replace:
        rows, held = forget(orch, sub.name, ENDED)
        if rows or held:
            orch.say(f"replaces job {sub.name} ({', '.join(j.state for j in rows) or 'no row'}; its files "
                     f"{', '.join(map(str, held)) or 'none'} removed)")
    job = _record(orch, replace(sub, spec=js), choice, time.monotonic() - t0)
    record.allow_secrets(orch.home, job, sub.allowed_secrets)
    if not sub.secrets:
        return Submitted(choice, engine.start(orch, job, choice))
    from orchestrator.tasks import task

    # to its first launch alone, never this process's environment; whatever the attempt says back: hidden
    with handing(job.name, sub.secrets), task.hiding(sub.secrets):
        return Submitted(choice, engine.start(orch, job, choice))


def _record(orch, sub: Submission, choice: Choice, plan_seconds: float):
    """The job's row (planned, with the plan it will rent) and, from a pulled run folder, its first
    checkpoint copy."""
    import json

    job = orch.ledger.create_job(ACTIVE, name=sub.name, state=PLANNED, spec=sub.spec.to_json(),
                                 plan=json.dumps(choice.to_dict()), max_cost=sub.max_cost, max_hours=sub.max_hours,
                                 retries=sub.retries, keep=sub.keep,
                                 phases=json.dumps({"plan": round(plan_seconds, 3)}), nodes=sub.spec.nodes)
    if sub.resume_from is not None:
        job = resume_copy.adopt(orch, job, sub.resume_from)
    return note(orch, job, f"planned: {choice.line}", say=False)
