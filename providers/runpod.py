"""RunPod pods through the runpod SDK's GraphQL call, with every mutation written here.

The SDK's own ``create_pod`` pastes strings into its query unescaped (a ``"`` in an env value
breaks it), so every query is built here with ``json.dumps`` literals and sent through
``runpod.api.graphql.run_graphql_query``, which honours ``RUNPOD_API_BASE_URL``. The SDK is
imported only when a call is made: ``orch --help`` never pays its import.

What RunPod imposes, where it is written, and what this provider does about it:
- **A create can fail after the pod was made** ("Something went wrong", a 500: runpodctl issue
  #172, and Transformer Lab's client, api/transformerlab/compute_providers/runpod.py
  ``_recover_pod_after_error``), and a new pod may be missing from ``myself { pods }`` for a
  while (Transformer Lab retries its lookup "to absorb listing lag"). After such an answer the
  pod is looked up by its name (the orch label) for ``create_lookup_seconds``, and no second
  create is ever sent for it: never two pods for one intent. A refusal that made nothing (a 429
  HTML page, no capacity) is looked up once, then retried. A create that answered is given the same
  window: a new pod that ``pod(podId)`` does not show yet is pending, not gone.
- **CUDA**: a pod on a host whose driver is older than the image's CUDA never starts its
  container ("OCI runtime create failed", docs pods/manage-pods): ``runtime`` stays null for ever
  while the pod bills. Every GPU create sends ``allowedCudaVersions`` (docs sdks/graphql/
  manage-pods, "Filter by CUDA version"; dstack sends a minimum CUDA on every create), the
  versions at or above the image's CUDA, read from its tag (setting ``min_cuda`` overrides).
  Matching is exact (REST v2 openapi, CreateGpuConfig.allowedCudaVersions), so the list names
  every version from that minimum on. A pod whose container has not started within
  ``container_start_minutes`` fails ``wait_ssh`` with that reason (and ``orch up`` destroys it).
- **Spot pods are gone**: ``podRentInterruptable`` and ``podBidResume`` were removed from the API
  on 2026-09-11 (runpodctl PR #267; gpuhunt commit 249b01c "runpod will drop its spot pods on
  September 11th"). ``spot=False``; offers carry no spot price.
- **Stop and start**: only the pod's volume disk (``/workspace``) survives a stop; the container
  disk is cleared (docs pods/manage-pods, "Stop a Pod"; pods/storage/types). RunPod's images
  delete the SSH host keys and make new ones at every start (runpod/containers,
  official-templates/base start.sh): ``new_host_key_on_start``. A stop releases the GPU, so a
  resume can be refused; the volume is kept meanwhile ($0.20/GB-month stopped).
- **CPU pods have no volume disk**: "CPU pods support container disk and network volumes only;
  ``mounts.persistent`` is invalid when ``cpu`` is set" (REST v2 openapi, CreatePodRequest;
  PersistentMount: "Disallowed on CPU pods"), and ``deployCpuPodInput`` has no ``volumeInGb``.
  They can be stopped and started (REST v2 ``POST /pods/{id}/action``: a stop releases "GPU/CPU
  compute"), but a stop keeps nothing of theirs: a started CPU pod is a fresh container, its
  work dir included. While stopped it bills nothing.
- Offers whose ``stockStatus`` is null are out of stock and left out (gpuhunt,
  src/gpuhunt/providers/runpod.py ``_make_offers``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from typing import Any

from orchestrator.errors import AuthError, NoCapacity, ProviderError, SSHError, StartRefused, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import (Capabilities, Endpoint, Offer, Progress, Provider, Remote, Request, Status,
                                   parse_label, stopped_rate)
from orchestrator.retry import retry

DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
DEFAULT_CPU_INSTANCE = "cpu3c-2-4"  # 2 vCPU, 4 GB: the smallest compute-optimised flavour
VOLUME_PATH = "/workspace"
VOLUME_RUNNING_GB_MONTH = 0.10
VOLUME_STOPPED_GB_MONTH = 0.20
CONTAINER_START_MINUTES = 5.0  # RunPod's own images are cached on its hosts; a big custom image may need more
CREATE_LOOKUP_SECONDS = 60.0

# The pod fields orch reads. ``env`` is left out on purpose: it holds the user's secrets, and a
# Remote's ``raw`` may be written to the ledger.
POD_FIELDS = (
    "id name desiredStatus podType costPerHr gpuCount vcpuCount memoryInGb containerDiskInGb "
    "volumeInGb volumeMountPath imageName ports uptimeSeconds machineId lastStatusChange "
    "runtime { ports { ip isIpPublic privatePort publicPort type } } machine { gpuDisplayName }"
)

NO_CAPACITY = ("no longer any instances available", "not enough free gpus", "no instances available")
# Answers from a request RunPod processed: the pod may exist though the answer is an error.
MAYBE_MADE = ("something went wrong", "internal server error")
TRANSIENT = ("too many requests", "rate limit", "timed out", "try again later")

# The CUDA versions a host may report, as allowedCudaVersions spells them. Matching is exact (a
# version no host reports matches nothing, REST v2 openapi), so the list runs ahead of today's
# drivers; a host newer than its end is left out, which costs capacity, never a dead pod.
CUDA_VERSIONS = [(11, 8)] + [(12, m) for m in range(10)] + [(13, m) for m in range(10)]
# The CUDA an image needs, from its tag: RunPod's "...-cuda12.4.1-..." and "...-cu1281-...",
# nvidia/cuda's "cuda:12.4.1-...". (The container runtime checks the image's NVIDIA_REQUIRE_CUDA,
# "cuda>=12.4", against the driver: that check is what fails with "OCI runtime create failed".)
_IMAGE_CUDA = re.compile(r"(?:^|[^a-z0-9])(?:cuda[-_:]?|cu)(\d{2})\.?(\d)")
_CUDA_SETTING = re.compile(r"(\d{1,2})\.(\d{1,2})")


def image_cuda(image: str) -> tuple[int, int] | None:
    """(major, minor) of the CUDA an image is built on, from its tag; None when the tag says nothing."""
    m = _IMAGE_CUDA.search(image.lower())
    return (int(m[1]), int(m[2])) if m else None


def allowed_cuda(minimum: tuple[int, int]) -> list[str]:
    return [f"{major}.{minor}" for major, minor in CUDA_VERSIONS if (major, minor) >= minimum]


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class _Enum(str):
    """A GraphQL enum value: written bare, not quoted."""


def literal(value: Any) -> str:
    """A GraphQL literal. ``json.dumps`` of a str is a valid, fully escaped GraphQL string."""
    if isinstance(value, _Enum):
        return str(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise TypeError(f"no GraphQL literal for {type(value).__name__}")


class _Transient(ProviderError):
    """A failure worth another try for a call that is safe to repeat: 429/5xx (HTML bodies),
    timeouts, RunPod's 'Something went wrong'."""


