"""The RunPod provider's verbs over its pods (``api`` sends the queries, ``pods`` writes them)."""

from __future__ import annotations

import os
import time
from typing import Any

from orchestrator.errors import AuthError, NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.provider import (Capabilities, Offer, Provider, Remote, Request, SelfEnding, Status, Stoppable,
                                   http, parse_label)
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.model import Volume
from orchestrator.provider.grace import JustMade
from providers.runpod import pods
from providers.runpod.api import GraphQL, MaybeMade
from providers.runpod.offers import CUDA_SETTING, GPU_NAMES, cuda_for, offers_from, prices_query, resolve_gpu
from providers.runpod.self_stop import self_stop_command
from providers.runpod.volumes import MAX_GB, MIN_GB, NetworkVolumes, deploy_fields, reaches

CONTAINER_START_MINUTES = 5.0  # RunPod's own images are cached on its hosts; a big custom image may need more
CREATE_LOOKUP_SECONDS = 60.0  # how long a pod a failed create may have made is looked for (``create``)


class RunPodProvider(Provider, Stoppable, SelfEnding, HasVolumes):
    """RunPod GPU and CPU pods, and network volumes (``volumes``)."""

    name = "runpod"
    numeric_settings = {"retries": 1, "retry_base": 0, "poll_interval": 0, "container_disk_gb": 1,
                        "destroy_timeout": 0, "container_start_minutes": 0.01, "create_lookup_seconds": 0}
    # Spot pods are gone: ``podRentInterruptable`` and ``podBidResume`` were removed from the API on
    # 2026-09-11 (runpod/runpodctl PR #267; dstackai/gpuhunt commit 249b01c "runpod will drop its spot
    # pods on September 11th"). ``spot=False``; offers carry no spot price.
    capabilities = Capabilities(spot=False, cpu_only=True, gpu=True)
    # RunPod's images delete the SSH host keys and make new ones at every start
    # (github.com/runpod/containers, official-templates/base/start.sh).
    new_host_key_on_start = True
    env_keys = ("RUNPOD_API_KEY", "RUNPOD_API_BASE_URL")
    credentials = "RUNPOD_API_KEY, or api_key under [providers.runpod] in config.toml"
    # Pods share no private network; RunPod's multi-node offer is Instant Clusters, another API
    # (RunPod docs, "Instant Clusters", docs.runpod.io/instant-clusters; REST v2 ``POST /v2/clusters``,
    # docs.runpod.io/api-reference-v2/clusters/create-a-cluster).
    groups_refused = ("its pods have no private network between them; RunPod's Instant Clusters are another API, "
                      "planned separately: use aws, lambda or local")
    resolve_gpu = staticmethod(resolve_gpu)
    # A network volume lives in one data center, and several pods may mount it at once (RunPod docs,
    # "Storage options": network volumes are shareable across Pods).
    volume_place, shared_volumes, min_volume_gb, max_volume_gb = "data center", True, MIN_GB, MAX_GB

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        cuda = self.settings.get("min_cuda")
        if cuda not in (None, "") and not (isinstance(cuda, str) and CUDA_SETTING.fullmatch(cuda.strip())):
            raise UsageError(f"[providers.runpod] min_cuda must be a CUDA version such as \"12.4\", not {cuda!r}")
        self.api = GraphQL(self.settings.get("api_key"), attempts=int(self.setting("retries", 5)),
                           base=self.number("retry_base", 0.5))
        # A new pod that ``pod(podId)`` does not show yet is pending, not gone (``create``, ``get``).
        self._just_made = JustMade(self.number("create_lookup_seconds", CREATE_LOOKUP_SECONDS))
        self._gpu_types: list[dict] | None = None  # names and ids only: prices are always fetched live
        self.volumes = NetworkVolumes(self.api)

    @property
    def poll_seconds(self) -> float:
        return self.number("poll_interval", 2.0)

    def configured(self) -> bool:
        # The SDK's own credentials file, checked without importing the SDK.
        return bool(os.environ.get("RUNPOD_API_KEY") or self.settings.get("api_key")
                    or os.path.exists(os.path.expanduser("~/.runpod/config.toml")))

    def gpu_types(self) -> list[dict]:
        if self._gpu_types is None:
            self._gpu_types = self.api.query(GPU_NAMES)["gpuTypes"]
        return self._gpu_types

    def _gpu_type(self, request: Request) -> str:
        """The gpuType id to rent: the plan's quote as it was listed (no second listing), else
        ``--gpu`` (or the setting ``gpu``) resolved against one listing of the GPU types."""
        if request.quote is not None:
            return request.quote.offer_id
        wanted = request.gpu or self.settings.get("gpu")
        if not wanted:
            raise UsageError("say which GPU to rent on RunPod (--gpu, e.g. 'RTX 4090'), or use --cpu")
        return resolve_gpu(str(wanted), self.gpu_types())["id"]

    # -- verbs -------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        if request.spot:
            raise UsageError("RunPod has no spot pods any more (removed from its API on 2026-09-11): drop --spot")
        super().validate(request)
        if not request.cpu and request.gpus < 1:
            raise UsageError("a RunPod GPU pod needs at least one GPU (or use --cpu)")
        if request.quote is not None and not request.cpu and request.quote.provider != self.name:
            raise UsageError(f"an offer of {request.quote.provider} cannot be rented on RunPod")

    # A create can fail after the pod was made ("Something went wrong", a 500: runpod/runpodctl issue
    # #172, and Transformer Lab's client, api/transformerlab/compute_providers/runpod.py
    # ``_recover_pod_after_error``), and a new pod may be missing from ``myself { pods }`` for a while
    # (Transformer Lab retries its lookup "to absorb listing lag"). After such an answer the pod is
    # looked up by its name (the orch label) for ``create_lookup_seconds``, and no second create is
    # ever sent for it: never two pods for one intent. A refusal that made nothing (a 429 HTML page,
    # no capacity) is looked up once, then retried.
    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        mutation, field = self._deploy(request, label, public_key)

        def once() -> dict | Remote:
            try:
                return self.api.once(mutation)["data"][field]
            except AuthError:
                raise  # a rejected key created nothing, and would not list either
            except ProviderError as exc:
                return self._made_after_all(label, exc)

        # Only a refusal that made nothing is sent again (a Transient that is no MaybeMade).
        pod = http.call(once, attempts=self.api.attempts, base=self.api.base)
        if isinstance(pod, Remote):
            return pod
        if not pod:
            raise NoCapacity("RunPod created nothing for this request (no capacity?)")
        # A create that answered is given the same window: a new pod that ``pod(podId)`` does not
        # show yet is pending, not gone.
        self._just_made.made(pod["id"])
        remote = self.get(pod["id"])
        # Not visible to a lookup yet (the lag its listing shows): pending, as the create's answer says.
        return pods.remote(pod, self.ssh_user) if remote.status == Status.GONE or not remote.label else remote

    def _deploy(self, request: Request, label: str, public_key: str) -> tuple[str, str]:
        image = str(request.image or self.setting("image", pods.DEFAULT_IMAGE))
        shape: dict[str, Any] = {"image": image, "container_gb": int(self.setting("container_disk_gb", 20))}
        if request.cpu:
            shape["cpu_instance"] = str(self.setting("cpu_instance", pods.DEFAULT_CPU_INSTANCE))
        else:
            shape.update(gpu_type=self._gpu_type(request), cloud_type=str(self.setting("cloud_type", "ALL")),
                         cuda=cuda_for(image, str(self.setting("min_cuda", ""))))
        return pods.deploy(request, label, public_key, **shape, attach=deploy_fields(request))

    def _made_after_all(self, label: str, exc: ProviderError) -> Remote:
        """RunPod has answered errors after creating the pod: look before anything else. The pod
        found, or ``exc`` again (a refusal), or (after an answer RunPod may have acted on, and no
        pod within ``create_lookup_seconds``) an error that no second create follows."""
        found = self._look_for(label, exc, patient=isinstance(exc, MaybeMade))
        if found:
            self._just_made.made(found.provider_id)  # as after a create that answered: a lookup may lag
            return found
        if isinstance(exc, MaybeMade):
            raise ProviderError(
                f"creating {label} failed ({exc}), and no pod of that name showed within "
                f"{self._just_made.grace:g} s. RunPod answers so after making a pod too: orch sends no "
                "second create; `orch reconcile` adopts it should it show later") from None
        raise exc

    def _look_for(self, label: str, exc: ProviderError, patient: bool) -> Remote | None:
        """The pod a failed create may have made: one look, or (``patient``) looks for
        ``create_lookup_seconds``, since a new pod may be missing from the listing for a while."""
        found, failed = self.find_within(label, self._just_made.grace if patient else 0)
        if found is None and failed is not None:
            raise ProviderError(f"creating {label} failed ({exc}), and listing pods to check whether it was made "
                                f"anyway failed too ({failed}): check the RunPod console or `orch reconcile` before "
                                "retrying") from None
        return found

    def get(self, provider_id: str) -> Remote:
        pod = self.api.query(pods.lookup(provider_id))["pod"]
        if pod is None:
            # A pod this process just made may not be visible yet: pending for the lookup window.
            return self._just_made.unseen(provider_id) or Remote(provider_id=provider_id, label="", status=Status.GONE)
        self._just_made.seen(provider_id)
        return pods.remote(pod, self.ssh_user)

    def list(self) -> list[Remote]:
        answer = self.api.query(pods.LISTING)
        try:
            found = answer["myself"]["pods"]
        except (KeyError, TypeError):
            found = None
        if not isinstance(found, list):
            raise ProviderError(f"RunPod's pod listing came back without pods: {str(answer)[:200]}")
        remotes = [pods.remote(p, self.ssh_user) for p in found if parse_label(p.get("name"))]
        return [r for r in remotes if r.status != Status.GONE]

    def never_answers(self, remote: Remote, waited: float) -> str | None:
        """A pod on a host whose driver is older than the image's CUDA never starts its container
        ("OCI runtime create failed"; RunPod docs, "Manage Pods", docs.runpod.io/pods/manage-pods):
        ``runtime`` stays null for ever while RunPod shows it RUNNING and it bills. A pod whose
        container has not started within ``container_start_minutes`` fails the wait for SSH with that
        reason, and ``orch up`` destroys it. (Every GPU create sends ``allowedCudaVersions`` against
        it: ``offers.cuda_for``.)"""
        return pods.never_started(remote, waited, self.number("container_start_minutes", CONTAINER_START_MINUTES) * 60)

    def stop(self, provider_id: str) -> None:
        """A GPU pod keeps its volume; a CPU pod has none and keeps nothing."""
        # Only the pod's volume disk (``/workspace``) survives a stop; the container disk is cleared
        # (RunPod docs, "Manage Pods", "Stop a Pod"; "Storage options", docs.runpod.io/pods/storage/types).
        # CPU pods have no volume disk (``pods.deploy``). They can be stopped and started (REST v2
        # ``POST /pods/{id}/action``: a stop releases "GPU/CPU compute"), but a stop keeps nothing of
        # theirs: a started CPU pod is a fresh container, its work dir included. While stopped it
        # bills nothing.
        if self._need(provider_id).status != Status.STOPPED:
            self.api.query(pods.stop(provider_id))

    def start(self, provider_id: str) -> Remote:
        # A stop releases the GPU, so a resume can be refused; the volume is kept meanwhile
        # ($0.20/GB-month stopped, ``offers.VOLUME_STOPPED_GB_MONTH``).
        remote = self._need(provider_id)
        if remote.status != Status.STOPPED:
            return remote
        resume = pods.resume(provider_id, int(remote.raw.get("gpuCount") or 0))

        def once() -> None:
            try:
                self.api.once(resume)
            except NoCapacity as e:
                raise StartRefused(pods.resume_refused(remote, e)) from None
            except http.Transient:
                if self.get(provider_id).status == Status.STOPPED:
                    raise
                # else the resume that errored happened all the same

        http.call(once, attempts=self.api.attempts, base=self.api.base)
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        # A pod this process made and RunPod has not shown since: once the lookup window has passed a
        # lookup calls it gone, yet its lookups may only lag (runpodctl issue #172): the terminate is
        # sent all the same (of a pod RunPod does not know, it is refused, and the pod is gone).
        if self.get(provider_id).status == Status.GONE and not self._just_made.never_seen(provider_id):
            return
        try:
            self.api.query(pods.terminate(provider_id))
        except ProviderError:
            if self.get(provider_id).status != Status.GONE:
                raise
            return
        # podTerminate answers the same whatever happened: only the pod's absence confirms it.
        deadline = time.monotonic() + self.number("destroy_timeout", 60)
        while self.get(provider_id).status != Status.GONE:
            if time.monotonic() >= deadline:
                raise ProviderError(f"RunPod did not confirm that pod {provider_id} is gone; it may "
                                    "still bill: check the RunPod console")
            time.sleep(self.poll_seconds)

    def _need(self, provider_id: str) -> Remote:
        remote = self.get(provider_id)
        if remote.status == Status.GONE:
            raise ProviderError(f"RunPod pod {provider_id} does not exist (any more)")
        return remote

    def offers(self, request: Request) -> list[Offer]:
        """Every GPU type's live on-demand price for ``request.gpus`` GPUs, in one query."""
        n = max(int(request.gpus), 1)
        types = self.api.query(prices_query(n))["gpuTypes"] or []
        if request.gpu:
            types = [resolve_gpu(request.gpu, types)]
        return offers_from(types, n, self.name)

    def self_stop_command(self, provider_id: str, destroy: bool) -> str:
        """Run inside the pod, stops (or terminates) it with the pod's own key (``self_stop``)."""
        return self_stop_command(destroy)

    # -- HasVolumes: network volumes (``volumes``) -------------------------------------------
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        return self.volumes.create(name, size_gb, where)

    def list_volumes(self) -> list[Volume]:
        return self.volumes.list()

    def delete_volume(self, volume: Volume) -> None:
        self.volumes.delete(volume)

    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        return reaches(self.volumes, offer, volume)
