"""Volumes in use: which instance mounts which volume, where it may run, and what it finds there.

- **Placing** (``place``): the volumes a task names (``volume_uses``), found in the ledger, give the
  provider that rents (a volume is mounted only by its own provider's instances) and
  ``Request.mounts`` (``node_mounts`` for a group: node R's own). The plan then ranks only offers
  where every volume lives (``HasVolumes.offer_reaches``: RunPod's data center, Lambda's region,
  AWS's zone, Vast's machine) and says so in its line; a relaunch after a loss is planned the same
  way, so it goes where the volume is or fails with one line saying why.
- **Mounting** (``make_ready``): once SSH answers and before anything else runs there (provisioning,
  a job's ``setup``), on every start too, each mount is made ready (``HasVolumes.mount_steps`` for
  ``playbooks.volumes``) and checked as the login user: a directory it can write. One that cannot
  be ends the instance (``Orch.up`` destroys what fails) and keeps the volume: the error says so.
- **Using**: every command of a job finds ``ORCH_VOLUMES`` (``NAME=PATH``, one per line, in the
  task's order) and ``ORCH_VOLUME_<NAME>`` (``volume_uses.env_name``); ``HF_HOME`` points into the
  first volume (``<path>/hf``) unless the task sets its own, so the hub's downloads survive the
  machine; a LibreYOLO job stages its dataset there once (``staging``, ``training``).
"""

from __future__ import annotations

import shlex
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Iterator

from orchestrator import states
from orchestrator.errors import NoCapacity, OrchError, UsageError
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.model import Mount, Request, Volume
from orchestrator.volumes.volume_uses import Use, env_name

HF_DIR = "hf"  # HF_HOME inside the first volume
DATA_DIR = "orch-data"  # where a LibreYOLO job's datasets are staged on the first volume


def as_volume(row) -> Volume:
    """A ledger row (a model or a ``volume_snapshot`` row) as the ``Volume`` a provider mounts."""
    made = row.created_at.timestamp() if isinstance(row.created_at, datetime) else None
    return Volume(name=row.name, provider=row.provider, volume_id=row.provider_id or "", where=row.place or "",
                  size_gb=row.size_gb, price_gb_month=row.price_gb_month, created_at=made)


@dataclass
class Placement:
    """Where a task's volumes put it: the provider, each node's mounts, and the line that says so."""

    provider: str
    node_mounts: tuple[tuple[Mount, ...], ...]  # rank order; one entry for a lone instance
    where: str  # "volume data lives on runpod (data center EU-RO-1)"
    volumes: tuple[Volume, ...] = field(default_factory=tuple)  # every one, for ``offer_reaches``

    def request(self, request: Request) -> Request:
        """``request`` with rank 0's mounts, and every node's when it is a group."""
        return replace(request, mounts=self.node_mounts[0],
                       node_mounts=self.node_mounts if len(self.node_mounts) > 1 else ())


def place(picture, uses: list[Use], nodes: int, providers: list[str] | None, provider_of,
          busy: type[OrchError] = UsageError) -> Placement:
    """The task's volumes found in ``picture`` (``volume_snapshot.read``), checked against what they
    are asked for; ``provider_of(name)`` builds a provider. Unknown, not ready, on another provider
    than the one named, unshareable by a group, a path the provider refuses: ``UsageError``. A
    volume that another live instance holds (where the provider mounts one volume once): ``busy``."""
    live = {v.name: v for v in picture.volumes if v.state in states.VOLUME_LIVE}
    per_rank: list[tuple[Mount, ...]] = []
    found: dict[str, object] = {}
    for rank in range(max(nodes, 1)):
        mounts = []
        for use in uses:
            name = use.volume(rank)
            row = live.get(name)
            if row is None:
                hint = f" (node {rank} of {nodes} mounts {name}: per_node names one volume per rank)" \
                    if use.per_node else ""
                raise UsageError(f"unknown volume {name!r}{hint}: `orch volume ls` lists them, `orch volume create "
                                 f"{name} --provider P --size GB` makes one")
            if row.state != states.VOLUME_READY:
                raise UsageError(f"volume {name} is {row.state}, not ready (`orch volume ls`)")
            found[name] = row
            mounts.append(Mount(as_volume(row), use.path, use.name))
        per_rank.append(tuple(mounts))
    homes = sorted({r.provider for r in found.values()})
    if len(homes) > 1:
        raise UsageError(f"the volumes live on {', '.join(homes)}: one instance mounts volumes of one provider")
    provider_name = homes[0]
    if providers and provider_name not in providers:
        raise UsageError(f"volume {next(iter(found))} is on {provider_name}, not {', '.join(providers)}: its "
                         f"instance is rented there (--provider {provider_name}, or name none)")
    provider = provider_of(provider_name)
    if not isinstance(provider, HasVolumes):
        raise UsageError(f"{provider_name} mounts no volumes")
    for use in uses:
        problem = provider.mount_path_problem(use.path)
        if problem:
            raise UsageError(f"volume {use.name}: {problem}")
        if nodes > 1 and not use.per_node and not provider.shared_volumes:
            raise UsageError(f"volume {use.name}: one {provider_name} volume is mounted by one instance at a time, "
                             f"and the group has {nodes} nodes: give each node its own ({use.name}-0 ...; "
                             "`per_node: true`, or --volume NAME:PATH:per-node)")
    if not provider.shared_volumes:
        for name, row in found.items():
            holders = [a["instance"] for a in picture.attached_to(row.id)]
            if holders:
                raise busy(f"volume {name} is attached to {', '.join(holders)} (a {provider_name} volume is mounted "
                           f"by one instance at a time): `orch down` it first")
    rows = list(found.values())
    spots = sorted({r.place if provider.volume_place == "folder" and r.place else
                    f"{provider.volume_place} {r.place}" if r.place else provider.volume_place for r in rows})
    names = ", ".join(found)
    where = (f"volume{'s' if len(rows) > 1 else ''} {names} live{'' if len(rows) > 1 else 's'} on {provider_name} "
             f"({'; '.join(spots)})")
    return Placement(provider_name, tuple(per_rank), where, tuple(as_volume(r) for r in rows))


