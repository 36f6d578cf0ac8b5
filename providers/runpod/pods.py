"""A pod in RunPod's REST API v2: the create body orch sends, what a pod is in orch's words, and
why one never starts (RunPod API v2 reference, "Create a pod", "Get a pod", the Pod schema)."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.provider import Endpoint, Remote, Request, Status, stopped_rate
from providers.runpod.offers import VOLUME_STOPPED_GB_MONTH

DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
DEFAULT_CPU_INSTANCE = "cpu3c-2-4"  # 2 vCPU, 4 GB: the smallest compute-optimised flavour
VOLUME_PATH = "/workspace"
MIN_PERSISTENT_GB = 10  # PersistentMount.size: "Upstream enforces a 10 GB floor" (v2 OpenAPI)
NOT_STARTED = "running, its container not started yet"
STARTING = "starting, its container not started yet"
# The pod fields orch keeps of an answer: ``env`` is left out on purpose (v2 returns it, and it holds
# the user's secrets; a Remote's ``raw`` may be written to the ledger).
SECRET_FIELDS = ("env",)
_CPU_FLAVOUR = re.compile(r"(cpu\d[a-z])(?:-(\d+)(?:-\d+)?)?")


def cpu_config(setting: str) -> dict:
    """v2's ``cpu {id, vcpuCount}`` from the ``cpu_instance`` setting: a flavour (``cpu3c``) with its
    vCPUs, in GraphQL days' spelling (``cpu3c-2-4``: the memory is now derived by RunPod from the
    flavour, CreatePodRequest). vcpuCount is at least 2 and a power of two (BaseCpuConfig)."""
    m = _CPU_FLAVOUR.fullmatch(setting.strip())
    vcpus = int(m[2] or 2) if m else 0
    if not m or vcpus < 2 or vcpus & (vcpus - 1):
        raise UsageError(f"[providers.runpod] cpu_instance must be a CPU flavour and its vCPUs such as "
                         f"\"cpu3c-2\" (vCPUs a power of two, at least 2), not {setting!r}")
    return {"id": m[1], "vcpuCount": vcpus}


def body(request: Request, label: str, public_key: str, *, image: str, container_gb: int,
         gpu_type: str | None = None, cloud: str = "SECURE", centers: list[str] | None = None,
         cpu_instance: str = DEFAULT_CPU_INSTANCE, cuda: list[str] | None = None,
         network: dict | None = None) -> dict[str, Any]:
    """``POST /v2/pods``'s body: a CPU pod (``request.cpu``) or a pod of ``gpu_type`` in ``cloud``,
    placed only in ``centers`` (``dataCenterIds`` is enforced: "Preferred data centers for placement"
    that the scheduler keeps to). ``network`` is a network volume's mount (``volumes.network_mount``),
    which replaces the volume disk. SSH: ``22/tcp`` published (``ssh.direct`` needs it) and
    ``startSsh``; our own ``PUBLIC_KEY`` in ``env`` wins over the account's keys ("unless the request
    already sets one")."""
    out: dict[str, Any] = {
        "name": label,
        "image": image,
        "env": {"PUBLIC_KEY": public_key.strip(), **{k: str(v) for k, v in request.env.items()}},
        "ports": ["22/tcp"],
        "startSsh": True,
        "disk": max(int(container_gb), 1),
    }
    if request.cpu:
        # CPU pods have no volume disk: "CPU pods support container disk and network volumes only;
        # ``mounts.persistent`` is invalid when ``cpu`` is set" (CreatePodRequest). The container disk
        # holds everything, and a stop clears it.
        out.update(cpu=cpu_config(cpu_instance), cloud="SECURE", disk=max(int(container_gb), int(request.disk_gb)))
    else:
        gpu: dict[str, Any] = {"id": gpu_type, "count": int(request.gpus)}
        if cuda:
            gpu["allowedCudaVersions"] = cuda
        out.update(gpu=gpu, cloud=cloud)
        out["mounts"] = {"persistent": {"size": max(int(request.disk_gb), MIN_PERSISTENT_GB), "path": VOLUME_PATH}}
    if network:
        out["mounts"] = {"network": [network]}
    if centers:
        out["dataCenterIds"] = list(centers)
    return out


