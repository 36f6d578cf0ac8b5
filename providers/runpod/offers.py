"""RunPod's GPU types from its v2 catalog: their names, their live prices per cloud, where they are in
stock now, and the CUDA versions a pod may be placed on.

The catalog (``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=C``, RunPod
API v2 reference, "List GPU types") gives each type's list price per GPU for both clouds
(``price.secure``, ``price.community``), and, for the cloud and GPU count asked, its overall
``availability`` (NONE, LOW, MEDIUM, HIGH) and ``dataCenters`` (each with its own availability;
omitted when the configuration is unavailable everywhere). ``cloud`` defaults to SECURE upstream,
so each cloud is asked once. An offer is one type in one cloud, with the data centers that have it
in stock: a type in stock nowhere is not offered (``out_of_stock`` says so), and a create goes only
to the data centers its offer lists (``compute.RunPodProvider._placement``)."""

from __future__ import annotations

import re

from orchestrator.errors import UsageError
from orchestrator.provider import Offer

# The volume disk's $/GB-month, running and stopped: kept at a stop, it bills twice as much while
# stopped (RunPod docs, "Storage options", docs.runpod.io/pods/storage/types).
VOLUME_RUNNING_GB_MONTH = 0.10
VOLUME_STOPPED_GB_MONTH = 0.20

CLOUDS = ("COMMUNITY", "SECURE")  # the order a tie in price is broken: community first, as it is cheaper

# The CUDA versions a host may report, as allowedCudaVersions spells them. Matching is exact (a
# version no host reports matches nothing: RunPod's REST API v2 OpenAPI,
# ``CreateGpuConfig.allowedCudaVersions``), so the list names every version from the minimum on and
# runs ahead of today's drivers; a host newer than its end is left out, which costs capacity, never
# a dead pod.
CUDA_VERSIONS = [(11, 8)] + [(12, m) for m in range(10)] + [(13, m) for m in range(10)]
# The CUDA an image needs, from its tag: RunPod's "...-cuda12.4.1-..." and "...-cu1281-...",
# nvidia/cuda's "cuda:12.4.1-...". (The container runtime checks the image's NVIDIA_REQUIRE_CUDA,
# "cuda>=12.4", against the driver: that check is what fails with "OCI runtime create failed".)
_IMAGE_CUDA = re.compile(r"(?:^|[^a-z0-9])(?:cuda[-_:]?|cu)(\d{2})\.?(\d)")
CUDA_SETTING = re.compile(r"(\d{1,2})\.(\d{1,2})")


def image_cuda(image: str) -> tuple[int, int] | None:
    """(major, minor) of the CUDA an image is built on, from its tag; None when the tag says nothing."""
    m = _IMAGE_CUDA.search(image.lower())
    return (int(m[1]), int(m[2])) if m else None


def allowed_cuda(minimum: tuple[int, int]) -> list[str]:
    return [f"{major}.{minor}" for major, minor in CUDA_VERSIONS if (major, minor) >= minimum]


# Every GPU create sends ``gpu.allowedCudaVersions`` (RunPod API v2 reference, CreateGpuConfig; dstack
# sends a minimum CUDA on every create): the versions at or above the image's CUDA, read from its tag (setting ``min_cuda``
# overrides), so that no pod lands on a host whose driver cannot start it (``RunPodProvider.never_answers``).
def cuda_for(image: str, min_cuda: str = "") -> list[str] | None:
    """allowedCudaVersions for ``image``: every version from the one it needs (``min_cuda``, the
    setting, else its tag); None when neither says (then RunPod may place it anywhere)."""
    m = CUDA_SETTING.fullmatch(min_cuda.strip())
    minimum = (int(m[1]), int(m[2])) if m else image_cuda(image)
    return allowed_cuda(minimum) if minimum else None


def type_name(t: dict) -> str:
    """A catalog type's display name (v2 ``name``; GraphQL days' ``displayName``)."""
    return str(t.get("name") or t.get("displayName") or t.get("id") or "")


