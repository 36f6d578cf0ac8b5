"""Lambda's instance types as orch's offers (``GET /instance-types``): a type with capacity in some
region is one offer, priced from its ``price_cents_per_hour`` (Lambda's list price, asked live). Its
regions with capacity ride in ``raw["regions"]``: what a launch tries, in order, and what a plan's
quote carries to the create."""

from __future__ import annotations

import re
from typing import Any

from orchestrator import gpus as gpu_names
from orchestrator.provider import Offer, Request
from providers.lambda_cloud.api import LambdaError, Session


def gpu_from_description(description: str) -> tuple[str, float]:
    """('H100 SXM5', 80.0) from Lambda's 'H100 (80 GB SXM5)': the name orch's GPU table knows, and
    the memory per GPU. The form factor is kept only where it names a different part."""
    m = re.fullmatch(r"\s*(?P<name>[^()]+?)\s*(\((?P<detail>[^)]*)\))?\s*", description or "")
    if not m:
        return (description or "?").strip() or "?", 0.0
    name, detail = m["name"], m["detail"] or ""
    mem = re.search(r"(\d+(?:\.\d+)?)\s*GB", detail, re.I)
    vram = float(mem[1]) if mem else 0.0
    form = re.sub(r"\d+(?:\.\d+)?\s*GB", "", detail, flags=re.I).strip()
    for candidate in (f"{name} {form}".strip(), name, f"RTX {name}"):
        if gpu_names.lookup(candidate):
            return candidate, vram
    return name, vram


def instance_types(api: Session) -> dict[str, dict]:
    types = api.call("GET", "/instance-types")
    if not isinstance(types, dict):
        raise LambdaError(f"Lambda Cloud's instance types came back as {type(types).__name__}, not a map")
    return types


def offer_from(name: str, item: Any) -> Offer | None:
    """The offer of one instance type; None where it is no GPU type or has no capacity anywhere now."""
    if not isinstance(item, dict) or not isinstance(item.get("instance_type"), dict):
        return None
    itype = item["instance_type"]
    specs = itype.get("specs") if isinstance(itype.get("specs"), dict) else {}
    count, cents = specs.get("gpus"), itype.get("price_cents_per_hour")
    if not isinstance(count, int) or count < 1 or not isinstance(cents, (int, float)):
        return None
    regions = [r.get("name") for r in item.get("regions_with_capacity_available") or [] if isinstance(r, dict)]
    regions = [r for r in regions if isinstance(r, str) and r]
    if not regions:
        return None  # no capacity anywhere now: nothing to rent
    gpu, vram = gpu_from_description(str(itype.get("gpu_description") or ""))
    return Offer(
        provider="lambda", offer_id=name, gpu_name=gpu, gpus=count, vram_gb=vram, price_hr=cents / 100,
        location=", ".join(regions), stock=f"capacity in {len(regions)} region{'s' if len(regions) > 1 else ''}",
        # The instance's local disk comes with the price (specs.storage_gib); nothing is kept after a
        # terminate, and there is no stopped state to bill.
        disk_gb_month=None, disk_included=True,
        note=f"Lambda's list price (instance-types price_cents_per_hour), asked live; {specs.get('storage_gib')} GiB "
             "of local disk included",
        raw={"regions": regions, "description": itype.get("description"), "specs": specs},
    )


def matching(types: dict[str, Any], request: Request) -> list[Offer]:
    """The offers among ``types`` that ``request`` asks for, cheapest first."""
    found = []
    for name, item in types.items():
        offer = offer_from(name, item)
        if offer is None or offer.gpus != int(request.gpus):
            continue
        if request.gpu and not gpu_names.matches(request.gpu, offer.gpu_name):
            continue
        if request.offer and request.offer != name:
            continue
        found.append(offer)
    found.sort(key=lambda o: o.price_hr or 0.0)
    return found


def wanted(request: Request) -> str:
    """What ``request`` asks for, in a refusal: an instance type, or a count of GPUs."""
    named = request.offer or (request.quote.offer_id if request.quote is not None else None)
    return f"instance type {named}" if named else f"{request.gpus}x {request.gpu}"


def asked(request: Request) -> str:
    """'1x A10' (or '1x gpu_1x_a10'): what the launch asked for, in a refusal."""
    named = request.gpu or request.offer or (request.quote.offer_id if request.quote is not None else None)
    return f"{request.gpus}x {named}"
