"""A group's one region. Instances of one Lambda region reach each other at their ``private_ip``;
no private network spans regions. So a group's nodes all launch in one region, as SkyPilot's Lambda
provisioner does (https://github.com/skypilot-org/skypilot, sky/provision/lambda_cloud/instance.py:
``run_instances`` launches every node of a cluster in the one region it is given, and
``get_cluster_info`` gives each node's ``private_ip`` as its internal address)."""

from __future__ import annotations

from orchestrator.errors import NoCapacity
from orchestrator.provider import Offer

# The region each group's nodes launch in, shared by the provider objects its nodes use.
_GROUP_REGIONS: dict[str, str] = {}


def region_of(group: str | None) -> str | None:
    """The region ``group``'s nodes launch in (None: no group, or no region chosen)."""
    return _GROUP_REGIONS.get(group or "")


def choose(group: str, candidates: list[Offer], wanted: str) -> None:
    """The cheapest candidate's first region with capacity, for every node of ``group`` (a node that
    finds it taken meanwhile fails the group: all or nothing)."""
    regions = [r for o in candidates for r in o.raw["regions"]]
    if not regions:
        raise NoCapacity(f"Lambda Cloud has no capacity for {wanted} in any region right now")
    _GROUP_REGIONS[group] = regions[0]


def forget(group: str) -> None:
    _GROUP_REGIONS.pop(group, None)
