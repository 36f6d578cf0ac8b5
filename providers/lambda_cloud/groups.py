"""A group's nodes: one instance type, one region, one launch per node.

Instances of one Lambda region reach each other at their ``private_ip``; no private network spans
regions. So a group's nodes all launch in one region, as SkyPilot's Lambda provisioner does
(github.com/skypilot-org/skypilot, sky/provision/lambda_cloud/instance.py: ``run_instances``
launches every node of a cluster in the one region it is given, and ``get_cluster_info`` gives each
node's ``private_ip`` as its internal address), and of one instance type: a multi-node run expects
the same GPUs on every node.

Each node is its own ``POST /instance-operations/launch``, named with its own label and carrying its
own request's ``file_system_names``/``file_system_mounts`` (a per-node volume is that node's alone).
Lambda's OpenAPI description v1.10.0 (https://cloud.lambda.ai/api/v1/openapi.json, as mirrored from
https://docs.lambda.ai/api/cloud/spec.json on 2026-05-23; vendored in tests/fakes/lambda_openapi.json)
has no ``quantity`` in InstanceLaunchRequest: a launch makes one instance. Launches are rate-limited
("one request per 12 seconds, or five requests per minute", the description's preamble), so the nodes
of a group of N launch ``launch_interval`` apart (``api.Session.launch``): about 12 s x (N - 1).

Node 0 takes the group's chosen (type, region) first, else the next with capacity; every later node
launches only as node 0 did (``send_launch``'s group rule), and a region that runs out of capacity
half-way fails the group. All or nothing: should any node fail, every node already made is
terminated before the error (which carries ``node_rank``, as ``RentsGroups.create_nodes`` does).
"""

from __future__ import annotations

from orchestrator import parallel as par
from orchestrator.errors import NoCapacity, ProviderError
from orchestrator.provider import Offer, Remote, Request
from providers.lambda_cloud.api import ERRORS, lambda_id

# The (instance type, region) each group's nodes launch as, shared by the provider objects its nodes use.
_GROUPS: dict[str, tuple[str, str]] = {}


def chosen(group: str | None) -> tuple[str, str] | None:
    """(instance type, region) of ``group``'s nodes; None: no group, or nothing chosen yet."""
    return _GROUPS.get(group or "")


def choose(group: str, candidates: list[Offer], wanted: str, region: str | None = None) -> None:
    """The cheapest candidate's first region with capacity (in ``region`` where the settings name one),
    for every node of ``group``: one type and one region. A node that finds them taken meanwhile
    fails the group (all or nothing), rather than launch another type or go elsewhere."""
    places = [(o.offer_id, r) for o in candidates for r in o.raw["regions"] if region in (None, r)]
    if not places:
        raise NoCapacity(f"Lambda Cloud has no capacity for {wanted} in " + (f"region {region}" if region else
                                                                             "any region") + " right now")
    _GROUPS[group] = places[0]


def remember(group: str, itype: str, region: str) -> None:
    _GROUPS[group] = (itype, region)


def forget(group: str) -> None:
    _GROUPS.pop(group, None)


def launch(provider, requests: list[Request], labels: list[str], key: str, candidates: list[Offer]) -> list[Remote]:
    """Every node of a group, one launch each (its own name and volumes), rank order; all or nothing."""
    made: list[Remote] = []
    try:
        for rank, (request, label) in enumerate(zip(requests, labels)):
            offer, region, remote = provider.launch_one(candidates, request, label, key, leader=rank == 0)
            made.append(remote)
            if rank == 0:  # where node 0 went, every other node goes
                remember(request.group, offer.offer_id, region)
        return made
    except BaseException as e:
        e.node_rank = len(made)  # which node failed, for the caller's message
        give_back(provider, [r.provider_id for r in made])
        raise


def give_back(provider, ids: list[str]) -> None:
    """Terminate what a failed group launch made: one terminate for all, then each confirmed gone;
    best effort (the caller looks each label up again, and reconcile adopts anything left)."""
    if not ids:
        return
    try:
        provider.api.call("POST", "/instance-operations/terminate", {"instance_ids": [lambda_id(i) for i in ids]})
    except ERRORS:
        pass  # each destroy below sends its own
    par.each(lambda pid: _destroyed(provider, pid), ids, len(ids))


def _destroyed(provider, pid: str) -> None:
    try:
        provider.destroy(pid)
    except ProviderError:
        pass