def resolve_gpu(wanted: str, types: list[dict]) -> dict:
    """A GPU type by id or display name (any case); a fragment such as '4090' only if unique."""
    w = wanted.strip().lower()
    for t in types:
        if w in (str(t.get("id", "")).lower(), type_name(t).lower()):
            return t
    near = list({t.get("id"): t for t in types
                 if w in str(t.get("id", "")).lower() or w in type_name(t).lower()}.values())  # a type in each cloud once
    if len(near) == 1:
        return near[0]
    if near:
        names = ", ".join(sorted(type_name(t) for t in near))
        raise UsageError(f"GPU {wanted!r} is ambiguous on RunPod: {names}")
    raise UsageError(f"RunPod has no GPU type {wanted!r} (see `orch offers --provider runpod`)")


def catalog_query(product: str, gpus: int, cloud: str) -> dict:
    """The query of ``GET /v2/catalog/gpus`` for stock and prices of ``gpus`` GPUs of a type in
    ``cloud``, for a pod (``product`` POD) or a cluster's pods (CLUSTER). ``include`` needs ``product``."""
    return {"include": "AVAILABILITY", "product": product, "count": max(int(gpus), 1), "cloud": cloud}


def stocked_centers(t: dict) -> list[str]:
    """The data centers where the catalog shows ``t`` in stock now (for the count and cloud asked)."""
    if str(t.get("availability") or "NONE").upper() == "NONE":
        return []
    return [str(c["id"]) for c in t.get("dataCenters") or []
            if isinstance(c, dict) and c.get("id") and str(c.get("availability") or "NONE").upper() != "NONE"]


def max_count(t: dict, cloud: str) -> int:
    m = t.get("maxCount")
    return int((m.get(cloud.lower()) if isinstance(m, dict) else m) or 0)


def offer_of(t: dict, cloud: str, gpus: int, provider: str = "runpod", cluster: bool = False) -> Offer | None:
    """The offer of type ``t`` (a catalog row asked for ``cloud``) for ``gpus`` GPUs: priced at that
    cloud's rate, with the data centers that have it in stock. None when the cloud does not offer the
    type at that count or lists no price for it. Out of stock everywhere: an offer with no price and
    ``stock`` "none" (never ranked: ``out_of_stock`` tells why)."""
    per_gpu = (t.get("price") or {}).get(cloud.lower())
    if not t.get(cloud.lower(), True) or not per_gpu or max_count(t, cloud) < gpus:
        return None
    centers = stocked_centers(t)
    return Offer(
        provider=provider, offer_id=str(t["id"]), gpu_name=type_name(t), gpus=gpus,
        vram_gb=float(t.get("memory") or t.get("memoryInGb") or 0), price_hr=per_gpu * gpus if centers else None,
        disk_gb_month=VOLUME_RUNNING_GB_MONTH, disk_gb_month_stopped=VOLUME_STOPPED_GB_MONTH,
        location=f"{cloud.lower()}: {', '.join(centers)}" if centers else None,
        stock=str(t.get("availability") or "NONE").lower() if centers else "none", disk_included=False,
        note=None if centers else ("offered as an Instant Cluster in no data center now" if cluster else
                                   f"out of stock in every {cloud.lower()} data center"),
        raw={"cloud": cloud, "dataCenters": centers, "maxCount": t.get("maxCount"),
             **({"product": "CLUSTER"} if cluster else {})},
    )


def offers_from(by_cloud: dict[str, list[dict]], gpus: int, provider: str = "runpod", cluster: bool = False) -> list[Offer]:
    """Every type's offer in each cloud (``by_cloud``: the catalog's answer per cloud), cheapest
    first. No spot prices: RunPod has no spot pods any more (``RunPodProvider.capabilities``)."""
    offers = [o for cloud in CLOUDS for t in by_cloud.get(cloud) or [] if isinstance(t, dict) and t.get("id")
              for o in [offer_of(t, cloud, gpus, provider, cluster)] if o is not None]
    return sorted(offers, key=lambda o: (o.price_hr is None, o.price_hr or 0.0))


def in_stock(offers: list[Offer]) -> list[Offer]:
    return [o for o in offers if o.price_hr is not None and o.raw.get("dataCenters")]


def out_of_stock(offers: list[Offer]) -> str:
    """Why none of ``offers`` (one type's, every cloud) can be rented now, in the catalog's words."""
    return "; ".join(f"out of stock in every {o.raw.get('cloud', '').lower()} data center" for o in offers) or \
        "not offered in either cloud"
