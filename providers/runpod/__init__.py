"""RunPod GPU and CPU pods, through the runpod SDK's GraphQL call, with every query written here.

Settings (``[providers.runpod]`` in config.toml) a user may want: ``api_key`` (else ``RUNPOD_API_KEY``),
``min_cuda`` (the CUDA a GPU pod's host must have; default: the image tag's), ``container_start_minutes``
(5: how long a container may take to start), ``create_lookup_seconds`` (60: how long a failed
create's pod is looked for).

``compute`` holds the verbs, ``api`` the GraphQL session and its errors, ``offers`` the GPU types,
their prices and the CUDA filter, ``pods`` a pod's fields and mutations, ``self_stop`` what a pod
runs to end itself.
"""

from orchestrator.hookspecs import hookimpl
from providers.runpod.api import GraphQL, GraphQLEnum, MaybeMade, _sdk, literal
from providers.runpod.compute import CONTAINER_START_MINUTES, CREATE_LOOKUP_SECONDS, RunPodProvider
from providers.runpod.offers import (CUDA_VERSIONS, VOLUME_RUNNING_GB_MONTH, VOLUME_STOPPED_GB_MONTH, allowed_cuda,
                                     cuda_for, image_cuda, offers_from, resolve_gpu)
from providers.runpod.pods import DEFAULT_CPU_INSTANCE, DEFAULT_IMAGE, POD_FIELDS, VOLUME_PATH
from providers.runpod.self_stop import self_stop_command

__all__ = ["RunPodProvider", "register_providers", "GraphQL", "GraphQLEnum", "MaybeMade", "_sdk", "literal",
           "CONTAINER_START_MINUTES", "CREATE_LOOKUP_SECONDS", "CUDA_VERSIONS", "VOLUME_RUNNING_GB_MONTH",
           "VOLUME_STOPPED_GB_MONTH", "allowed_cuda", "cuda_for", "image_cuda", "offers_from", "resolve_gpu",
           "DEFAULT_CPU_INSTANCE", "DEFAULT_IMAGE", "POD_FIELDS", "VOLUME_PATH", "self_stop_command"]


@hookimpl
def register_providers(register):
    register(RunPodProvider)
