"""RunPod's GPU types: their names, their live prices, and the CUDA versions a pod may be placed on."""

from __future__ import annotations

import re

from orchestrator.errors import UsageError
from orchestrator.provider import Offer

# The volume disk's $/GB-month, running and stopped: kept at a stop, it bills twice as much while
# stopped (RunPod docs, "Storage options", docs.runpod.io/pods/storage/types).
VOLUME_RUNNING_GB_MONTH = 0.10
VOLUME_STOPPED_GB_MONTH = 0.20

GPU_NAMES = "query GpuTypes { gpuTypes { id displayName memoryInGb } }"

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


# Every GPU create sends ``allowedCudaVersions`` (RunPod docs, GraphQL "Manage Pods",
# docs.runpod.io/sdks/graphql/manage-pods, "Filter by CUDA version"; dstack sends a minimum CUDA on
# every create): the versions at or above the image's CUDA, read from its tag (setting ``min_cuda``
# overrides), so that no pod lands on a host whose driver cannot start it (``RunPodProvider.never_answers``).
def cuda_for(image: str, min_cuda: str = "") -> list[str] | None:
    """allowedCudaVersions for ``image``: every version from the one it needs (``min_cuda``, the
    setting, else its tag); None when neither says (then RunPod may place it anywhere)."""
    m = CUDA_SETTING.fullmatch(min_cuda.strip())
    minimum = (int(m[1]), int(m[2])) if m else image_cuda(image)
    return allowed_cuda(minimum) if minimum else None


def resolve_gpu(wanted: str, types: list[dict]) -> dict:
    """A GPU type by id or display name (any case); a fragment such as '4090' only if unique."""
    w = wanted.strip().lower()
    for t in types:
        if w in (str(t.get("id", "")).lower(), str(t.get("displayName", "")).lower()):
            return t
    near = [t for t in types if w in str(t.get("id", "")).lower() or w in str(t.get("displayName", "")).lower()]
    if len(near) == 1:
        return near[0]
    if near:
        names = ", ".join(sorted(t["displayName"] for t in near))
        raise UsageError(f"GPU {wanted!r} is ambiguous on RunPod: {names}")
    raise UsageError(f"RunPod has no GPU type {wanted!r} (see `orch offers --provider runpod`)")


def prices_query(gpus: int) -> str:
    """Every GPU type with its live on-demand price for ``gpus`` GPUs, in one query."""
    return (f"query GpuTypes {{ gpuTypes {{ id displayName memoryInGb maxGpuCount securePrice "
            f"communityPrice lowestPrice(input: {{gpuCount: {gpus}}}) {{ uninterruptablePrice stockStatus }} }} }}")


def offers_from(types: list[dict], gpus: int, provider: str = "runpod") -> list[Offer]:
    """The offers among ``types`` (a ``prices_query`` answer) for ``gpus`` GPUs. Out of stock
    (``stockStatus`` null) is left out, as gpuhunt does (dstackai/gpuhunt, src/gpuhunt/providers/runpod.py
    ``_make_offers``). No spot prices: RunPod has no spot pods any more (``RunPodProvider.capabilities``)."""
    offers = []
    for t in types:
        if (t.get("maxGpuCount") or gpus) < gpus:
            continue
        low = t.get("lowestPrice") or {}
        if low.get("stockStatus") is None:
            continue
        listed = [p for p in (t.get("communityPrice"), t.get("securePrice")) if p]
        per_gpu = low.get("uninterruptablePrice") or (min(listed) if listed else None)
        if not per_gpu:
            continue
        offers.append(Offer(
            provider=provider, offer_id=t["id"], gpu_name=t.get("displayName") or t["id"], gpus=gpus,
            vram_gb=float(t.get("memoryInGb") or 0), price_hr=per_gpu * gpus, disk_gb_month=VOLUME_RUNNING_GB_MONTH,
            disk_gb_month_stopped=VOLUME_STOPPED_GB_MONTH, stock=low.get("stockStatus"), disk_included=False,
            raw=t,
        ))
    return offers
