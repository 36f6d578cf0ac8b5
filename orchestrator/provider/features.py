"""What a provider can do beyond the verbs every provider has: each a mixin whose methods it
must write, and whose type is the capability (``isinstance(p, Stoppable)``), as dstack's
``ComputeWith...`` classes are. A provider that lacks one never pretends to have it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar

from orchestrator.provider.model import Offer, Remote, Request, Volume


class Stoppable(ABC):
    """Stops an instance, keeping its disk (which bills while stopped), and starts it again."""

    # The image makes new SSH host keys at every start (RunPod's images do): right after a start
    # that orch asked for and the provider confirmed, orch pins the new key instead of refusing it.
    new_host_key_on_start: ClassVar[bool] = False

    @abstractmethod
    def stop(self, provider_id: str) -> None:
        """Stop it, keeping its disk; returns once the provider accepted."""

    @abstractmethod
    def start(self, provider_id: str) -> Remote:
        """Ask for a start and return at once: the caller waits (bounded) for it to run."""

    def stops(self, spot: bool) -> bool:
        """Whether an instance rented this way can stop (an AWS one-time spot instance cannot)."""
        return True


class SelfEnding(ABC):
    """An instance can stop or destroy itself through the provider, with its own credentials:
    the on-instance watchdog's way out when nobody is watching."""

    @abstractmethod
    def self_stop_command(self, provider_id: str, destroy: bool) -> str | None:
        """A POSIX shell snippet that, run on the instance, stops (or destroys) it with the
        instance's own credentials (from its environment, never a command line); None where this
        instance has no way."""


class RentsGroups(ABC):
    """Rents groups of instances that reach each other on a private network, on every TCP port
    (`--nodes N`: a rendezvous and the collective traffic of a multi-node run). Each node's
    ``Remote.private_ip`` is where the others reach it; ``Request.group``, ``node_rank`` and
    ``nodes`` tell ``create`` which node it makes."""

    # Why a lost node cannot be rented alone in its place, its siblings kept, where the provider makes
    # a group whole or not at all (RunPod: no pod can be added to an Instant Cluster); None: it can.
    no_lone_replacement: ClassVar[str | None] = None

    @abstractmethod
    def open_group(self, group: str, request: Request) -> None:
        """Before a group's first node is created: what its nodes share at this provider (a rule
        that admits the group's members to each other, a placement group). Idempotent."""

    @abstractmethod
    def close_group(self, group: str) -> None:
        """After every node of the group is gone: give back what ``open_group`` made. Idempotent."""

    def create_nodes(self, requests: list[Request], labels: list[str], public_key: str) -> list[Remote]:
        """Create a group's nodes (``requests`` and ``labels`` in rank order) and return them in that
        order, all or nothing: on failure what was made is destroyed before the error is raised (the
        caller still looks each label up before it gives up). A provider whose API launches many
        instances in one request (EC2's ``MinCount=MaxCount``), or must launch them its own way
        (Lambda: one type in one region, each node its own launch), overrides this; the default
        creates one node after another."""
        made: list[Remote] = []
        try:
            for request, label in zip(requests, labels):
                made.append(self.create(request, label, public_key))  # type: ignore[attr-defined]
        except BaseException as e:
            e.node_rank = len(made)  # which node failed, for the caller's message
            for remote in made:
                try:
                    self.destroy(remote.provider_id)  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001 - the caller looks every label up again and destroys what it finds
                    pass
            raise
        return made

    def sweep_groups(self, live_groups: Callable[[], set[str]]) -> list[str]:
        """What the provider still holds for groups that have no live node any more, given back
        (``live_groups()``: the groups the ledger holds a live node of; ask it only when the provider
        holds something for a group, so that a quiet reaper pass reads nothing more). Returns what
        was removed; raises when something could not be (reconcile tries again at its next pass).
        Nodes end one by one (the reaper, the watchdog, a preemption) without ``close_group``;
        reconcile calls this at every pass. Nothing by default: a provider that keeps nothing per group."""
        return []


class HasVolumes(ABC):
    """Makes persistent volumes that outlive an instance and mounts them on the instances it rents
    (``Request.mounts``). A volume lives in one place (``volume_place`` names the kind: a data
    center, a region, a zone, a machine, a folder); only offers in that place can mount it."""

    volume_place: ClassVar[str] = "region"
    # Several instances may mount one volume at once (Lambda's filesystems): a group can share one.
    shared_volumes: ClassVar[bool] = False
    min_volume_gb: ClassVar[int] = 1
    max_volume_gb: ClassVar[int] = 16384

    @abstractmethod
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        """Make a volume tagged as orch's, named ``name``; ``where`` None: the provider's default place."""

    @abstractmethod
    def list_volumes(self) -> list[Volume]:
        """Every volume of orch's at this provider; a failure raises (never an empty list)."""

    @abstractmethod
    def delete_volume(self, volume: Volume) -> None:
        """Delete it; idempotent (a volume already gone is not an error)."""

    @abstractmethod
    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        """Whether an instance rented from ``offer`` can mount ``volume`` (same place)."""

    def mount_steps(self, mounts) -> list:
        """What makes each of ``mounts`` (the ``Request.mounts`` its create attached) ready on the
        instance, for ``playbooks.volumes.prepare`` to run over SSH once SSH answers and before
        anything else runs there (and again after every start). By default the create mounted
        each at its path: only checked."""
        from playbooks.volumes import Present

        return [Present(m.path) for m in mounts]

    def mount_path_problem(self, path: str) -> str | None:
        """Why a volume cannot be mounted at ``path`` on this provider's instances (said before
        anything is made); None: it can. By default an absolute path, not ``/`` itself."""
        import posixpath

        if not path.startswith("/") or posixpath.normpath(path) in ("/", "//") or "/../" in path + "/":
            return f"a volume mounts at an absolute path such as /data, not {path!r}"
        return None


def can_stop(provider, spot: bool) -> bool:
    """Whether an instance of ``provider`` rented this way (spot or not) can be stopped."""
    return isinstance(provider, Stoppable) and provider.stops(spot)


def self_end_commands(provider, provider_id: str, spot: bool) -> dict[str, str]:
    """The shell commands with which an instance stops / destroys itself ({} where it cannot)."""
    if not isinstance(provider, SelfEnding):
        return {}
    verbs = (("stop", False), ("destroy", True)) if can_stop(provider, spot) else (("destroy", True),)
    found = {verb: provider.self_stop_command(provider_id, destroy=destroy) for verb, destroy in verbs}
    return {verb: command for verb, command in found.items() if command}
