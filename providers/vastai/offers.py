"""Vast.ai's marketplace: the offer search as typed filters, and its rows as orch's ``Offer``."""

from __future__ import annotations

import re
from typing import Any, Callable

from orchestrator.errors import UsageError
from orchestrator.provider import Offer, Request, bid_with_margin, stopped_rate
from providers.vastai.api import VastError

# Vast prices storage per month of 720 hours: Vast.ai's OpenAPI ``show_instance`` example has
# storage_cost × GB / 720 = dph_total − dph_base (orch's own month is 730 h).
VAST_HOURS_PER_MONTH = 720.0


def vast_gpu_name(name: str) -> str:
    """'NVIDIA GeForce RTX 4090', 'RTX_4090' or '4090' -> Vast's 'RTX 4090'."""
    n = " ".join(name.replace("_", " ").split())
    n = re.sub(r"^(nvidia\s+)?(geforce\s+)?", "", n, flags=re.I)
    if re.fullmatch(r"\d{3,4}(\s+ti)?", n, flags=re.I):
        n = ("GTX " if re.match(r"1\d{3}\b", n) else "RTX ") + n
    n = re.sub(r"^(rtx|gtx)\b", lambda m: m[1].upper(), n, flags=re.I)
    return re.sub(r"\bti$", "Ti", n, flags=re.I)


def search_arguments(request: Request, number: Callable[[str, float], float], cap: float | None) -> dict:
    """What ``search_offers`` is given for ``request``: the offer asked by hand, or orch's bars.
    ``number`` reads a numeric setting, ``cap`` is ``max_price_hr``."""
    storage = float(request.disk_gb)
    if request.offer:
        try:
            query = {"id": {"eq": int(request.offer)}, "rentable": {"eq": True}, "rented": {"eq": False}}
        except ValueError:
            raise UsageError(f"a Vast.ai offer id is a number, not {request.offer!r}") from None
        return dict(query=query, no_default=True, storage=storage)
    return dict(query=_query(request, number, cap), type="bid" if request.spot else "on-demand",
                order="dph_total", storage=storage)


def _query(request: Request, number: Callable[[str, float], float], cap: float | None) -> dict:
    """Filters as typed JSON: the SDK's query strings would send numbers as strings."""
    q: dict[str, Any] = {
        "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
        "rented": {"eq": False}, "num_gpus": {"eq": int(request.gpus)},
        "disk_space": {"gte": float(request.disk_gb)},
        "reliability": {"gte": number("min_reliability", 0.95)},
        "direct_port_count": {"gte": 1},
        "inet_down": {"gte": number("min_inet_down", 200)},
        "cuda_max_good": {"gte": number("min_cuda", 12.1)},
    }
    if request.gpu:
        q["gpu_name"] = {"eq": vast_gpu_name(request.gpu)}
    if cap is not None:
        q["min_bid" if request.spot else "dph_total"] = {"lte": float(cap)}
    return q


def listed(rows, request: Request) -> list[Offer]:
    """The search's answer as offers, cheapest first for the way it is rented (spot or not)."""
    if not isinstance(rows, list):
        raise VastError(f"Vast.ai offer search answered {type(rows).__name__}, not a list")
    found = [offer(row, float(request.disk_gb)) for row in rows]
    found.sort(key=lambda o: (o.spot_hr if request.spot else o.price_hr) or 0.0)
    return found


def offer(row: dict, disk_gb: float) -> Offer:
    per_gb = row.get("storage_cost")
    disk_hr = number(row.get("storage_total_cost"))
    if disk_hr is None:
        disk_hr = stopped_rate(disk_gb, per_gb or 0.0, VAST_HOURS_PER_MONTH)
    min_bid = row.get("min_bid")
    return Offer(
        provider="vastai", offer_id=str(row["id"]), gpu_name=row.get("gpu_name") or "?",
        gpus=int(row.get("num_gpus") or 0), vram_gb=round((row.get("gpu_ram") or 0) / 1024, 1),
        price_hr=row.get("dph_total"),
        # min_bid leaves the disk out; dph_total has it (for the allocated storage asked).
        spot_hr=round(min_bid + disk_hr, 6) if min_bid is not None else None,
        disk_gb_month=per_gb, reliability=row.get("reliability"), location=row.get("geolocation"),
        # Stopped, the disk alone bills, over Vast's 720-hour month.
        stopped_hr=round(disk_hr, 6),
        min_bid_per_gpu=float(min_bid) / max(int(row.get("num_gpus") or 1), 1) if min_bid is not None else None,
        raw=row,
    )


def bid(request: Request, offer: Offer, margin: float) -> float:
    """The whole machine's bid on ``offer``: ``--bid`` (per GPU) when given and not below the live
    minimum the listing showed, else that minimum plus ``margin``."""
    live = float(offer.raw["min_bid"])
    gpus = max(offer.gpus, 1)
    if request.bid is not None:
        # orch's --bid is per GPU on every provider; Vast's bid_price is for the whole machine.
        wanted = float(request.bid) * gpus
        if wanted < live:
            raise UsageError(f"bid {request.bid:.4f} $/h per GPU is below offer {offer.offer_id}'s live minimum "
                             f"{live / gpus:.4f} $/h per GPU: the instance would start outbid (stopped)")
        return wanted
    return round(bid_with_margin(live / gpus, margin) * gpus, 6)


def number(value) -> float | None:
    """A price or size Vast gave, when it is a finite non-negative number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None
