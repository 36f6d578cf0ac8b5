"""The RunPod provider's verbs over its pods, through REST API v2 (``api`` sends the requests, ``pods``
writes the create body, ``offers`` reads the catalog, ``volumes`` the network volumes)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from orchestrator.errors import AuthError, NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.provider import (Capabilities, Offer, Provider, Remote, Request, SelfEnding, Status, Stoppable,
                                   http, parse_label)
from orchestrator.provider.features import HasVolumes, RentsGroups
from orchestrator.provider.model import Volume
from orchestrator.provider.grace import JustMade
from providers.runpod import pods
from providers.runpod.clusters import Clusters, group_of
from providers.runpod.api import Conflict, MaybeMade, NotFound, Rest, credentials_file_key, path_id
from providers.runpod.offers import (CLOUDS, CUDA_SETTING, catalog_query, cuda_for, in_stock, offers_from, out_of_stock,
                                     resolve_gpu, stocked_centers, type_name)
from providers.runpod.self_stop import self_stop_command
from providers.runpod.volumes import MAX_GB, MIN_GB, NetworkVolumes, network_mount, reaches, volume_center

CONTAINER_START_MINUTES = 5.0  # RunPod's own images are cached on its hosts; a big custom image may need more
CREATE_LOOKUP_SECONDS = 60.0  # how long a pod a failed create may have made is looked for (``create``)


class RunPodProvider(Provider, Stoppable, SelfEnding, HasVolumes, RentsGroups):
    """RunPod GPU and CPU pods, network volumes (``volumes``), and groups as Instant Clusters (``clusters``)."""

    name = "runpod"
    numeric_settings = {"retries": 1, "retry_base": 0, "poll_interval": 0, "container_disk_gb": 1,
                        "destroy_timeout": 0, "container_start_minutes": 0.01, "create_lookup_seconds": 0}
    other_settings = ("api_key", "cpu_instance", "gpu", "image", "min_cuda")
    # Spot pods are gone: ``podRentInterruptable`` and ``podBidResume`` were removed from the API on
    # 2026-09-11 (runpod/runpodctl PR #267; dstackai/gpuhunt commit 249b01c "runpod will drop its spot
    # pods on September 11th"). ``spot=False``; offers carry no spot price.
    capabilities = Capabilities(spot=False, cpu_only=True, gpu=True)
    # RunPod's images delete the SSH host keys and make new ones at every start
    # (github.com/runpod/containers, official-templates/base/start.sh).
    new_host_key_on_start = True
    env_keys = ("RUNPOD_API_KEY", "RUNPOD_API_BASE_URL")
    credentials = "RUNPOD_API_KEY, or api_key under [providers.runpod] in config.toml"
    # A group is one Instant Cluster (``clusters``): its members are made and deleted with it only (the
    # v2 Pod schema's ``cluster``: "cannot be modified or deleted via the pod endpoints"; "Create a
    # cluster" takes the whole shape, and no route adds a pod to one).
    no_lone_replacement = ("RunPod cannot add a pod to an Instant Cluster (its members are made and deleted with "
                           "the cluster only): the whole cluster is relaunched")
    resolve_gpu = staticmethod(resolve_gpu)
    # A network volume lives in one data center, and several pods may mount it at once (RunPod docs,
    # "Storage options": network volumes are shareable across Pods).
    volume_place, shared_volumes, min_volume_gb, max_volume_gb = "data center", True, MIN_GB, MAX_GB

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        cuda = self.settings.get("min_cuda")
        if cuda not in (None, "") and not (isinstance(cuda, str) and CUDA_SETTING.fullmatch(cuda.strip())):
            raise UsageError(f"[providers.runpod] min_cuda must be a CUDA version such as \"12.4\", not {cuda!r}")
        self.api = Rest(self.settings.get("api_key"), attempts=int(self.setting("retries", 5)),
                        base=self.number("retry_base", 0.5))
        # A new pod that ``GET /v2/pods/{id}`` does not show yet is pending, not gone (``create``, ``get``).
        self._just_made = JustMade(self.number("create_lookup_seconds", CREATE_LOOKUP_SECONDS))
        self.volumes = NetworkVolumes(self.api, self._every_pod, self.number("create_lookup_seconds", CREATE_LOOKUP_SECONDS),
                                      self.poll_seconds)
        self.clusters = Clusters(self)

    @property
    def poll_seconds(self) -> float:
        return self.number("poll_interval", 2.0)

    def configured(self) -> bool:
        # The runpod CLI's own credentials file, read without its SDK.
        return bool(os.environ.get("RUNPOD_API_KEY") or self.settings.get("api_key")
                    or os.path.exists(os.path.expanduser("~/.runpod/config.toml")) and credentials_file_key())

    # -- the catalog -------------------------------------------------------------------
    def catalog(self, gpus: int, product: str = "POD", clouds: tuple[str, ...] = CLOUDS) -> dict[str, list[dict]]:
        """Every GPU type with its prices and its stock for ``gpus`` GPUs, per cloud: one request each,
        side by side (the catalog's availability is for one cloud, SECURE when none is named)."""
        from orchestrator import parallel

        def ask(cloud: str) -> list[dict]:
            answer = self.api.call("GET", "/catalog/gpus", query=catalog_query(product, gpus, cloud))
            types = answer.get("gpus") if isinstance(answer, dict) else None
            if not isinstance(types, list):
                raise ProviderError(f"RunPod's GPU catalog came back without GPU types: {str(answer)[:200]}")
            return types

        answers = parallel.each(ask, list(clouds), len(clouds))
        for _, error in answers:
            if error is not None:
                raise error
        return {cloud: types for cloud, (types, _) in zip(clouds, answers)}

    def _placement(self, request: Request) -> tuple[str, str, list[str]]:
        """(GPU type id, cloud, data centers) a GPU pod is created for: the plan's quote as it was
        listed (no second listing), else the cheapest cloud with the type in stock, per the catalog
        asked now. Only data centers the catalog shows it in stock in: none is no create at all. With
        a network volume: Secure Cloud in the volume's data center (RunPod docs, "Network volumes")."""
        center = volume_center(request)
        quote = request.quote
        if quote is not None and quote.raw.get("cloud") in CLOUDS:
            offers = [quote]
            name = quote.gpu_name
        else:
            wanted = quote.offer_id if quote is not None else (request.gpu or self.settings.get("gpu"))
            if not wanted:
                raise UsageError("say which GPU to rent on RunPod (--gpu, e.g. 'RTX 4090'), or use --cpu")
            n = max(int(request.gpus), 1)
            by_cloud = self.catalog(n)
            t = resolve_gpu(str(wanted), [t for types in by_cloud.values() for t in types])
            offers = offers_from({c: [x for x in types if x.get("id") == t["id"]] for c, types in by_cloud.items()}, n,
                                 self.name)
            name = type_name(t)
        stocked = in_stock(offers)
        if center is not None:
            stocked = [o for o in stocked if o.raw.get("cloud") == "SECURE" and center in o.raw["dataCenters"]]
            if not stocked:
                raise NoCapacity(f"RunPod's catalog shows {name} x{request.gpus} out of stock on Secure Cloud in "
                                 f"{center}, where volume {request.mounts[0].volume.name} is: nothing was asked")
            return stocked[0].offer_id, "SECURE", [center]
        if not stocked:
            raise NoCapacity(f"RunPod's catalog shows {name} x{request.gpus} {out_of_stock(offers)}: nothing was asked")
        best = stocked[0]
        return best.offer_id, best.raw["cloud"], list(best.raw["dataCenters"])

    # -- verbs -------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        if request.spot:
            raise UsageError("RunPod has no spot pods any more (removed from its API on 2026-09-11): drop --spot")
        super().validate(request)
        if not request.cpu and request.gpus < 1:
            raise UsageError("a RunPod GPU pod needs at least one GPU (or use --cpu)")
        if request.quote is not None and not request.cpu and request.quote.provider != self.name:
            raise UsageError(f"an offer of {request.quote.provider} cannot be rented on RunPod")
        if request.cpu and request.nodes <= 1:
            pods.cpu_config(str(self.setting("cpu_instance", pods.DEFAULT_CPU_INSTANCE)))
        if request.nodes > 1:  # one Instant Cluster: what it cannot be, and whether RunPod offers it now
            self.clusters.check(request)
            self.clusters.placement(request)

    # A create can fail after the pod was made (a 500: runpod/runpodctl issue #172, and Transformer Lab's
    # client, api/transformerlab/compute_providers/runpod.py ``_recover_pod_after_error``), and a new pod
    # may be missing from the listing for a while (Transformer Lab retries its lookup "to absorb listing
    # lag"). After such an answer the pod is looked up by its name (the orch label) for
    # ``create_lookup_seconds``, and no second create is ever sent for it: never two pods for one
    # intent. A refusal that made nothing (a 429, no capacity) is looked up once, then retried.
    def create(self, request: Request, label: str, public_key: str) -> Remote:
        if request.nodes > 1:
            raise ProviderError("RunPod cannot add a pod to an Instant Cluster, nor make one node of a group alone: "
                                "a group is made whole (its cluster relaunched)")
        self.validate(request)
        sent = self._body(request, label, public_key)

        def once() -> dict | Remote:
            try:
                return self.api.once("POST", "/pods", sent)
            except AuthError:
                raise  # a rejected key created nothing, and would not list either
            except ProviderError as exc:
                return self._made_after_all(label, exc)

        # Only a refusal that made nothing is sent again (a Transient that is no MaybeMade).
        pod = http.call(once, attempts=self.api.attempts, base=self.api.base)
        if isinstance(pod, Remote):
            return pod
        if not isinstance(pod, dict) or not pod.get("id"):
            raise ProviderError(f"RunPod's pod create answered without a pod: {str(pod)[:200]}")
        # A create that answered is given the same window: a new pod that ``GET /v2/pods/{id}`` does
        # not show yet is pending, not gone.
        self._just_made.made(pod["id"])
        remote = self.get(pod["id"])
        # Not visible to a lookup yet (the lag its listing shows): pending, as the create's answer says.
        return pods.remote(pod, self.ssh_user) if remote.status == Status.GONE or not remote.label else remote

    def _body(self, request: Request, label: str, public_key: str) -> dict:
        image = str(request.image or self.setting("image", pods.DEFAULT_IMAGE))
        shape: dict[str, Any] = {"image": image, "container_gb": int(self.setting("container_disk_gb", 20)),
                                 "network": network_mount(request)}
        if request.cpu:
            shape["cpu_instance"] = str(self.setting("cpu_instance", pods.DEFAULT_CPU_INSTANCE))
            if volume_center(request):
                shape["centers"] = [volume_center(request)]
        else:
            gpu_type, cloud, centers = self._placement(request)
            shape.update(gpu_type=gpu_type, cloud=cloud, centers=centers,
                         cuda=cuda_for(image, str(self.setting("min_cuda", ""))))
        return pods.body(request, label, public_key, **shape)

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

    def _pod(self, provider_id: str) -> dict | None:
        """``GET /v2/pods/{id}``; None when RunPod does not know it (any more)."""
        try:
            pod = self.api.call("GET", f"/pods/{path_id(provider_id)}")
        except NotFound:
            return None
        if not isinstance(pod, dict) or not pod.get("id"):
            raise ProviderError(f"RunPod answered pod {provider_id} without a pod: {str(pod)[:200]}")
        return pod

    def get(self, provider_id: str) -> Remote:
        pod = self._pod(provider_id)
        if pod is None or pod.get("status") == "TERMINATED":
            if pod is None:
                # A pod this process just made may not be visible yet: pending for the lookup window.
                unseen = self._just_made.unseen(provider_id)
                if unseen is not None:
                    return unseen
            return Remote(provider_id=provider_id, label=str((pod or {}).get("name") or ""), status=Status.GONE)
        self._just_made.seen(provider_id)
        return pods.remote(pod, self.ssh_user)

    def _every_pod(self, clusters: bool = True) -> list[dict]:
        """Every pod of the account as v2 answers it (cluster members too: they are left out of
        ``GET /v2/pods`` unless ``includeClusterPods=true``, the Pod schema's ``cluster``)."""
        answer = self.api.call("GET", "/pods", query={"includeClusterPods": "true"} if clusters else None)
        found = answer.get("pods") if isinstance(answer, dict) else None
        if not isinstance(found, list):
            raise ProviderError(f"RunPod's pod listing came back without pods: {str(answer)[:200]}")
        return [p for p in found if isinstance(p, dict) and p.get("id")]

    def list(self) -> list[Remote]:
        remotes = [pods.remote(p, self.ssh_user) for p in self._every_pod(clusters=False) if parse_label(p.get("name"))]
        return [r for r in remotes if r.status != Status.GONE]

    def never_answers(self, remote: Remote, waited: float) -> str | None:
        """A pod on a host whose driver is older than the image's CUDA never starts its container
        ("OCI runtime create failed"; RunPod docs, "Manage Pods", docs.runpod.io/pods/manage-pods):
        it stays STARTING, with no SSH published, for ever while it bills. A pod whose container has
        not started within ``container_start_minutes`` fails the wait for SSH with that reason, and
        ``orch up`` destroys it. (Every GPU create sends ``allowedCudaVersions`` against it:
        ``offers.cuda_for``.)"""
        return pods.never_started(remote, waited, self.number("container_start_minutes", CONTAINER_START_MINUTES) * 60)

    def _action(self, provider_id: str, action: str) -> None:
        self.api.once("POST", f"/pods/{path_id(provider_id)}/action", {"action": action})

    def stop(self, provider_id: str) -> None:
        """A GPU pod keeps its volume; a CPU pod has none and keeps nothing."""
        # Only the pod's volume disk (``/workspace``) survives a stop; the container disk is cleared
        # (RunPod docs, "Manage Pods", "Stop a Pod"; "Storage options", docs.runpod.io/pods/storage/types).
        # CPU pods have no volume disk (``pods.body``). A stop releases "GPU/CPU compute" (v2 ``POST
        # /pods/{id}/action``); a started CPU pod is a fresh container, its work dir included. While
        # stopped it bills nothing.
        remote = self._need(provider_id)
        if remote.raw.get("cluster"):
            raise ProviderError(f"RunPod pod {provider_id} is a member of Instant Cluster "
                                f"{remote.raw['cluster'].get('id')}: members cannot be stopped (only the whole "
                                "cluster deleted: `orch down` the group)")
        if remote.status == Status.STOPPED:
            return

        def once() -> None:
            try:
                self._action(provider_id, "stop")
            except (Conflict, http.Transient):  # 409: not in a state that stops; a 5xx: maybe done
                if self.get(provider_id).status != Status.STOPPED:
                    raise

        http.call(once, attempts=self.api.attempts, base=self.api.base)

    def start(self, provider_id: str) -> Remote:
        # A stop releases the GPU, so a start can be refused; the volume is kept meanwhile
        # ($0.20/GB-month stopped, ``offers.VOLUME_STOPPED_GB_MONTH``). A stopped pod "resumes onto
        # the same host" (the Pod schema's cudaVersion): its GPU count is its own.
        remote = self._need(provider_id)
        if remote.status not in (Status.STOPPED, Status.BROKEN):
            return remote

        def once() -> None:
            try:
                self._action(provider_id, "start")
            except NoCapacity as e:
                raise StartRefused(pods.resume_refused(remote, e)) from None
            except (Conflict, http.Transient):
                if self.get(provider_id).status in (Status.STOPPED, Status.BROKEN):
                    raise
                # else the start that errored happened all the same

        http.call(once, attempts=self.api.attempts, base=self.api.base)
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        # A pod this process made and RunPod has not shown since: once the lookup window has passed a
        # lookup calls it gone, yet its lookups may only lag (runpodctl issue #172): the delete is
        # sent all the same (of a pod RunPod does not know, it is a 404, and the pod is gone).
        found = self.get(provider_id)
        if found.status == Status.GONE and not self._just_made.never_seen(provider_id):
            return
        cluster = (found.raw.get("cluster") or {}).get("id")
        try:
            if cluster:  # a member is ended with its whole cluster (deletePod: 409 for a member)
                self.clusters.delete(str(cluster))
            else:
                self.api.call("DELETE", f"/pods/{path_id(provider_id)}")
        except NotFound:
            return
        except ProviderError:
            if self.get(provider_id).status != Status.GONE:
                raise
            return
        # Only the pod's absence confirms it: a 204 is an accepted request.
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
        """Every GPU type's offer in each cloud for ``request.gpus`` GPUs, with its stock per data
        center, from the catalog (one request per cloud). A type out of stock everywhere in a cloud
        is an offer with no price (never ranked) whose ``note`` says so."""
        n = max(int(request.gpus), 1)
        if request.nodes > 1:  # a group is an Instant Cluster: its own product, on Secure Cloud
            by_cloud = self.catalog(n, product="CLUSTER", clouds=("SECURE",))
        else:
            by_cloud = self.catalog(n)
        if request.gpu:
            t = resolve_gpu(request.gpu, [t for types in by_cloud.values() for t in types])
            by_cloud = {c: [x for x in types if x.get("id") == t["id"]] for c, types in by_cloud.items()}
        return offers_from(by_cloud, n, self.name, cluster=request.nodes > 1)

    def self_stop_command(self, provider_id: str, destroy: bool) -> str | None:
        """Run inside the pod, stops (or terminates) it with the pod's own key (``self_stop``). None for
        a cluster's member: it can neither stop nor delete itself (409), and its pod-scoped key reaches
        no cluster route; orch's reaper ends the cluster instead."""
        try:
            member = bool(self.get(provider_id).raw.get("cluster"))
        except ProviderError:
            member = False
        return None if member else self_stop_command(destroy)

    # -- HasVolumes: network volumes (``volumes``) -------------------------------------------
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        stocked: dict[str, int] = {}
        if where is None:  # where most GPU types are in stock on Secure Cloud now
            for t in self.catalog(1, clouds=("SECURE",))["SECURE"]:
                for center in stocked_centers(t):
                    stocked[center] = stocked.get(center, 0) + 1
        return self.volumes.create(name, size_gb, self.volumes.place(where, stocked))

    def list_volumes(self) -> list[Volume]:
        return self.volumes.list()

    def delete_volume(self, volume: Volume) -> None:
        self.volumes.delete(volume)

    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        return reaches(offer, volume)

    # -- RentsGroups: a group is one Instant Cluster (``clusters``) ---------------------------
    def open_group(self, group: str, request: Request) -> None:
        """Nothing to make before the cluster: it brings its own private network."""

    def close_group(self, group: str) -> None:
        for cluster in self.clusters.of_group(group):
            self.clusters.delete(str(cluster["id"]))

    def create_nodes(self, requests: list[Request], labels: list[str], public_key: str) -> list[Remote]:
        """Every node in one ``POST /v2/clusters`` (all or nothing), rank order."""
        return self.clusters.create(requests, labels, public_key)

    def find(self, label: str) -> Remote | None:
        found = super().find(label)
        if found is None and re.search(r"-\d+$", label):  # a group's node (NAME-R): a cluster's member
            found = self.clusters.find(label)
        return found

    def sweep_groups(self, live_groups) -> list[str]:
        """Clusters of orch's whose group has no live node in the ledger: deleted (every member with them)."""
        mine = [c for c in self.clusters.list() if group_of(c.get("name"))]
        if not mine:
            return []
        live = live_groups()
        swept = []
        for cluster in mine:
            if group_of(cluster["name"]) not in live:
                self.clusters.delete(str(cluster["id"]))
                swept.append(f"cluster {cluster['name']} ({cluster['id']})")
        return swept
