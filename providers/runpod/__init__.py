"""RunPod GPU and CPU pods and network volumes, through RunPod's REST API v2.

Settings (``[providers.runpod]`` in config.toml) a user may want: ``api_key`` (else ``RUNPOD_API_KEY``),
``min_cuda`` (the CUDA a GPU pod's host must have; default: the image tag's), ``container_start_minutes``
(5: how long a container may take to start), ``create_lookup_seconds`` (60: how long a failed
create's pod is looked for), ``cpu_instance`` (``cpu3c-2``: a CPU pod's flavour and vCPUs).

``compute`` holds the verbs, ``api`` the v2 session and its errors, ``offers`` the catalog (GPU types,
prices per cloud, stock per data center) and the CUDA filter, ``pods`` a pod's create body and what a
pod is in orch's words, ``volumes`` network volumes, ``self_stop`` what a pod runs to end itself.
"""

from orchestrator.hookspecs import hookimpl
from providers.runpod.api import MaybeMade, Rest
from providers.runpod.compute import CONTAINER_START_MINUTES, CREATE_LOOKUP_SECONDS, RunPodProvider
from providers.runpod.offers import (CUDA_VERSIONS, VOLUME_RUNNING_GB_MONTH, VOLUME_STOPPED_GB_MONTH, allowed_cuda,
                                     cuda_for, image_cuda, offers_from, resolve_gpu)
from providers.runpod.pods import DEFAULT_CPU_INSTANCE, DEFAULT_IMAGE, VOLUME_PATH
from providers.runpod.self_stop import self_stop_command

__all__ = ["RunPodProvider", "register_providers", "Rest", "MaybeMade",
           "CONTAINER_START_MINUTES", "CREATE_LOOKUP_SECONDS", "CUDA_VERSIONS", "VOLUME_RUNNING_GB_MONTH",
           "VOLUME_STOPPED_GB_MONTH", "allowed_cuda", "cuda_for", "image_cuda", "offers_from", "resolve_gpu",
           "DEFAULT_CPU_INSTANCE", "DEFAULT_IMAGE", "VOLUME_PATH", "self_stop_command"]


@hookimpl
def register_providers(register):
    register(RunPodProvider)
