"""Places that just preempted, avoided: a relaunch should not go straight back to the zone or host
whose spot market just took its machine (SkyPilot's users ask for it, skypilot-org/skypilot issue
10021; SkyPilot's managed jobs move to another region after a preemption).

Each preemption a job meets (its instance recorded ``preempted``, or ended on a spot interruption
notice) is a ``preemptions`` row: the provider, the place as the attempt's offer named it (a region,
a data center, a host: ``Offer.location``, else its id) and the GPU. For ``preempted_hours`` (6 by
default, config.toml) the planner ranks the offers of such a place (same provider, place and GPU)
after every other, or leaves them out under ``--avoid-preempted``, and the plan says so.
"""

from __future__ import annotations

from datetime import timedelta

from orchestrator.jobs import record
from orchestrator.text import row_json

HOURS = 6.0  # preempted_hours in config.toml


def hours() -> float:
    from orchestrator import config

    return float(config.get("preempted_hours", HOURS))


def place_of(offer) -> str:
    return str(offer.location or offer.offer_id)[:128]


def record_loss(orch, attempt, inst, why: str) -> None:
    """A preemption of ``attempt`` recorded where its plan says it ran."""
    offer = row_json(attempt.offer, {})
    place = offer.get("place") if isinstance(offer.get("place"), str) else None
    orch.ledger.add_preemption(provider=attempt.provider[:32], place=(place or "(not from an offer)")[:128],
                               gpu=(offer.get("gpu") if isinstance(offer.get("gpu"), str) else
                                    getattr(inst, "gpu_name", None) or None),
                               instance_name=attempt.instance_name[:64], reason=why[:2000])


def recent(orch) -> dict[tuple[str, str, str | None], float]:
    """{(provider, place, gpu): hours since its latest preemption} within ``preempted_hours``."""
    span = hours()
    if span <= 0:
        return {}
    now = record.now()
    out: dict[tuple[str, str, str | None], float] = {}
    for p in orch.ledger.preemptions(now - timedelta(hours=span)):
        out[(p.provider, p.place, p.gpu)] = (now - record.utc(p.at)).total_seconds() / 3600
    return out


def rank(orch, rows: list, leave_out: bool) -> tuple[list, str | None]:
    """``rows`` (ranked offers) with those of a recently preempted place after the others (or left
    out), and what the plan says of it (None: no offer was at such a place)."""
    seen = recent(orch)
    if not seen:
        return rows, None

    def when(row) -> float | None:
        o = row.offer
        for gpu in (o.gpu_name, None):
            if (o.provider, place_of(o), gpu) in seen:
                return seen[(o.provider, place_of(o), gpu)]
        return None

    hit = {id(r): when(r) for r in rows}
    bad = [r for r in rows if hit[id(r)] is not None]
    if not bad:
        return rows, None
    good = [r for r in rows if hit[id(r)] is None]
    places = sorted({f"{r.offer.provider} {place_of(r.offer)} ({hit[id(r)]:.1f} h ago)" for r in bad})
    what = "left out" if leave_out else "ranked last"
    return (good if leave_out else good + bad), (f"{what}, preempted within {hours():g} h: {', '.join(places)}")