def kept(pod: dict) -> dict:
    """A pod's answer without what must never reach the ledger."""
    return {k: v for k, v in pod.items() if k not in SECRET_FIELDS}


def remote(pod: dict, user: str) -> Remote:
    """A pod as orch sees it. PROVISIONING and STARTING are pending; RUNNING without ``ssh.direct``
    (its ``22/tcp`` not published yet) is a container not started yet, so pending too, and its detail
    says so; EXITED is stopped; ERROR ("an unrecoverable error state") is broken; TERMINATED gone."""
    status_word = str(pod.get("status") or "")
    direct = (pod.get("ssh") or {}).get("direct") if isinstance(pod.get("ssh"), dict) else None
    status = {"RUNNING": Status.RUNNING if direct else Status.PENDING, "EXITED": Status.STOPPED,
              "ERROR": Status.BROKEN, "TERMINATED": Status.GONE}.get(status_word, Status.PENDING)
    endpoint = None
    if status == Status.RUNNING and direct.get("host") and direct.get("port"):
        # ``ssh.direct.username`` is the image's login (root on RunPod's); orch logs in as its own.
        endpoint = Endpoint(str(direct["host"]), int(direct["port"]), user)
    gpu = pod.get("gpu") if isinstance(pod.get("gpu"), dict) else {}
    persistent = ((pod.get("mounts") or {}).get("persistent") or {}) if isinstance(pod.get("mounts"), dict) else {}
    cluster = pod.get("cluster") if isinstance(pod.get("cluster"), dict) else {}
    return Remote(
        provider_id=str(pod["id"]), label=str(pod.get("name") or ""), status=status, endpoint=endpoint,
        price_hr=pod.get("cost") if status != Status.STOPPED else None,
        stopped_price_hr=stopped_rate(int(persistent.get("size") or 0), VOLUME_STOPPED_GB_MONTH),
        gpu_name=gpu.get("name") or gpu.get("id"), gpus=int(gpu.get("count") or 0),
        detail=(NOT_STARTED if status_word == "RUNNING" and not direct else STARTING if status_word == "STARTING"
                else status_word.lower()),
        private_ip=cluster.get("ip") or None, raw=kept(pod),
    )


def never_started(remote: Remote, waited: float, limit: float) -> str | None:
    """Why a pod will never answer SSH: RunPod has shown it STARTING (or RUNNING without its SSH
    published) for ``limit`` seconds of the wait; None: keep waiting."""
    if remote.status != Status.PENDING or remote.raw.get("status") not in ("STARTING", "RUNNING") or waited < limit:
        return None
    return (f"RunPod pod {remote.provider_id} has not started its container within {_span(limit)} "
            f"(still {str(remote.raw.get('status')).lower()}, no SSH published): its host may have a driver older than the image's CUDA "
            f"(\"OCI runtime create failed\"); set [providers.runpod] min_cuda, or raise "
            f"container_start_minutes for a large image")


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def resume_refused(remote: Remote, why: Exception) -> str:
    """Why a stopped pod did not get its GPUs (or CPUs) back, and what is kept meanwhile."""
    gpus = remote.gpus
    disk = ((remote.raw.get("mounts") or {}).get("persistent") or {}).get("size") or 0
    kept = (f"Its volume disk ({disk} GB at {VOLUME_PATH}) is safe and kept "
            f"(${remote.stopped_price_hr or 0:.4f}/h while stopped)." if disk else
            "It has no volume disk (a CPU pod): it bills nothing while stopped.")
    return (f"RunPod could not give pod {remote.provider_id} its {'GPU(s)' if gpus else 'CPUs'} back ({why}). {kept} "
            "Try `orch start` again later, or `orch down` it and create a new one elsewhere.")