def for_cli(uses: list[Use], nodes: int, providers: list[str] | None) -> Placement:
    """``place`` for a command line, before anything is opened: the ledger read as it is (no ledger
    yet: no volume), each provider built from its settings."""
    from orchestrator import config
    from orchestrator.provider import plugins
    from orchestrator.volumes import volume_snapshot

    return place(volume_snapshot.read(volume_snapshot.Unopened(config.database_url())), uses, nodes, providers or None,
                 lambda name: plugins.provider_class(name)(config.provider_settings(name), config.home()))


def for_flags(flags: list[str] | None, nodes: int, providers: list[str] | None) -> list[dict] | None:
    """A job's ``--volume`` flags (a task file's ``volumes:`` written as flags), each volume found
    where the job may rent, before anything is opened: what its spec keeps of them (None: none)."""
    from orchestrator.volumes.volume_uses import flags as parse

    uses = parse(flags)
    if not uses:
        return None
    for_cli(uses, nodes, providers)
    return [u.to_dict() for u in uses]


def narrow(orch, request: Request, uses: list[dict] | None, nodes: int, providers: list[str] | None
           ) -> tuple[Request, list[str] | None, str]:
    """What a plan asks for, with the job's volumes placed: (the request with its mounts, the
    providers to ask: the volumes' own, a line to add to the plan's: where they live). Without
    volumes, all as they were. A relaunch calls this again: a volume deleted meanwhile fails the
    job (``UsageError``), one still held by the last attempt's instance waits (``NoCapacity``)."""
    if not uses:
        return request, providers, ""
    from orchestrator.volumes import volume_snapshot

    placed = place(volume_snapshot.read(orch.ledger), [Use.from_dict(u) for u in uses], nodes, providers,
                   orch.provider, busy=NoCapacity)
    return placed.request(request), [placed.provider], f"only where the {placed.where}"


def volumes_of(request: Request) -> tuple[Volume, ...]:
    """Every volume a request mounts, on any node."""
    seen = {m.volume.name: m.volume for ms in (request.mounts, *request.node_mounts) for m in ms}
    return tuple(seen.values())


# -- on the instance ------------------------------------------------------------------------------
def record(orch, inst, mounts) -> None:
    """Which volumes ``inst`` mounts, on the ledger before its provider is asked to make it: from
    then on each is attached while the instance lives. A volume deleted meanwhile fails the row
    (nothing was asked of the provider)."""
    from orchestrator.volumes import ledger_volumes

    try:
        ledger_volumes.attach(orch.ledger, inst.id, inst.name,
                              [(m.volume.name, m.as_name or m.volume.name, m.path) for m in mounts], orch.actor)
    except UsageError as e:
        orch.move(inst, states.FAILED, f"not made: {e}")
        raise


