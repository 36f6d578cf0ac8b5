"""RunPod pods through the runpod SDK's GraphQL call, with every mutation written here.

The SDK's own ``create_pod`` pastes strings into its query unescaped (a ``"`` in an env value
breaks it) and has no spot call, so every query is built here with ``json.dumps`` literals and
sent through ``runpod.api.graphql.run_graphql_query``, which honours ``RUNPOD_API_BASE_URL``.
The SDK is imported only when a call is made: ``orch --help`` never pays its import.

What RunPod imposes, and what this provider does about it:
- A create can fail after the pod was made: after any create error the pod is looked up by its
  name (the orch label) before a retry or an error, so there is never a duplicate nor an orphan.
- Spot bids come from the live minimum bid at the time of the call, never from a cached catalog.
  RunPod staff have said the spot mutation is being phased out (``spot_may_disappear``).
- Only the volume disk (``/workspace``) survives a stop; the container disk is wiped. CPU pods
  have no volume disk at all (``deployCpuPodInput`` has no ``volumeInGb``), so they refuse
  ``stop``. Pods with a network volume cannot be stopped either; orch attaches none.
- Stop releases the GPUs: a resume can be refused, and the volume disk is kept meanwhile.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import Any

from orchestrator.errors import AuthError, NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import (Capabilities, Endpoint, Offer, Provider, Remote, Request, Status, bid_with_margin,
                                   parse_label, stopped_rate)
from orchestrator.retry import retry

DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
DEFAULT_CPU_INSTANCE = "cpu3c-2-4"  # 2 vCPU, 4 GB: the smallest compute-optimised flavour
VOLUME_PATH = "/workspace"
VOLUME_RUNNING_GB_MONTH = 0.10
VOLUME_STOPPED_GB_MONTH = 0.20

# The pod fields orch reads. ``env`` is left out on purpose: it holds the user's secrets, and a
# Remote's ``raw`` may be written to the ledger.
POD_FIELDS = (
    "id name desiredStatus podType costPerHr gpuCount vcpuCount memoryInGb containerDiskInGb "
    "volumeInGb volumeMountPath imageName ports uptimeSeconds machineId lastStatusChange "
    "runtime { ports { ip isIpPublic privatePort publicPort type } } machine { gpuDisplayName }"
)

NO_CAPACITY = ("no longer any instances available", "not enough free gpus", "no instances available")
TRANSIENT = ("something went wrong", "internal server error", "too many requests", "rate limit",
             "timed out", "try again later")


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
    """A failure worth another try: 429/5xx (HTML bodies), timeouts, RunPod's 'Something went wrong'."""


