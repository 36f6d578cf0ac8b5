"""What ``orch jobs`` shows of a job: its dict (``--json``; keys are only ever added), one
progress line, the seconds per phase, and ``--wait``'s loop, which advances the job between looks.
Reads only: the engine is ``jobs``.
"""

from __future__ import annotations

from typing import Callable

from orchestrator import jobs
from orchestrator.errors import OrchError
from orchestrator.jobs.kinds import KINDS, JobKind
from orchestrator.text import clean, row_json
from orchestrator import parallel as par


def phases(job, attempts) -> dict[str, float]:
    """Seconds per phase: plan (every ranking), provision, stage, train and recover (every attempt
    summed), pull (the final one), teardown."""
    out = {k: v for k, v in row_json(job.phases, {}).items() if isinstance(v, (int, float))}
    for a in attempts:
        for k, v in row_json(a.phases, {}).items():
            if isinstance(v, (int, float)):
                out[k] = round(out.get(k, 0.0) + v, 3)
    order = ("plan", "provision", "stage", "train", "recover", "pull", "teardown")
    return {k: out[k] for k in sorted(out, key=lambda k: (order.index(k) if k in order else 99, k))}


def attempt_dict(orch, a) -> dict:
    from orchestrator.jobs import group
    from orchestrator.views.instances import iso

    inst = orch.ledger.get(a.instance_id) if a.instance_id else None
    spent = group.cost(orch, inst) if inst else 0.0
    offer = row_json(a.offer, {})
    return {"number": a.number, "instance": a.instance_name, "instance_id": a.instance_id,
            "instance_state": inst.state if inst else None, "provider": a.provider, "offer": offer.get("line"),
            "offer_key": offer.get("key"),
            "price_hr": a.price_hr, "state": a.state, "start_epoch": a.start_epoch, "resumed_from": a.resumed_from,
            "reason": a.reason, "cost": round(spent, 6), "phases": row_json(a.phases, {}),
            "started_at": iso(a.started_at), "ended_at": iso(a.ended_at)}


def kind_of(job):
    """The job's kind, or None where its stored spec cannot be read (a shared ledger is input too:
    what cannot be read is shown as unknown, never a crash)."""
    try:
        return jobs.JobSpec.from_json(job.spec).kind_of()
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OrchError):
        return None


def job_dict(orch, job) -> dict:
    """A job as ``orch jobs --json`` shows it (keys are only ever added)."""
    from orchestrator.schedules import ledger_schedules
    from orchestrator.views.instances import iso

    attempts = orch.ledger.attempts(job.id)
    kind = kind_of(job)
    spent = jobs.cost(orch, job) if job.state in jobs.ACTIVE else job.cost_usd
    current = attempts[-1] if attempts else None
    run = orch.ledger.get_run(current.run_id) if current is not None and current.run_id else None
    return {"id": job.id, "name": job.name, "state": job.state, "reason": job.reason,
            "kind": kind.key if kind else None, "model": None, "data": None, "epochs": None,
            **(kind.view(orch, job, run) if kind else {}),
            "epoch": job.epoch, "checkpoint_epoch": job.checkpoint_epoch,
            "attempts": [attempt_dict(orch, a) for a in attempts],
            "instance": current.instance_name if current else None, "provider": current.provider if current else None,
            "cost": round(spent, 6), "max_cost": job.max_cost, "max_hours": job.max_hours, "retries": job.retries,
            "keep": job.keep, "weights": job.weights, "plan": row_json(job.plan, {}), "nodes": job.nodes,
            "phases": phases(job, attempts), "history": row_json(job.history, []),
            "schedule": ledger_schedules.of_jobs(orch.ledger, [job.id]).get(job.id),  # the schedule that started it
            "node_progress": node_progress(orch, job, current, kind),
            "created_at": iso(job.created_at), "updated_at": iso(job.updated_at), "ended_at": iso(job.ended_at)}


