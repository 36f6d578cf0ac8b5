"""A RunPod group (`--nodes N`) is one Instant Cluster: N pods of one shape in one data center on a
private network, made all or nothing by one ``POST /v2/clusters`` and ended together by one
``DELETE /v2/clusters/{id}`` (RunPod API v2 reference, "Create a cluster", "Delete a cluster": it
"terminates all of its member pods"; docs.runpod.io/instant-clusters).

- Which GPU types and data centers offer clusters: the catalog with ``product=CLUSTER``
  (``GET /v2/catalog/gpus?include=AVAILABILITY&product=CLUSTER&count=G``); a type offered in no data
  center is refused before anything is asked, and the create names only the data centers that have it.
- The cluster carries orch's group in its name (``orch-grp-<group id>-<NAME>``): a cluster has no
  tags, and its member pods cannot be renamed ("cannot be modified or deleted via the pod
  endpoints", the Pod schema's ``cluster``). A node's own label is found through the cluster of its
  group's name and its rank (``find``).
- Each member is a full pod (``GET /v2/clusters/{id}/pods``) with ``cluster {id, rank, ip}``: rank 0
  is the primary, and ``ip`` its address on the cluster network, which orch gives every node as
  the group's private addresses (``ORCH_MASTER_ADDR`` is the primary's, as the cluster's own
  ``PRIMARY_ADDR``/``MASTER_ADDR``).
- Members cannot be stopped or deleted alone (``DELETE /v2/pods/{id}``: 409 for a cluster member):
  ending one node ends its cluster, and a lost member is no node to replace alone.
- A create whose answer is an error RunPod may have acted on is looked for by its name, never sent
  again blindly; any failure once the cluster exists (a member that never shows, Ctrl-C) deletes it.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider import Remote, Request, parse_label
from providers.runpod import pods
from providers.runpod.api import NotFound, create_once, path_id
from providers.runpod.offers import resolve_gpu, stocked_centers, type_name
from providers.runpod.volumes import network_mount

PREFIX = "orch-grp-"
MEMBERS_SECONDS = 300.0  # how long a new cluster may take to list all its members with their ranks


def cluster_name(group: str, name: str) -> str:
    return f"{PREFIX}{group}-{name}"


def group_of(name: Any) -> str | None:
    """The orch group id a cluster's name carries; None for a cluster that is not orch's."""
    if not isinstance(name, str) or not name.startswith(PREFIX):
        return None
    group = name[len(PREFIX):].split("-", 1)[0]
    return group or None


def group_name(labels: list[str]) -> str:
    """The group's NAME, from its head's label (``orch-<id>-NAME-0``)."""
    parsed = parse_label(labels[0])
    node = parsed[1] if parsed else labels[0]
    return node.rsplit("-", 1)[0]


class Clusters:
    """One account's Instant Clusters, through its provider's v2 session."""

    def __init__(self, provider):
        self.p = provider
        self.api = provider.api

    # -- what can be rented -------------------------------------------------------------
    def placement(self, request: Request) -> tuple[str, list[str]]:
        """(GPU type id, data centers) of a cluster of ``request.gpus`` GPUs per pod, from the catalog
        (product=CLUSTER); a type that no data center offers clusters of is refused, nothing asked."""
        quote = request.quote
        if quote is not None and quote.raw.get("product") == "CLUSTER" and quote.raw.get("dataCenters"):
            return quote.offer_id, list(quote.raw["dataCenters"])  # the plan's cluster offer, as it was listed
        wanted = quote.offer_id if quote is not None else (request.gpu or self.p.settings.get("gpu"))
        if not wanted:
            raise UsageError("say which GPU to rent on RunPod (--gpu, e.g. 'H100 SXM')")
        types = self.p.catalog(max(int(request.gpus), 1), product="CLUSTER", clouds=("SECURE",))["SECURE"]
        t = resolve_gpu(str(wanted), types)
        centers = stocked_centers(t)
        if not centers:
            offered = sorted({type_name(x) for x in types if stocked_centers(x)})
            raise UsageError(f"--nodes {request.nodes}: RunPod offers no Instant Cluster of {type_name(t)} "
                             f"x{request.gpus} per node in any data center now (its catalog, product=CLUSTER); "
                             f"those it offers: {', '.join(offered) or 'none'}")
        return str(t["id"]), centers

    def check(self, request: Request) -> None:
        """Refused before anything is made: what a cluster cannot be."""
        if request.cpu:
            raise UsageError(f"--nodes {request.nodes}: RunPod's Instant Clusters are GPU pods: drop --cpu")
        if request.node_mounts:
            raise UsageError("RunPod's Instant Clusters mount the same network volume on every node: "
                             "per-node volumes cannot be given")
        if request.mounts and len(request.mounts) > 1:
            raise UsageError("a RunPod cluster mounts one network volume: name one volume")

    # -- made, found, ended -------------------------------------------------------------
    def create(self, requests: list[Request], labels: list[str], public_key: str) -> list[Remote]:
        first, count = requests[0], len(requests)
        self.check(first)
        gpu_type, centers = self.placement(first)
        mount = network_mount(first)
        if mount is not None:
            where = first.mounts[0].volume.where
            if where not in centers:
                raise NoCapacity(f"RunPod offers no Instant Cluster of {first.gpu} in {where}, where volume "
                                 f"{first.mounts[0].volume.name} is: nothing was asked")
            centers = [where]
        name = cluster_name(first.group or "x", group_name(labels))
        image = str(first.image or self.p.setting("image", pods.DEFAULT_IMAGE))
        body: dict[str, Any] = {
            "name": name, "type": "TRAINING",
            "compute": {"gpuTypeId": gpu_type, "gpuCountPerPod": int(first.gpus), "podCount": count},
            "image": image, "env": {"PUBLIC_KEY": public_key.strip(), **{k: str(v) for k, v in first.env.items()}},
            "ports": ["22/tcp"], "startSsh": True, "dataCenterIds": centers,
            "disk": max(int(self.p.setting("container_disk_gb", 20)), int(first.disk_gb)),
        }
        if mount is not None:
            body["mounts"] = {"network": [mount]}
        cluster = self._send(body, name)
        try:
            members = self._members(cluster["id"], count)
            made = []
            for rank, label in enumerate(labels):
                remote = pods.remote(members[rank], self.p.ssh_user)
                self.p._just_made.made(remote.provider_id)
                made.append(_as_node(remote, label))
            return made
        except BaseException:
            self.delete(cluster["id"])
            raise

    def _send(self, body: dict, name: str) -> dict:
        """``POST /v2/clusters`` once; after an answer RunPod may have acted on, the cluster looked
        for by its name (for ``create_lookup_seconds``), never a second create."""
        made = create_once(lambda: self.api.once("POST", "/clusters", body),
                           lambda: next((c for c in self.list() if c.get("name") == name), None), f"cluster {name}",
                           self.p._just_made.grace, self.p.poll_seconds, self.api.attempts, self.api.base)
        if not isinstance(made, dict) or not made.get("id"):
            raise ProviderError(f"RunPod's cluster create answered without a cluster: {str(made)[:200]}")
        return made

    def _members(self, cluster_id: str, count: int) -> dict[int, dict]:
        """The cluster's member pods by rank, once all ``count`` are listed with a rank (a rank is
        "null until the index is assigned during provisioning", PodCluster.rank)."""
        deadline = time.monotonic() + self.p.number("cluster_members_seconds", MEMBERS_SECONDS)
        while True:
            answer = self.api.call("GET", f"/clusters/{path_id(cluster_id)}/pods")
            found = answer.get("pods") if isinstance(answer, dict) else None
            ranked = {}
            for pod in found if isinstance(found, list) else []:
                rank = (pod.get("cluster") or {}).get("rank") if isinstance(pod, dict) else None
                if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < count:
                    ranked[rank] = pod
            if len(ranked) == count:
                return ranked
            if time.monotonic() >= deadline:
                raise ProviderError(f"RunPod's cluster {cluster_id} listed {len(ranked)} of its {count} pods with a "
                                    "rank in time: it is deleted")
            time.sleep(max(self.p.poll_seconds, 0.05))

    def list(self) -> list[dict]:
        answer = self.api.call("GET", "/clusters")
        found = answer.get("clusters") if isinstance(answer, dict) else None
        if not isinstance(found, list):
            raise ProviderError(f"RunPod's cluster listing came back without clusters: {str(answer)[:200]}")
        return [c for c in found if isinstance(c, dict) and c.get("id")]

    def delete(self, cluster_id: str) -> None:
        """End the cluster and every member; one already gone is no error."""
        try:
            self.api.call("DELETE", f"/clusters/{path_id(cluster_id)}")
        except NotFound:
            pass

    def of_group(self, group: str) -> list[dict]:
        return [c for c in self.list() if group_of(c.get("name")) == group]

    def find(self, label: str) -> Remote | None:
        """A node of an orch group by its label (``orch-<id>-NAME-R``): the member of rank R of the
        live cluster made for NAME."""
        parsed = parse_label(label)
        if not parsed or "-" not in parsed[1]:
            return None
        name, _, rank = parsed[1].rpartition("-")
        if not rank.isdigit():
            return None
        for cluster in self.list():
            cname = str(cluster.get("name") or "")
            group = group_of(cname)
            if group is None or cname != cluster_name(group, name):
                continue
            answer = self.api.call("GET", f"/clusters/{path_id(cluster['id'])}/pods")
            for pod in (answer or {}).get("pods") or []:
                if isinstance(pod, dict) and (pod.get("cluster") or {}).get("rank") == int(rank):
                    return _as_node(pods.remote(pod, self.p.ssh_user), label)
        return None


def _as_node(remote: Remote, label: str) -> Remote:
    from dataclasses import replace

    return replace(remote, label=label)