class RunPodProvider(Provider):
    """RunPod GPU and CPU pods. Pods with a network volume cannot be stopped (orch attaches none)."""

    name = "runpod"
    numeric_settings = {"spot_margin": 0, "retries": 1, "retry_base": 0, "poll_interval": 0, "container_disk_gb": 1,
                        "destroy_timeout": 0}
    capabilities = Capabilities(stop=True, spot=True, cpu_only=True, gpu=True, self_stop=True,
                                self_destroy=True)
    env_keys = ("RUNPOD_API_KEY", "RUNPOD_API_BASE_URL")

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        self._gpu_types: list[dict] | None = None  # names and ids only: prices are always fetched live

    # -- settings ----------------------------------------------------------------------
    def _setting(self, key: str, default):
        value = self.settings.get(key)
        return default if value is None or value == "" else value

    @property
    def _user(self) -> str:
        return str(self._setting("ssh_user", "root"))

    @property
    def _margin(self) -> float:
        return float(self._setting("spot_margin", 0.05))

    @property
    def _attempts(self) -> int:
        return int(self._setting("retries", 5))

    @property
    def _backoff(self) -> float:
        return float(self._setting("retry_base", 0.5))

    @property
    def _poll(self) -> float:
        return float(self._setting("poll_interval", 2.0))

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
        import runpod
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
            if any(s in low for s in TRANSIENT):
                raise _Transient(f"RunPod API error: {message}") from None
            raise ProviderError(f"RunPod API error: {message}") from None
        except ValueError as e:  # an HTML body (429, 502) fails JSON decoding inside the SDK
            raise _Transient(f"RunPod API answered something that is not JSON (rate limit or "
                             f"outage?): {e}") from None
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

    def minimum_bid(self, gpu_type_id: str, gpus: int) -> float:
        """The live minimum spot bid per GPU, asked now (a stale bid overpays or is refused)."""
        q = (f"query {{ gpuTypes(input: {{id: {literal(gpu_type_id)}}}) {{ id "
             f"lowestPrice(input: {{gpuCount: {int(gpus)}}}) {{ minimumBidPrice }} }} }}")
        types = self._query(q)["gpuTypes"] or []
        price = ((types[0].get("lowestPrice") or {}).get("minimumBidPrice")) if types else None
        if not price:
            raise NoCapacity(f"RunPod offers no spot {gpu_type_id} x{gpus} right now")
        return float(price)

    def _bid(self, gpu_type_id: str, gpus: int) -> float:
        return bid_with_margin(self.minimum_bid(gpu_type_id, gpus), self._margin)

    # -- verbs -------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        super().validate(request)
        if request.cpu and request.spot:
            raise UsageError("RunPod has no spot CPU pods: drop --spot or --cpu")
        if not request.cpu and request.gpus < 1:
            raise UsageError("a RunPod GPU pod needs at least one GPU (or use --cpu)")

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        mutation, field = self._deploy(request, label, public_key)
        for attempt in range(self._attempts):
            try:
                pod = self._once(mutation)["data"][field]
                if not pod:
                    raise NoCapacity("RunPod created nothing for this request (no capacity?)")
                return self.get(pod["id"])
            except AuthError:
                raise  # a rejected key created nothing, and would not list either
            except ProviderError as exc:
                # RunPod has answered errors after creating the pod: look before trying again.
                try:
                    found = self.find(label)
                except ProviderError as e:
                    raise ProviderError(f"creating {label} failed ({exc}), and listing pods to check "
                                        f"whether it was made anyway failed too ({e}): check the RunPod "
                                        "console or `orch reconcile` before retrying") from None
                if found:
                    return found
                if not isinstance(exc, _Transient) or attempt == self._attempts - 1:
                    raise
                self._sleep_backoff(attempt)
        raise AssertionError("unreachable")

    def _deploy(self, request: Request, label: str, public_key: str) -> tuple[str, str]:
        env = {"PUBLIC_KEY": public_key.strip(), **request.env}
        fields: dict[str, Any] = {
            "name": label,
            "imageName": request.image or self._setting("image", DEFAULT_IMAGE),
            "ports": "22/tcp",
            "startSsh": True,
            "env": [{"key": k, "value": str(v)} for k, v in env.items()],
        }
        container_gb = int(self._setting("container_disk_gb", 20))
        if request.cpu:
            fields.update(instanceId=str(self._setting("cpu_instance", DEFAULT_CPU_INSTANCE)),
                          cloudType=_Enum("SECURE"),
                          containerDiskInGb=max(container_gb, int(request.disk_gb)))
            mutation = "deployCpuPod"
        else:
            gpu = self._gpu_for(request)
            fields.update(gpuTypeId=gpu["id"], gpuCount=int(request.gpus),
                          cloudType=_Enum(str(self._setting("cloud_type", "ALL")).upper()),
                          supportPublicIp=True, volumeInGb=int(request.disk_gb),
                          volumeMountPath=VOLUME_PATH, containerDiskInGb=container_gb)
            mutation = "podFindAndDeployOnDemand"
            if request.spot:
                bid = request.bid if request.bid is not None else self._bid(gpu["id"], request.gpus)
                fields["bidPerGpu"] = float(bid)
                mutation = "podRentInterruptable"
        return (f"mutation {{ {mutation}(input: {literal(fields)}) {{ id name desiredStatus "
                f"imageName machineId }} }}", mutation)

    def get(self, provider_id: str) -> Remote:
        q = f"query {{ pod(input: {{podId: {literal(provider_id)}}}) {{ {POD_FIELDS} }} }}"
        pod = self._query(q)["pod"]
        if pod is None:
            return Remote(provider_id=provider_id, label="", status=Status.GONE)
        return self._remote(pod)

    def _remote(self, pod: dict) -> Remote:
        status = {"RUNNING": Status.RUNNING if pod.get("runtime") else Status.PENDING, "EXITED": Status.STOPPED,
                  "TERMINATED": Status.GONE}.get(pod.get("desiredStatus"), Status.PENDING)
        endpoint = None
        if status == Status.RUNNING:
            for port in (pod.get("runtime") or {}).get("ports") or []:
                # The SDK's own helper forgets isIpPublic: the private entry is unreachable.
                if port.get("privatePort") == 22 and port.get("isIpPublic") and port.get("ip"):
                    endpoint = Endpoint(port["ip"], int(port["publicPort"]), self._user)
                    break
        return Remote(
            provider_id=pod["id"], label=pod.get("name") or "", status=status, endpoint=endpoint,
            price_hr=pod.get("costPerHr"),
            stopped_price_hr=stopped_rate(pod.get("volumeInGb") or 0, VOLUME_STOPPED_GB_MONTH),
            gpu_name=(pod.get("machine") or {}).get("gpuDisplayName"), gpus=pod.get("gpuCount") or 0,
            spot=pod.get("podType") == "INTERRUPTABLE", preempted=pod.get("podType") == "INTERRUPTABLE" and
            pod.get("desiredStatus") == "EXITED", detail=str(pod.get("desiredStatus") or "").lower(), raw=pod,
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

    def stop(self, provider_id: str) -> None:
        remote = self._need(provider_id)
        if remote.status == Status.STOPPED:
            return
        if not remote.raw.get("volumeInGb"):
            raise UsageError(f"RunPod pod {provider_id} has no volume disk (CPU pods keep everything on "
                             "the container disk, which a stop wipes): use `orch down` instead")
        self._query(f"mutation {{ podStop(input: {{podId: {literal(provider_id)}}}) {{ id desiredStatus }} }}")

    def start(self, provider_id: str) -> Remote:
        remote = self._need(provider_id)
        if remote.status != Status.STOPPED:
            return remote
        gpus = int(remote.raw.get("gpuCount") or 0)
        if remote.spot:
            bid = self._resume_bid(remote, gpus)
            q = (f"mutation {{ podBidResume(input: {{podId: {literal(provider_id)}, bidPerGpu: {literal(bid)}, "
                 f"gpuCount: {gpus}}}) {{ id desiredStatus }} }}")
        else:
            q = (f"mutation {{ podResume(input: {{podId: {literal(provider_id)}, gpuCount: {gpus}}}) "
                 f"{{ id desiredStatus }} }}")
        for attempt in range(self._attempts):
            try:
                self._once(q)
                break
            except NoCapacity as e:
                disk = remote.raw.get("volumeInGb") or 0
                raise StartRefused(
                    f"RunPod could not give pod {provider_id} its GPU(s) back ({e}). Its volume disk "
                    f"({disk} GB at {VOLUME_PATH}) is safe and kept (${remote.stopped_price_hr or 0:.4f}/h "
                    "while stopped). Try `orch start` again later, or `orch down` it and create a new "
                    "one elsewhere.") from None
            except _Transient:
                if self.get(provider_id).status != Status.STOPPED:
                    break  # the resume that errored happened all the same
                if attempt == self._attempts - 1:
                    raise
                self._sleep_backoff(attempt)
        return self.get(provider_id)

    def _resume_bid(self, remote: Remote, gpus: int) -> float:
        """The live minimum plus margin; the pod's previous bid only if the live price is unknown."""
        try:
            gpu = self.resolve_gpu(remote.gpu_name or "", self.gpu_types())
            return self._bid(gpu["id"], gpus)
        except (UsageError, NoCapacity):
            previous = remote.price_hr or 0.0
            if previous and gpus:
                return round(previous / gpus, 3)
            raise

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
        deadline = time.monotonic() + float(self._setting("destroy_timeout", 60))
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
        """Every GPU type's live prices for ``request.gpus`` GPUs, in one query."""
        n = max(int(request.gpus), 1)
        q = (f"query GpuTypes {{ gpuTypes {{ id displayName memoryInGb maxGpuCount securePrice "
             f"communityPrice secureSpotPrice communitySpotPrice lowestPrice(input: {{gpuCount: {n}}}) "
             f"{{ minimumBidPrice uninterruptablePrice stockStatus }} }} }}")
        types = self._query(q)["gpuTypes"] or []
        if request.gpu:
            types = [self.resolve_gpu(request.gpu, types)]
        offers = []
        for t in types:
            if (t.get("maxGpuCount") or n) < n:
                continue
            low = t.get("lowestPrice") or {}
            listed = [p for p in (t.get("communityPrice"), t.get("securePrice")) if p]
            per_gpu = low.get("uninterruptablePrice") or (min(listed) if listed else None)
            bid = low.get("minimumBidPrice")
            if not per_gpu and not bid:
                continue
            offers.append(Offer(
                provider=self.name, offer_id=t["id"], gpu_name=t.get("displayName") or t["id"], gpus=n,
                vram_gb=float(t.get("memoryInGb") or 0), price_hr=per_gpu * n if per_gpu else None,
                spot_hr=bid * n if bid else None, disk_gb_month=VOLUME_RUNNING_GB_MONTH,
                disk_gb_month_stopped=VOLUME_STOPPED_GB_MONTH, stock=low.get("stockStatus"), disk_included=False,
                min_bid_per_gpu=bid or None, raw=t,
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


@hookimpl
def register_providers(register):
    register(RunPodProvider)