def node_progress(orch, job, attempt, kind) -> list[dict]:
    """Each node of a group attempt (rank order), as the ledger has it: its instance's state, its
    run's, a command's exit code, a training's epoch (rank 0 reports it for the group, whose ranks
    move in step), since when it has not answered. [] for one machine."""
    from orchestrator import states
    from orchestrator.instances import groups

    inst = orch.ledger.get(attempt.instance_id) if attempt is not None and attempt.instance_id else None
    if not groups.is_group(inst):
        return []
    out = []
    for node in groups.members(orch.ledger, inst):
        run = orch.ledger.latest_run(node.id)
        work = kind.node_view(job, run) if kind is not None else {"exit_code": None, "epoch": None}
        code = work["exit_code"]
        away = orch.ledger.recall(node.id, "unreachable_since")
        state = run.state if run is not None else None
        if code is not None:  # a node's exit is recorded on its run's args; only the head's row is read for its state
            state = "completed" if code == 0 else "failed"
        elif state in ("starting", "running") and node.state not in states.LIVE:
            state = "ended with its machine"  # a failed group's other nodes: their rows were never read again
        out.append({"rank": node.node_rank, "instance": node.name, "instance_state": node.state,
                    "run_state": state, "exit_code": code,
                    "epoch": work["epoch"],
                    "unreachable_since": away if isinstance(away, str) else None})
    return out


def _kind(d: dict):
    """The kind (its class: what it shows is read from the dict) of a job's dict, or None."""
    return KINDS.get(d.get("kind"))


def node_lines(d: dict) -> list[str]:
    """One line per node of a group job: what `orch jobs show` and `--wait` print."""
    lines, kind = [], _kind(d)
    for n in d.get("node_progress") or []:
        parts = [n["instance_state"]]
        if n["run_state"]:
            parts.append(f"{kind.noun if kind else 'training'} {n['run_state']}"
                         + (f" (exit {n['exit_code']})" if n["exit_code"] is not None else ""))
        if n["epoch"]:
            parts.append(f"epoch {n['epoch']}/{d.get('epochs') or '?'}")
        if n["unreachable_since"]:
            parts.append(f"not answering since {clean(n['unreachable_since'], 40)}")
        lines.append(f"  node {n['rank']}   {n['instance']}: " + ", ".join(parts))
    return lines


def progress_line(d: dict) -> str:
    """One line for --wait and the list: state, attempt, epoch, cost."""
    parts = [d["state"]]
    if d["attempts"]:
        a = d["attempts"][-1]
        parts.append(f"attempt {a['number']} on {a['provider']} ({a['instance']}, {a['state']})")
    parts += (_kind(d) or JobKind).wait_parts(d)  # its work: a command's state, a training's epoch
    if d.get("checkpoint_epoch"):
        parts.append(f"checkpoint {d['checkpoint_epoch']}")
    parts.append(f"${d['cost']:.4f}" + (f" of ${d['max_cost']:g}" if d.get("max_cost") is not None else ""))
    if d.get("reason") and d["state"] in jobs.ACTIVE:
        parts.append(clean(d["reason"], 160))
    return "  ".join(parts)


def follow(orch, job, interval: float = 5.0, say: Callable[[str], None] | None = None):
    """--wait: a look at once, then ever less often up to every ``interval`` seconds
    (``runs.pause``), a line whenever it changes, until the job ends."""
    from orchestrator.runs import runs

    say = say or orch.say
    last: list[str] = []
    looks = 0
    while True:
        job = jobs.advance(orch, job)
        d = job_dict(orch, job)
        lines = [progress_line(d), *node_lines(d)]  # a group: each node's progress on a line of its own
        if lines != last:
            for line in lines:
                if line not in last:
                    say(f"      {line}")
            last = lines
        if job.state in jobs.ENDED:
            return job
        looks += 1
        par.nap(runs.pause(looks, interval))
