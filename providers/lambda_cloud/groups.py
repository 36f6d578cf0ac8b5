"""A group's nodes: one instance type, one region, one launch.

Instances of one Lambda region reach each other at their ``private_ip``; no private network spans
regions. So a group's nodes all launch in one region, as SkyPilot's Lambda provisioner does
(https://github.com/skypilot-org/skypilot, sky/provision/lambda_cloud/instance.py: ``run_instances``
launches every node of a cluster in the one region it is given, and ``get_cluster_info`` gives each
node's ``private_ip`` as its internal address), and of one instance type: a multi-node run expects
the same GPUs on every node.

The nodes are one ``POST /instance-operations/launch`` with ``quantity`` N (Lambda's API reference,
launchInstance: "Launches one or more instances of a given instance type", ``quantity``: "Number of
instances to launch"; SkyPilot launches its workers so), which answers every new instance's id.
Launches are rate-limited (one per 12 s): a group of N is one launch, not N. The launch names
every instance after the first node; the others are then renamed to their own node's label
(``POST /instances/{id}``, "Update instance details": ``name``), so ``find(label)`` finds each.
All or nothing: should any of that fail, every instance the launch made is terminated first.
"""

from __future__ import annotations

import time
from dataclasses import replace

from orchestrator import parallel as par
from orchestrator.errors import NoCapacity, ProviderError
from orchestrator.provider import Offer, Remote, Request
from providers.lambda_cloud.api import ERRORS, LAUNCH_LOOKUP_SECONDS, LambdaError, LostLaunch, lambda_id

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
    """Every node of a group in one launch (``quantity``), renamed to its own label; rank order."""
    count, first = len(requests), requests[0]
    made: list[str] = []
    try:
        try:
            offer, region, answer = provider.send_launch(candidates, first, labels[0], key, quantity=count)
            ids = answer.get("instance_ids") if isinstance(answer, dict) else None
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise LambdaError(f"Lambda Cloud's launch of {count} answered without instance ids: {ids}")
            made = list(ids)
        except LostLaunch as lost:  # the answer was lost: look for what it made, by its name
            offer, region = lost.offer, lost.region
            try:
                made = _look_for(provider, labels[0], count, lost.error)
            except _Partial as partial:
                made = partial.found
                raise
        for pid in made:
            provider.just_made.made(pid)
        if len(made) != count:
            raise LambdaError(f"Lambda Cloud launched {len(made)} instances for a group of {count}: {made}")
        for pid, label in zip(made[1:], labels[1:]):
            provider.api.call("POST", f"/instances/{lambda_id(pid)}", {"name": label})
        remember(first.group, offer.offer_id, region)
        return [_made(provider, pid, offer, label) for pid, label in zip(made, labels)]
    except BaseException:
        give_back(provider, made)
        raise


def _made(provider, pid: str, offer: Offer, label: str) -> Remote:
    remote = provider.get(pid)
    if remote.label != label:  # not visible yet: what the launch asked for is what it is
        remote = replace(remote, label=label, price_hr=offer.price_hr, gpu_name=offer.gpu_name, gpus=offer.gpus)
    return remote


def _look_for(provider, name: str, count: int, error: ProviderError) -> list[str]:
    """After a group launch whose answer was lost: its instances by the name it gave them, looked for
    ``launch_lookup_seconds``. All of them, or the error (those that showed are terminated by the
    caller); never a second launch."""
    window = provider.number("launch_lookup_seconds", LAUNCH_LOOKUP_SECONDS)
    deadline = time.monotonic() + window
    while True:
        try:
            found, failed = [r.provider_id for r in provider.list() if r.label == name], None
        except ProviderError as e:
            found, failed = [], e
        if len(found) >= count or time.monotonic() >= deadline:
            break
        time.sleep(max(provider.poll_seconds, 0.05))
    if len(found) == count:
        return found
    seen = f"the listing failed too ({failed})" if failed else f"{len(found)} of its {count} instances showed"
    # Those that showed are given back with the rest (``launch``); the message says what is known.
    raise _Partial(f"Lambda Cloud's launch of group {name} failed ({error}), and {seen} within {window:g} s: "
                   "orch sends no second launch, and terminates what showed; the next reaper pass (or `orch "
                   "reconcile`) adopts any that shows later", found)


class _Partial(ProviderError):
    def __init__(self, message: str, found: list[str]):
        super().__init__(message)
        self.found = found


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
