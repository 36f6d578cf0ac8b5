"""A pod: the fields orch reads of it, what it is in orch's words, and the mutations that make,
stop, resume and end one."""

from __future__ import annotations

from typing import Any

from orchestrator.provider import Endpoint, Remote, Request, Status, stopped_rate
from providers.runpod.api import GraphQLEnum, literal
from providers.runpod.offers import VOLUME_STOPPED_GB_MONTH

DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
DEFAULT_CPU_INSTANCE = "cpu3c-2-4"  # 2 vCPU, 4 GB: the smallest compute-optimised flavour
VOLUME_PATH = "/workspace"
NOT_STARTED = "running, its container not started yet"

# The pod fields orch reads. ``env`` is left out on purpose: it holds the user's secrets, and a
# Remote's ``raw`` may be written to the ledger.
POD_FIELDS = (
    "id name desiredStatus podType costPerHr gpuCount vcpuCount memoryInGb containerDiskInGb "
    "volumeInGb volumeMountPath imageName ports uptimeSeconds machineId lastStatusChange "
    "runtime { ports { ip isIpPublic privatePort publicPort type } } machine { gpuDisplayName }"
)
LISTING = f"query {{ myself {{ pods {{ {POD_FIELDS} }} }} }}"


def lookup(provider_id: str) -> str:
    return f"query {{ pod(input: {{podId: {literal(provider_id)}}}) {{ {POD_FIELDS} }} }}"


def stop(provider_id: str) -> str:
    return f"mutation {{ podStop(input: {{podId: {literal(provider_id)}}}) {{ id desiredStatus }} }}"


def resume(provider_id: str, gpus: int) -> str:
    return (f"mutation {{ podResume(input: {{podId: {literal(provider_id)}, gpuCount: {gpus}}}) "
            f"{{ id desiredStatus }} }}")


def terminate(provider_id: str) -> str:
    return f"mutation {{ podTerminate(input: {{podId: {literal(provider_id)}}}) }}"


def deploy(request: Request, label: str, public_key: str, *, image: str, container_gb: int,
           gpu_type: str | None = None, cloud_type: str = "ALL", cpu_instance: str = DEFAULT_CPU_INSTANCE,
           cuda: list[str] | None = None, attach: dict[str, Any] | None = None) -> tuple[str, str]:
    """(the create mutation, its field): a CPU pod (``request.cpu``) or a pod of ``gpu_type``;
    ``attach`` is a network volume's fields (``volumes.deploy_fields``), which replaces the volume disk."""
    env = {"PUBLIC_KEY": public_key.strip(), **request.env}
    fields: dict[str, Any] = {
        "name": label,
        "imageName": image,
        "ports": "22/tcp",
        "startSsh": True,
        "env": [{"key": k, "value": str(v)} for k, v in env.items()],
    }
    if request.cpu:
        # CPU pods have no volume disk: "CPU pods support container disk and network volumes only;
        # ``mounts.persistent`` is invalid when ``cpu`` is set" (REST API v2 OpenAPI, CreatePodRequest;
        # PersistentMount: "Disallowed on CPU pods"), and ``deployCpuPodInput`` has no ``volumeInGb``.
        # The container disk holds everything, and a stop clears it.
        fields.update(instanceId=cpu_instance, cloudType=GraphQLEnum("SECURE"),
                      containerDiskInGb=max(container_gb, int(request.disk_gb)))
        mutation = "deployCpuPod"
    else:
        fields.update(gpuTypeId=gpu_type, gpuCount=int(request.gpus), cloudType=GraphQLEnum(cloud_type.upper()),
                      supportPublicIp=True, volumeInGb=int(request.disk_gb),
                      volumeMountPath=VOLUME_PATH, containerDiskInGb=container_gb)
        if cuda:
            fields["allowedCudaVersions"] = cuda
        mutation = "podFindAndDeployOnDemand"
    if attach:
        fields.pop("volumeInGb", None)
        fields.update(attach)
    return (f"mutation {{ {mutation}(input: {literal(fields)}) {{ id name desiredStatus "
            f"imageName machineId costPerHr gpuCount volumeInGb }} }}", mutation)


def remote(pod: dict, user: str) -> Remote:
    """A pod as orch sees it. RUNNING with ``runtime`` null is a container not started (yet, or
    ever: ``RunPodProvider.never_answers``), so pending, and its detail says so."""
    desired, runtime = pod.get("desiredStatus"), pod.get("runtime")
    status = {"RUNNING": Status.RUNNING if runtime else Status.PENDING, "EXITED": Status.STOPPED,
              "TERMINATED": Status.GONE}.get(desired, Status.PENDING)
    endpoint = None
    if status == Status.RUNNING:
        for port in (runtime or {}).get("ports") or []:
            # The SDK's own helper forgets isIpPublic: the private entry is unreachable.
            if port.get("privatePort") == 22 and port.get("isIpPublic") and port.get("ip"):
                endpoint = Endpoint(port["ip"], int(port["publicPort"]), user)
                break
    return Remote(
        provider_id=pod["id"], label=pod.get("name") or "", status=status, endpoint=endpoint,
        price_hr=pod.get("costPerHr"),
        stopped_price_hr=stopped_rate(pod.get("volumeInGb") or 0, VOLUME_STOPPED_GB_MONTH),
        gpu_name=(pod.get("machine") or {}).get("gpuDisplayName"), gpus=pod.get("gpuCount") or 0,
        detail=NOT_STARTED if desired == "RUNNING" and not runtime else str(desired or "").lower(), raw=pod,
    )


def never_started(remote: Remote, waited: float, limit: float) -> str | None:
    """Why a pod will never answer SSH: RunPod has shown it RUNNING for ``limit`` seconds of the
    wait and its container has not started (``runtime`` still null); None: keep waiting."""
    if remote.status != Status.PENDING or remote.raw.get("desiredStatus") != "RUNNING" or waited < limit:
        return None
    return (f"RunPod pod {remote.provider_id} has not started its container within {_span(limit)} "
            f"(runtime still null): its host may have a driver older than the image's CUDA "
            f"(\"OCI runtime create failed\"); set [providers.runpod] min_cuda, or raise "
            f"container_start_minutes for a large image")


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def resume_refused(remote: Remote, why: Exception) -> str:
    """Why a stopped pod did not get its GPUs (or CPUs) back, and what is kept meanwhile."""
    gpus = int(remote.raw.get("gpuCount") or 0)
    disk = remote.raw.get("volumeInGb") or 0
    kept = (f"Its volume disk ({disk} GB at {VOLUME_PATH}) is safe and kept "
            f"(${remote.stopped_price_hr or 0:.4f}/h while stopped)." if disk else
            "It has no volume disk (a CPU pod): it bills nothing while stopped.")
    return (f"RunPod could not give pod {remote.provider_id} its {'GPU(s)' if gpus else 'CPUs'} back ({why}). {kept} "
            "Try `orch start` again later, or `orch down` it and create a new one elsewhere.")
