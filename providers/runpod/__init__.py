"""RunPod pods through the runpod SDK's GraphQL call, with every query written here.

The SDK's own ``create_pod`` pastes strings into its query unescaped (a ``"`` in an env value
breaks it), so every query is built here with ``json.dumps`` literals and sent through
``runpod.api.graphql.run_graphql_query``, which honours ``RUNPOD_API_BASE_URL``. The SDK is
imported only when a call is made: ``orch --help`` never pays its import.

What RunPod imposes, where it is written, and what this provider does about it:
- **A create can fail after the pod was made** ("Something went wrong", a 500: runpod/runpodctl
  issue #172, and Transformer Lab's client, api/transformerlab/compute_providers/runpod.py
  ``_recover_pod_after_error``), and a new pod may be missing from ``myself { pods }`` for a
  while (Transformer Lab retries its lookup "to absorb listing lag"). After such an answer the
  pod is looked up by its name (the orch label) for ``create_lookup_seconds``, and no second
  create is ever sent for it: never two pods for one intent. A refusal that made nothing (a 429
  HTML page, no capacity) is looked up once, then retried. A create that answered is given the same
  window: a new pod that ``pod(podId)`` does not show yet is pending, not gone.
- **CUDA**: a pod on a host whose driver is older than the image's CUDA never starts its
  container ("OCI runtime create failed"; RunPod docs, "Manage Pods", docs.runpod.io/pods/manage-pods):
  ``runtime`` stays null for ever while the pod bills. Every GPU create sends ``allowedCudaVersions``
  (RunPod docs, GraphQL "Manage Pods", docs.runpod.io/sdks/graphql/manage-pods, "Filter by CUDA
  version"; dstack sends a minimum CUDA on every create), the versions at or above the image's CUDA,
  read from its tag (setting ``min_cuda`` overrides). Matching is exact (RunPod's REST API v2
  OpenAPI, ``CreateGpuConfig.allowedCudaVersions``), so the list names every version from that
  minimum on. A pod whose container has not started within ``container_start_minutes`` fails the
  wait for SSH with that reason (``never_answers``), and ``orch up`` destroys it.
- **Spot pods are gone**: ``podRentInterruptable`` and ``podBidResume`` were removed from the API
  on 2026-09-11 (runpod/runpodctl PR #267; dstackai/gpuhunt commit 249b01c "runpod will drop its
  spot pods on September 11th"). ``spot=False``; offers carry no spot price.
- **Stop and start**: only the pod's volume disk (``/workspace``) survives a stop; the container
  disk is cleared (RunPod docs, "Manage Pods", "Stop a Pod"; "Storage options",
  docs.runpod.io/pods/storage/types). RunPod's images delete the SSH host keys and make new ones at
  every start (github.com/runpod/containers, official-templates/base/start.sh):
  ``new_host_key_on_start``. A stop releases the GPU, so a resume can be refused; the volume is
  kept meanwhile ($0.20/GB-month stopped).
- **CPU pods have no volume disk**: "CPU pods support container disk and network volumes only;
  ``mounts.persistent`` is invalid when ``cpu`` is set" (REST API v2 OpenAPI, CreatePodRequest;
  PersistentMount: "Disallowed on CPU pods"), and ``deployCpuPodInput`` has no ``volumeInGb``.
  They can be stopped and started (REST v2 ``POST /pods/{id}/action``: a stop releases "GPU/CPU
  compute"), but a stop keeps nothing of theirs: a started CPU pod is a fresh container, its
  work dir included. While stopped it bills nothing.
- Offers whose ``stockStatus`` is null are out of stock and left out (dstackai/gpuhunt,
  src/gpuhunt/providers/runpod.py ``_make_offers``).

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