def same_as(orch, inst) -> tuple[Mount, ...]:
    """The mounts ``inst`` was made with, as the ledger recorded them: what a node rented in its
    place (``groups.replace_node``) mounts (its own per-node volume, or the group's shared one)."""
    from orchestrator.volumes import ledger_volumes

    return tuple(Mount(as_volume(v), m.path, as_name=m.use_name) for m, v in ledger_volumes.mounts_of(orch.ledger, inst.id))


def make_ready(orch, inst) -> None:
    """Every volume ``inst`` mounts, ready at its path before anything runs there: the provider's
    steps (``HasVolumes.mount_steps``, run by ``playbooks.volumes``), then each path checked as the
    login user, its place on the instance recorded. Raises one line when one is not: the caller
    ends the instance, and the volume is kept."""
    from orchestrator.volumes import ledger_volumes
    from orchestrator.ssh import remote
    from playbooks import volumes as on_instance

    found = ledger_volumes.mounts_of(orch.ledger, inst.id)
    if not found:
        return
    provider = orch.provider(inst.provider)
    names = ", ".join(v.name for _, v in found)
    try:
        with orch.connect(inst) as c:
            home = remote.run(c, 'printf %s "$HOME"').strip()
            mounts = [Mount(as_volume(v), expand(m.path, home)) for m, v in found]
            steps = provider.mount_steps(mounts) if isinstance(provider, HasVolumes) else []
            if steps:
                on_instance.prepare(c, steps)
            for mount in mounts:
                q = shlex.quote(mount.path)
                if remote.run(c, f"test -d {q} && test -w {q}/. && echo ok", check=False).strip() != "ok":
                    raise OrchError(f"{mount.path} is no folder the login user can write")
    except OrchError as e:
        from orchestrator.text import why

        raise OrchError(f"volume {names} could not be mounted on {inst.name} ({why(e)}): {inst.name} ends, "
                        f"the volume{'s are' if len(found) > 1 else ' is'} kept") from None
    for (m, _), mount in zip(found, mounts):
        if m.host_path != mount.path:
            ledger_volumes.set_host_path(orch.ledger, m.id, mount.path)
    orch.ledger.note(inst.id, "volumes mounted: " + ", ".join(f"{v.name} at {mount.path}" for (_, v), mount
                                                              in zip(found, mounts)), orch.actor)


def expand(path: str, home: str) -> str:
    """``~/x`` in the instance's home."""
    return home.rstrip("/") + path[1:] if path.startswith("~/") else path


def mounted(orch, inst) -> list[tuple[str, str]]:
    """(the name the task used, the path on the instance) of each volume ``inst`` mounts, in order."""
    from orchestrator.volumes import ledger_volumes

    return [(m.use_name, m.host_path or m.path) for m, _ in ledger_volumes.mounts_of(orch.ledger, inst.id)]


def env(orch, inst, given: dict[str, str] | None = None, secrets=()) -> dict[str, str]:
    """What every command on ``inst`` finds of its volumes: ``ORCH_VOLUMES``, ``ORCH_VOLUME_<NAME>``,
    and ``HF_HOME`` in the first volume where the task (``given``, its ``secrets``) sets none."""
    found = mounted(orch, inst)
    if not found:
        return {}
    out = {"ORCH_VOLUMES": "\n".join(f"{name}={path}" for name, path in found)}
    out.update({env_name(name): path for name, path in found})
    if "HF_HOME" not in (given or {}) and "HF_HOME" not in secrets:
        out["HF_HOME"] = f"{found[0][1]}/{HF_DIR}"
    return out


_staging: dict[str, threading.Lock] = {}
_staging_guard = threading.Lock()
STAGE_WAIT_S = 6 * 3600.0  # another stager of the same volume: what uploading a big dataset may take


@contextmanager
def staging(orch, inst) -> Iterator[tuple[str, str] | None]:
    """Where a LibreYOLO job stages its dataset on ``inst``: (``orch-data`` in its first volume, that
    volume's id; None without one), held for one stager at a time per volume: the nodes of a group sharing one stage
    in turn (a thread each: one lock per volume in this process) as do jobs of other orch processes
    (the volume's claim), so the second finds what the first staged instead of unpacking over it."""
    from orchestrator.ledger import claims
    from orchestrator.volumes import ledger_volumes

    found = ledger_volumes.mounts_of(orch.ledger, inst.id)
    if not found:
        yield None
        return
    mount, row = found[0]
    with _staging_guard:
        lock = _staging.setdefault(row.id, threading.Lock())
    with lock, claims.hold(orch.ledger, f"volume-data:{row.id}", wait=STAGE_WAIT_S):
        yield f"{mount.host_path or mount.path}/{DATA_DIR}", row.id
