"""The list prices orch ships (``catalogue.json``), for a dry run that could ask no provider for
live offers because no key is set here: a first `orch run --dry-run` on a laptop still shows
what the task would cost. The file has its date and each price its public source; every price
shown says "list price, DATE, not live". A launch never rents from it: only a provider's live
offer is rented (``offers``, ``jobs.plan``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class Price:
    provider: str  # orch's name for it
    offer: str  # the provider's own name for the instance type
    gpu: str
    gpus: int
    vram_gb: float  # per GPU
    usd_hr: float  # on-demand, per instance-hour, disk not included
    source: str  # where the figure was read (a public URL)


@lru_cache(maxsize=1)
def load() -> tuple[str, tuple[Price, ...]]:
    """(the catalogue's date, its prices)."""
    data = json.loads(resources.files("orchestrator.money").joinpath("catalogue.json").read_text())
    return data["date"], tuple(Price(**p) for p in data["prices"])


def matching(gpu: str | None, count: int, min_vram: float | None = None,
             providers: list[str] | None = None, max_vram: float | None = None) -> list[Price]:
    """The listed instances with ``count`` GPUs of type ``gpu`` (any, when None; a family name
    matches its variants, as ``--gpu`` does), at least ``min_vram`` GB each (at most ``max_vram``),
    cheapest first."""
    from orchestrator import gpus

    _, prices = load()
    rows = [p for p in prices if p.gpus == count and (gpu is None or gpus.matches(gpu, p.gpu))
            and (min_vram is None or p.vram_gb >= min_vram) and (max_vram is None or p.vram_gb <= max_vram)
            and (providers is None or p.provider in providers)]
    return sorted(rows, key=lambda p: p.usd_hr)


def label(date: str) -> str:
    """How every catalogue price is marked wherever it is shown."""
    return f"list price, {date}, not live"
