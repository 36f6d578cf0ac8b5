"""Where an attempt runs: the offer cheapest per job (per hour for a kind that counts no epochs)
among live offers, asked once per launch, or the provider named for a CPU job or a hand-picked
offer. The plan carries the offer it chose (``Request.quote``), so the create rents what was
recorded without listing the provider's offers again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.errors import NoCapacity, UsageError
from orchestrator.provider import Request


@dataclass
class Choice:
    """Where one attempt runs and what it is expected to cost."""

    provider: str
    request: Request
    line: str
    key: str | None = None  # provider/offer id, to leave out after a launch there failed
    price_hr: float | None = None
    hours: float | None = None  # for the work left
    usd: float | None = None
    answer: Any = None  # the ranked offers it was chosen from (``offers.Answer``), for a dry run's table
    place: str | None = None  # where the offer is (``avoid.place_of``): a preemption there is recorded so
    gpu: str | None = None

    def to_dict(self) -> dict:
        return {"provider": self.provider, "offer": self.key, "line": self.line, "price_hr": self.price_hr,
                "hours": None if self.hours is None else round(self.hours, 4),
                "usd": None if self.usd is None else round(self.usd, 6), "gpu": self.request.gpu,
                "gpus": self.request.gpus, "cpu": self.request.cpu, "spot": self.request.spot}


def plan(orch, js, done: int | None = None, avoid: set[str] | None = None, fresh: bool = True) -> Choice:
    """The attempt's offer, from one live listing of each provider asked (the job's copy of epoch
    ``done`` leaves that much less to do); offers in ``avoid`` (a launch there failed) are skipped.
    ``fresh=False``: a listing orch's offers cache still holds is read again instead (a question
    about a plan just made, never a plan to rent)."""
    from orchestrator import config
    from orchestrator.money import offers
    from orchestrator.provider import plugins
    from orchestrator.volumes import volume_mounts

    kind = js.kind_of()
    # Its volumes (if any) say which provider rents, and only offers where they live are ranked.
    req, providers, placed = volume_mounts.narrow(orch, js.request, js.volumes, js.nodes, js.providers)
    if req.cpu or req.offer:
        provider = (providers or [None])[0] or plugins.default_provider()
        what = "a CPU-only instance" if req.cpu else f"offer {req.offer}"
        if js.nodes > 1:
            what = f"a group of {js.nodes} x {what}"
        price = known_price(provider, req)
        if price is None:
            return Choice(provider, req, f"{provider}, {what} (given, nothing to rank: its $/hr is known once rented)"
                          + (f"; {placed}" if placed else ""))
        price *= max(js.nodes, 1)
        if js.max_price is not None and price > js.max_price:
            raise NoCapacity(f"{provider}, {what}: ${price:.4f}/hr is over --max-price ${js.max_price:g}/hr")
        return Choice(provider, req, f"{provider}, {what} at ${price:.4f}/hr (given, nothing to rank)"
                      + (f"; {placed}" if placed else ""), price_hr=price)
    mode = "spot" if req.spot else "on-demand"
    work = kind.workload(js)  # None: ranked per hour
    query = offers.Query(gpu=req.gpu, gpus=req.gpus, mode=mode, disk_gb=req.disk_gb, providers=providers,
                         max_price=js.max_price, volumes=volume_mounts.volumes_of(req), min_vram=js.min_vram,
                         max_vram=js.max_vram, nodes=js.nodes)
    answer = offers.search(orch, query, work, fresh=fresh)
    for name, error in answer.errors:
        orch.say(f"      {name} not compared: {error}")
    for name, why in answer.skipped:
        orch.say(f"      {name} not asked: {why}")
    rows = [r for r in answer.rows if f"{r.offer.provider}/{r.offer.offer_id}" not in (avoid or set())]
    from orchestrator.jobs import avoid as places

    rows, preempted = places.rank(orch, rows, js.avoid_preempted)  # a place that just preempted: last
    if js.nodes > 1:  # the group's prices (N machines) and its assumed speedup, stated in the line
        rows = offers.for_nodes(rows, js.nodes, offers.check_scaling(config.get("node_scaling",
                                                                                offers.NODE_EFFICIENCY)))
    if not rows:
        raise NoCapacity(f"no {mode} offer for {req.gpus}x {req.gpu or 'any GPU'} from "
                         f"{', '.join(answer.asked) or 'any provider'}"
                         + (f" {placed}" if placed else "")
                         + "".join(dict.fromkeys(f"; {n}: {g} {w}" for n, g, w in answer.out_of_stock))
                         + (" (besides those that failed for this job)" if answer.rows else "")
                         + (f"; {preempted}" if preempted else "")
                         + (f"; not asked: {', '.join(n for n, _ in answer.skipped)} (`orch check` says what each "
                            "needs)" if answer.skipped else ""))
    best = rows[0]
    spot = mode == "spot"
    chosen = offers.renting(req, best)
    bid = chosen.bid
    price = best.spot_hr if spot else best.price_hr
    total, left = kind.left(None), kind.left(done)
    hours = best.hours * left / total if best.hours is not None and total else None
    usd = hours * price if hours is not None and price is not None else None
    line = offers.describe(best, mode) + (f", bid {bid:.3f}" if spot and bid else "")
    line += f"; {placed}" if placed else ""
    if js.nodes > 1:
        line = f"{js.nodes} nodes of: {line}"
    if total and left != total and usd is not None:
        line += f"; the {left} epochs left ~{hours:.2f} h, ${usd:.2f}"
    if preempted:
        line += f"; {preempted}"
    return Choice(best.offer.provider, chosen, line, f"{best.offer.provider}/{best.offer.offer_id}", price, hours,
                  usd, answer, places.place_of(best.offer), best.offer.gpu_name)


def known_price(provider: str, req: Request) -> float | None:
    """One machine's $/hr for ``req`` (a CPU-only instance, a hand-picked offer) at ``provider`` where
    it is known before renting (the local provider's configured price); None: known once rented."""
    from orchestrator import config
    from orchestrator.provider import plugins

    return plugins.provider_class(provider)(config.provider_settings(provider)).known_price_hr(req)


def check_plan(choice: Choice, max_cost: float | None, spent: float = 0.0) -> None:
    """Refuse a plan whose estimate, with what was spent, is over --max-cost (exit 2: nothing rented)."""
    if max_cost is None or choice.usd is None:
        return
    if spent + choice.usd > max_cost:
        raise UsageError(f"the plan is estimated at ${choice.usd:.4f}" + (f" (after ${spent:.4f} spent)" if spent else "")
                         + f", over --max-cost ${max_cost:g}: {choice.line}")