class _MaybeMade(_Transient):
    """RunPod processed the request and answered an error: a create may have made the pod."""


class RunPodProvider(Provider):
    """RunPod GPU and CPU pods. Pods with a network volume cannot be stopped (orch attaches none)."""

    name = "runpod"
    numeric_settings = {"retries": 1, "retry_base": 0, "poll_interval": 0, "container_disk_gb": 1,
                        "destroy_timeout": 0, "container_start_minutes": 0.01, "create_lookup_seconds": 0}
    capabilities = Capabilities(stop=True, spot=False, cpu_only=True, gpu=True, self_stop=True,
                                self_destroy=True, new_host_key_on_start=True)
    env_keys = ("RUNPOD_API_KEY", "RUNPOD_API_BASE_URL")
    credentials = "RUNPOD_API_KEY, or api_key under [providers.runpod] in config.toml"
    # Pods share no private network; RunPod's multi-node offer is Instant Clusters, another API
    # (a `createCluster` GraphQL object; shared/reference/multinode.md).
    groups_refused = ("its pods have no private network between them; RunPod's Instant Clusters are another API, "
                      "which orch does not drive: use aws, lambda or local")

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        self._gpu_types: list[dict] | None = None  # names and ids only: prices are always fetched live
        cuda = self.settings.get("min_cuda")
        if cuda not in (None, "") and not (isinstance(cuda, str) and _CUDA_SETTING.fullmatch(cuda.strip())):
            raise UsageError(f"[providers.runpod] min_cuda must be a CUDA version such as \"12.4\", not {cuda!r}")

    # -- settings ----------------------------------------------------------------------
    @property
    def _attempts(self) -> int:
        return int(self.setting("retries", 5))

    @property
    def _backoff(self) -> float:
        return float(self.setting("retry_base", 0.5))

    @property
    def _poll(self) -> float:
        return float(self.setting("poll_interval", 2.0))

    @property
    def poll_seconds(self) -> float:
        return self._poll

    def configured(self) -> bool:
        # The SDK's own credentials file, checked without importing the SDK.
        return bool(os.environ.get("RUNPOD_API_KEY") or self.settings.get("api_key")
                    or os.path.exists(os.path.expanduser("~/.runpod/config.toml")))

    def _api_key(self, runpod) -> str:
        key = os.environ.get("RUNPOD_API_KEY") or self.settings.get("api_key")  # env beats config.toml
        if not key:
            key = (runpod.get_credentials(runpod.profile) or {}).get("api_key")
        if not key:
            raise AuthError("no RunPod API key: set api_key under [providers.runpod] in orch's config, "
                            "or export RUNPOD_API_KEY, or run `runpod config`")
        return key

    # -- GraphQL -----------------------------------------------------------------------
    def _once(self, query: str) -> dict:
        """One POST. SDK exceptions become orch's errors; retryable ones are _Transient."""
        import requests

        runpod = _sdk()
        from runpod import error as rp_error
        from runpod.api.graphql import run_graphql_query

        key = self._api_key(runpod)
        try:
            return run_graphql_query(query, api_key=key)
        except rp_error.AuthenticationError:
            raise AuthError("RunPod rejected the API key (401 Unauthorized): check api_key under "
                            "[providers.runpod] or RUNPOD_API_KEY") from None
        except rp_error.QueryError as e:
            message = str(e)
            low = message.lower()
            if any(s in low for s in NO_CAPACITY):
                raise NoCapacity(f"RunPod has no capacity for this request: {message}") from None
            if any(s in low for s in MAYBE_MADE):
                raise _MaybeMade(f"RunPod API error: {message}") from None
            if any(s in low for s in TRANSIENT):
                raise _Transient(f"RunPod API error: {message}") from None
            raise ProviderError(f"RunPod API error: {message}") from None
        except ValueError as e:  # an HTML body (429, 502) fails JSON decoding inside the SDK
            raise _Transient(f"RunPod API answered something that is not JSON (rate limit or "
                             f"outage?): {e}") from None
        except requests.ReadTimeout as e:  # sent, maybe processed: like an error answer
            raise _MaybeMade(f"RunPod API did not answer in time: {e}") from None
        except requests.RequestException as e:
            raise _Transient(f"RunPod API unreachable: {e}") from None

    def _query(self, query: str) -> dict:
        """Bounded retries for calls that are safe to repeat."""
        return retry(lambda: self._once(query), self._retry_delay, attempts=self._attempts,
                     base=self._backoff)["data"]

    @staticmethod
    def _retry_delay(exc: BaseException) -> float | None:
        return -1 if isinstance(exc, _Transient) else None

    def _sleep_backoff(self, attempt: int) -> None:
        time.sleep(min(self._backoff * 2 ** attempt, 20.0))

    # -- GPU types ---------------------------------------------------------------------
    def gpu_types(self) -> list[dict]:
        if self._gpu_types is None:
            self._gpu_types = self._query("query GpuTypes { gpuTypes { id displayName memoryInGb } }")["gpuTypes"]
        return self._gpu_types

    @staticmethod
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

    def _gpu_for(self, request: Request) -> dict:
        wanted = request.gpu or self.settings.get("gpu")
        if not wanted:
            raise UsageError("say which GPU to rent on RunPod (--gpu, e.g. 'RTX 4090'), or use --cpu")
        return self.resolve_gpu(str(wanted), self.gpu_types())

    def cuda_for(self, image: str) -> list[str] | None:
        """allowedCudaVersions for ``image``: every version from the one it needs (setting
        ``min_cuda``, else its tag); None when neither says (then RunPod may place it anywhere)."""
        setting = str(self.setting("min_cuda", "")).strip()
        m = _CUDA_SETTING.fullmatch(setting)
        minimum = (int(m[1]), int(m[2])) if m else image_cuda(image)
        return allowed_cuda(minimum) if minimum else None

    # -- verbs -------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        if request.spot:
            raise UsageError("RunPod has no spot pods any more (removed from its API on 2026-09-11): drop --spot")
        super().validate(request)
        if not request.cpu and request.gpus < 1:
            raise UsageError("a RunPod GPU pod needs at least one GPU (or use --cpu)")

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        mutation, field = self._deploy(request, label, public_key)
        for attempt in range(self._attempts):
            try:
                pod = self._once(mutation)["data"][field]
            except AuthError:
                raise  # a rejected key created nothing, and would not list either
            except ProviderError as exc:
                # RunPod has answered errors after creating the pod: look before anything else.
                found = self._look_for(label, exc, patient=isinstance(exc, _MaybeMade))
                if found:
                    return found
                if isinstance(exc, _MaybeMade):
                    raise ProviderError(
                        f"creating {label} failed ({exc}), and no pod of that name showed within "
                        f"{self._lookup_window:g} s. RunPod answers so after making a pod too: orch sends no "
                        "second create; `orch reconcile` adopts it should it show later") from None
                if not isinstance(exc, _Transient) or attempt == self._attempts - 1:
                    raise
                self._sleep_backoff(attempt)
                continue
            if not pod:
                raise NoCapacity("RunPod created nothing for this request (no capacity?)")
            self.made(pod["id"])
            remote = self.get(pod["id"])
            # Not visible to a lookup yet (the lag its listing shows): pending, as the create's answer says.
            return self._remote(pod) if remote.status == Status.GONE or not remote.label else remote
        raise AssertionError("unreachable")

    @property
    def _lookup_window(self) -> float:
        return float(self.setting("create_lookup_seconds", CREATE_LOOKUP_SECONDS))

    def _look_for(self, label: str, exc: ProviderError, patient: bool) -> Remote | None:
        """The pod a failed create may have made: one look, or (``patient``) looks for
        ``create_lookup_seconds``, since a new pod may be missing from the listing for a while."""
        deadline = time.monotonic() + (self._lookup_window if patient else 0)
        while True:
            try:
                found = self.find(label)
                failed = None
            except ProviderError as e:
                found, failed = None, e
            if found:
                return found
            if time.monotonic() >= deadline:
                if failed is not None:
                    raise ProviderError(f"creating {label} failed ({exc}), and listing pods to check whether it "
                                        f"was made anyway failed too ({failed}): check the RunPod console or "
                                        "`orch reconcile` before retrying") from None
                return None
            time.sleep(self._poll)

    def _deploy(self, request: Request, label: str, public_key: str) -> tuple[str, str]:
        env = {"PUBLIC_KEY": public_key.strip(), **request.env}
        image = request.image or self.setting("image", DEFAULT_IMAGE)
        fields: dict[str, Any] = {
            "name": label,
            "imageName": image,
            "ports": "22/tcp",
            "startSsh": True,
            "env": [{"key": k, "value": str(v)} for k, v in env.items()],
        }
        container_gb = int(self.setting("container_disk_gb", 20))
        if request.cpu:
            # No volume: deployCpuPodInput has none (see the module's docstring); the container
            # disk holds everything, and a stop clears it.
            fields.update(instanceId=str(self.setting("cpu_instance", DEFAULT_CPU_INSTANCE)),
                          cloudType=_Enum("SECURE"),
                          containerDiskInGb=max(container_gb, int(request.disk_gb)))
            mutation = "deployCpuPod"
        else:
            gpu = self._gpu_for(request)
            fields.update(gpuTypeId=gpu["id"], gpuCount=int(request.gpus),
                          cloudType=_Enum(str(self.setting("cloud_type", "ALL")).upper()),
                          supportPublicIp=True, volumeInGb=int(request.disk_gb),
                          volumeMountPath=VOLUME_PATH, containerDiskInGb=container_gb)
            cuda = self.cuda_for(image)
            if cuda:
                fields["allowedCudaVersions"] = cuda
            mutation = "podFindAndDeployOnDemand"
        return (f"mutation {{ {mutation}(input: {literal(fields)}) {{ id name desiredStatus "
                f"imageName machineId costPerHr gpuCount volumeInGb }} }}", mutation)

    def get(self, provider_id: str) -> Remote:
        q = f"query {{ pod(input: {{podId: {literal(provider_id)}}}) {{ {POD_FIELDS} }} }}"
        pod = self._query(q)["pod"]
        if pod is None:
            # A pod this process just made may not be visible yet: pending for the lookup window.
            return self.unseen(provider_id, self._lookup_window) or \
                Remote(provider_id=provider_id, label="", status=Status.GONE)
        self.seen(provider_id)
        return self._remote(pod)

    def _remote(self, pod: dict) -> Remote:
        # RUNNING with runtime null: the container has not started (yet, or ever: see wait_ssh).
        status = {"RUNNING": Status.RUNNING if pod.get("runtime") else Status.PENDING, "EXITED": Status.STOPPED,
                  "TERMINATED": Status.GONE}.get(pod.get("desiredStatus"), Status.PENDING)
        endpoint = None
        if status == Status.RUNNING:
            for port in (pod.get("runtime") or {}).get("ports") or []:
                # The SDK's own helper forgets isIpPublic: the private entry is unreachable.
                if port.get("privatePort") == 22 and port.get("isIpPublic") and port.get("ip"):
                    endpoint = Endpoint(port["ip"], int(port["publicPort"]), self.ssh_user)
                    break
        return Remote(
            provider_id=pod["id"], label=pod.get("name") or "", status=status, endpoint=endpoint,
            price_hr=pod.get("costPerHr"),
            stopped_price_hr=stopped_rate(pod.get("volumeInGb") or 0, VOLUME_STOPPED_GB_MONTH),
            gpu_name=(pod.get("machine") or {}).get("gpuDisplayName"), gpus=pod.get("gpuCount") or 0,
            detail=str(pod.get("desiredStatus") or "").lower(), raw=pod,
        )

    def list(self) -> list[Remote]:
        pods = self._query(f"query {{ myself {{ pods {{ {POD_FIELDS} }} }} }}")
        try:
            found = pods["myself"]["pods"]
        except (KeyError, TypeError):
            found = None
        if not isinstance(found, list):
            raise ProviderError(f"RunPod's pod listing came back without pods: {str(pods)[:200]}")
        remotes = [self._remote(p) for p in found if parse_label(p.get("name"))]
        return [r for r in remotes if r.status != Status.GONE]

    def wait_ssh(self, provider_id: str, timeout: float, progress: Progress | None = None,
                 interval: float = 2.0) -> Remote:
        """First the container (``runtime`` appears), within ``container_start_minutes``: a pod
        whose container never starts (a driver older than the image's CUDA) bills while RunPod
        shows it RUNNING for ever. Then SSH, as every provider, within what is left of ``timeout``."""
        interval = min(interval, self._poll)
        limit = float(self.setting("container_start_minutes", CONTAINER_START_MINUTES)) * 60
        t0 = time.monotonic()
        if limit < timeout:
            said = False
            while True:
                remote = self.get(provider_id)
                if remote.status != Status.PENDING or remote.raw.get("desiredStatus") != "RUNNING":
                    break  # running, or something the common loop below says
                if time.monotonic() - t0 >= limit:
                    raise SSHError(
                        f"RunPod pod {provider_id} has not started its container within {_span(limit)} "
                        f"(runtime still null): its host may have a driver older than the image's CUDA "
                        f"(\"OCI runtime create failed\"); set [providers.runpod] min_cuda, or raise "
                        f"container_start_minutes for a large image")
                if progress and not said:
                    progress("waiting for the container to start (RunPod shows no runtime yet)")
                    said = True
                time.sleep(interval)
        return super().wait_ssh(provider_id, max(timeout - (time.monotonic() - t0), interval), progress, interval)

    def stop(self, provider_id: str) -> None:
        """A GPU pod keeps its volume; a CPU pod has none and keeps nothing (module docstring)."""
        remote = self._need(provider_id)
        if remote.status == Status.STOPPED:
            return
        self._query(f"mutation {{ podStop(input: {{podId: {literal(provider_id)}}}) {{ id desiredStatus }} }}")

    def start(self, provider_id: str) -> Remote:
        remote = self._need(provider_id)
        if remote.status != Status.STOPPED:
            return remote
        gpus = int(remote.raw.get("gpuCount") or 0)
        q = (f"mutation {{ podResume(input: {{podId: {literal(provider_id)}, gpuCount: {gpus}}}) "
             f"{{ id desiredStatus }} }}")
        for attempt in range(self._attempts):
            try:
                self._once(q)
                break
            except NoCapacity as e:
                disk = remote.raw.get("volumeInGb") or 0
                kept = (f"Its volume disk ({disk} GB at {VOLUME_PATH}) is safe and kept "
                        f"(${remote.stopped_price_hr or 0:.4f}/h while stopped)." if disk else
                        "It has no volume disk (a CPU pod): it bills nothing while stopped.")
                raise StartRefused(
                    f"RunPod could not give pod {provider_id} its {'GPU(s)' if gpus else 'CPUs'} back ({e}). {kept} "
                    "Try `orch start` again later, or `orch down` it and create a new one elsewhere.") from None
            except _Transient:
                if self.get(provider_id).status != Status.STOPPED:
                    break  # the resume that errored happened all the same
                if attempt == self._attempts - 1:
                    raise
                self._sleep_backoff(attempt)
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        if self.get(provider_id).status == Status.GONE:
            return
        try:
            self._query(f"mutation {{ podTerminate(input: {{podId: {literal(provider_id)}}}) }}")
        except ProviderError:
            if self.get(provider_id).status != Status.GONE:
                raise
            return
        # podTerminate answers the same whatever happened: only the pod's absence confirms it.
        deadline = time.monotonic() + float(self.setting("destroy_timeout", 60))
        while self.get(provider_id).status != Status.GONE:
            if time.monotonic() >= deadline:
                raise ProviderError(f"RunPod did not confirm that pod {provider_id} is gone; it may "
                                    "still bill: check the RunPod console")
            time.sleep(self._poll)

    def _need(self, provider_id: str) -> Remote:
        remote = self.get(provider_id)
        if remote.status == Status.GONE:
            raise ProviderError(f"RunPod pod {provider_id} does not exist (any more)")
        return remote

    # -- prices ------------------------------------------------------------------------
    def offers(self, request: Request) -> list[Offer]:
        """Every GPU type's live on-demand price for ``request.gpus`` GPUs, in one query; out of
        stock (``stockStatus`` null) left out. No spot prices: RunPod has no spot pods any more."""
        n = max(int(request.gpus), 1)
        q = (f"query GpuTypes {{ gpuTypes {{ id displayName memoryInGb maxGpuCount securePrice "
             f"communityPrice lowestPrice(input: {{gpuCount: {n}}}) {{ uninterruptablePrice stockStatus }} }} }}")
        types = self._query(q)["gpuTypes"] or []
        if request.gpu:
            types = [self.resolve_gpu(request.gpu, types)]
        offers = []
        for t in types:
            if (t.get("maxGpuCount") or n) < n:
                continue
            low = t.get("lowestPrice") or {}
            if low.get("stockStatus") is None:  # out of stock (gpuhunt skips these too)
                continue
            listed = [p for p in (t.get("communityPrice"), t.get("securePrice")) if p]
            per_gpu = low.get("uninterruptablePrice") or (min(listed) if listed else None)
            if not per_gpu:
                continue
            offers.append(Offer(
                provider=self.name, offer_id=t["id"], gpu_name=t.get("displayName") or t["id"], gpus=n,
                vram_gb=float(t.get("memoryInGb") or 0), price_hr=per_gpu * n, disk_gb_month=VOLUME_RUNNING_GB_MONTH,
                disk_gb_month_stopped=VOLUME_STOPPED_GB_MONTH, stock=low.get("stockStatus"), disk_included=False,
                raw=t,
            ))
        return offers

    # -- on the pod --------------------------------------------------------------------
    def self_stop_command(self, provider_id: str, destroy: bool) -> str:
        """A shell snippet that, run inside the pod, stops (or terminates) the pod itself.

        The key is read from the environment inside Python, never put on a command line. A
        non-interactive SSH session may lack RunPod's variables: the container's PID 1 has them.
        """
        mutation = "podTerminate(input: {podId: %s})" if destroy else "podStop(input: {podId: %s}) { id }"
        script = (
            'import json, os, sys, urllib.request\n'
            'def env(k):\n'
            '    if os.environ.get(k):\n'
            '        return os.environ[k]\n'
            '    try:\n'
            '        pairs = open("/proc/1/environ", "rb").read().split(b"\\0")\n'
            '    except OSError:\n'
            '        return ""\n'
            '    return dict(p.decode(errors="replace").partition("=")[::2] for p in pairs if p).get(k, "")\n'
            'pod, key = env("RUNPOD_POD_ID"), env("RUNPOD_API_KEY")\n'
            'if not pod or not key:\n'
            '    sys.exit("RUNPOD_POD_ID or RUNPOD_API_KEY missing: cannot stop this pod")\n'
            f'query = "mutation {{ {mutation} }}" % json.dumps(pod)\n'
            'base = env("RUNPOD_API_BASE_URL") or "https://api.runpod.io"\n'
            'req = urllib.request.Request(base + "/graphql", data=json.dumps({"query": query}).encode(),\n'
            '    headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})\n'
            'body = json.load(urllib.request.urlopen(req, timeout=30))\n'
            'if body.get("errors"):\n'
            '    sys.exit("RunPod refused: " + body["errors"][0].get("message", ""))\n'
        )
        return f"python3 -c {shlex.quote(script)}"


def _sdk():
    """``import runpod`` without its serverless worker's CPU probe. Importing the package runs
    runpod/serverless/utils/rp_debugger.py, whose module-level ``cpuinfo.get_cpu_info()`` starts a
    Python subprocess: about a second of CPU on every orch command that talks to RunPod. orch uses
    only the GraphQL client and never reads that CPU brand (it labels serverless debug logs), so
    the probe answers with ``platform.machine()`` while the package imports, and the real py-cpuinfo stays
    importable afterwards."""
    import sys

    if "runpod" not in sys.modules and "cpuinfo" not in sys.modules:
        import platform
        import types

        shim = types.ModuleType("cpuinfo")
        shim.get_cpu_info = lambda: {"brand_raw": platform.machine()}  # os.uname: no subprocess
        sys.modules["cpuinfo"] = shim
        try:
            import runpod
        finally:
            del sys.modules["cpuinfo"]
    import runpod

    return runpod


@hookimpl
def register_providers(register):
    register(RunPodProvider)
