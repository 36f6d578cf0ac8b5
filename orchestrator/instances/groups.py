"""A group: N instances of one offer rented together (`--nodes N`), all or nothing, ended together.

A group is not a new kind of machine: each node is an ordinary instance row (so sync, the reaper,
the watchdog, reconcile and the cost report see it like any other) named ``NAME-R`` and marked
with its group (``group_id``, one per bring-up; ``group_name`` NAME), its rank (0 is the head,
where a rendezvous listens) and the group's size. Nothing here knows what runs on the nodes:
``up`` takes ``launch``, the kind-specific part (a LibreYOLO training under torchrun,
``group_training``; a user's command), called once every node is ready with the nodes in rank
order. Every node finds the same variables in its environment (``nodes.node_env``).

- **Up.** One bring-up for 1..N machines, ``Orch.up_nodes`` (a machine is a group of one: one
  ``orch up`` keeps its own name and a row without group fields). Here every check of a group
  first (the name, the size, the provider's ``groups`` capability), its claim and its nodes' names
  and fields; there every node's row (before anything can bill), the provider's ``open_group``
  (what the nodes share: a rule admitting each other, a placement group) and one ``create_nodes``
  call for all of them (EC2's ``MinCount=MaxCount``; one create after another elsewhere, Lambda's
  included: its launch makes one); then every node's bring-up (SSH, provisioning, the proof) at
  once. The first node that fails calls the others' bring-up off (they are waiting or provisioning,
  not done), and so does Ctrl-C: every node made so far is destroyed before the error goes on, and
  nothing bills.
- **One node lost** (``replace_node``): a node is rented in its place, same group, rank and name,
  while its siblings are kept (``jobs.engine`` starts the work again on the whole group).
- **Down.** Every node destroyed at once, then the provider's ``close_group``.
- **One.** The reaper and the watchdog's decisions see a group as one (``busy``): no node is
  stopped or destroyed for idleness while another of its group still trains.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from orchestrator import states
from orchestrator.ledger import claims
from orchestrator.errors import OrchError, UsageError
from orchestrator.ledger.ledger import Instance, new_id
from orchestrator.provider import RentsGroups, Request
from orchestrator.provisioning import MACHINE, Provisioning
from orchestrator.text import why as _why

MAX_NODES = 64
MAX_GROUP_NAME = 37  # its nodes are NAME-0 .. NAME-63: 40 characters at most


def node_name(group: str, rank: int) -> str:
    return f"{group}-{rank}"


def check_nodes(nodes: int) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes must be between 1 and {MAX_NODES}, not {nodes}")


def check_name(name: str, nodes: int) -> None:
    if nodes > 1 and len(name) > MAX_GROUP_NAME:
        raise UsageError(f"a group's name has at most {MAX_GROUP_NAME} characters (its nodes are {name}-0, "
                         f"{name}-1, ...), not {len(name)}")


def check_batch(batch: int | None, nodes: int, procs_per_node: int, default: int | None) -> None:
    """LibreYOLO's ``batch`` is the global batch, split evenly over the world (nodes x processes per
    node): one that does not divide is refused before anything is rented; autobatch (-1) cannot
    be split the same on every node, so a group names its batch."""
    if nodes <= 1:
        return
    world = nodes * procs_per_node
    value = default if batch is None else batch
    if value is None or value == -1:
        raise UsageError(f"--nodes {nodes}: give --batch, the global batch, a multiple of {world} "
                         f"({nodes} nodes x {procs_per_node} per node); autobatch cannot be split across nodes")
    if value % world:
        raise UsageError(f"--batch {value} does not divide by the world size {world} ({nodes} nodes x "
                         f"{procs_per_node} per node): use a multiple of {world}")


def check_provider(provider, nodes: int, request: Request) -> None:
    """The provider's own word on a group (a feature it implements, never its name)."""
    if nodes > 1 and not isinstance(provider, RentsGroups):
        from orchestrator.provider import plugins

        able = sorted(n for n, cls in plugins.providers().items() if issubclass(cls, RentsGroups))
        raise UsageError(f"--nodes {nodes}: {provider.name} cannot rent a group of instances ({provider.groups_refused}); "
                         f"providers that rent a group: {', '.join(able)}")


# -- the ledger's view of groups -----------------------------------------------------------------
def members(ledger, inst: Instance, replaced: bool = False) -> list[Instance]:
    """Every node of ``inst``'s group, rank order (``[inst]`` for a lone instance): for each rank
    its newest row (a node replaced alone keeps its rank: ``replace_node``), or with ``replaced``
    every row the group ever had (what it cost)."""
    if not inst.group_id:
        return [inst]
    from sqlmodel import select

    with ledger.session(write=False) as s:
        rows = sorted(s.exec(select(Instance).where(Instance.group_id == inst.group_id)),
                      key=lambda i: (i.node_rank or 0, i.created_at))
    if replaced:
        return rows
    newest = {i.node_rank or 0: i for i in rows}  # created_at order: the last one of a rank wins
    return [newest[r] for r in sorted(newest)]


def live(ledger, name: str) -> list[Instance]:
    """The live nodes of the newest group named ``name``, rank order; [] when none lives."""
    from sqlmodel import select

    with ledger.session(write=False) as s:
        rows = list(s.exec(select(Instance).where(Instance.group_name == name, Instance.state.in_(states.LIVE))
                           .order_by(Instance.created_at.desc())))
    if not rows:
        return []
    newest = rows[0].group_id
    return sorted((r for r in rows if r.group_id == newest), key=lambda i: i.node_rank or 0)


def is_group(inst: Instance | None) -> bool:
    return inst is not None and bool(inst.group_id) and (inst.group_size or 1) > 1


def resolve(orch, name: str, node: int | None = None) -> Instance:
    """The instance a command names: an instance called ``name``, or node ``node`` (default 0, the
    head: status, logs, monitor and pull read rank 0) of the group called ``name``."""
    nodes = live(orch.ledger, name)
    if nodes:
        rank = 0 if node is None else node
        found = next((n for n in nodes if n.node_rank == rank), None)
        if found is None:
            raise UsageError(f"group {name} has nodes 0-{len(nodes) - 1} (see `orch status {name}`), not {rank}")
        return found
    inst = orch.ledger.by_name(name)
    if inst is None:
        raise UsageError(f"no live instance named {name!r} (see `orch status`)")
    if node is not None:
        raise UsageError(f"{name} is a single instance, not a group: drop --node")
    return inst


def refuse_alone(inst: Instance, verb: str) -> None:
    """A node is never stopped, started or destroyed alone: its group trains as one."""
    if is_group(inst):
        raise UsageError(f"{inst.name} is node {inst.node_rank} of group {inst.group_name}: a group is {verb} as one "
                         f"(`orch down {inst.group_name}` ends every node)")


# -- up and down ---------------------------------------------------------------------------------
def names(name: str, nodes: int) -> list[str]:
    """Each node's instance name, rank order: one machine keeps its own name, a group's are NAME-R."""
    return [name] if nodes == 1 else [node_name(name, r) for r in range(nodes)]


def up(orch, name: str, provider_name: str, request: Request, nodes: int, *, policy: str | None = None,
       ssh_timeout: float | None = None, launch: Callable[[list[Instance]], None] | None = None,
       prepare: Provisioning | None = MACHINE) -> list[Instance]:
    """Rent ``nodes`` instances of one offer, all at once, all or nothing, through the one bring-up
    (``Orch.up_nodes``); then ``launch`` on them (rank order). One is the instance ``name``
    (``Orch.up``: its name's claim, an interrupted one finished); several are group ``name``.
    Whatever fails destroys every node; the error says which node and why. ``prepare``: what makes
    each node ready once SSH answers (None: reached over SSH only, a command group's setup is its own)."""
    check_nodes(nodes)
    if nodes == 1:  # a row as every single machine's: no group fields, its own name
        return [orch.up(name, provider_name, request, ssh_timeout=ssh_timeout, policy=policy, prepare=prepare,
                        after_verify=(lambda inst: launch([inst])) if launch else None)]
    check_name(name, nodes)
    provider = orch.provider(provider_name)
    check_provider(provider, nodes, request)
    with claims.hold(orch.ledger, f"group:{name}"):  # a colon: no instance name takes this claim
        _free(orch, name, nodes)
        group = new_id()
        nodes_named = names(name, nodes)
        requests = [replace(request, name=node, group=group, node_rank=r, nodes=nodes,
                            mounts=request.node_mounts[r] if request.node_mounts else request.mounts)  # its volumes
                    for r, node in enumerate(nodes_named)]
        orch.check_up(provider_name, replace(request, nodes=nodes), nodes_named, requests)  # the GPUs shared locally
        fields = [{"group_id": group, "group_name": name, "node_rank": r, "group_size": nodes} for r in range(nodes)]
        launched: list = []  # the launch's own error goes on as it is

        def launch_all(ready: list[Instance]) -> None:
            try:
                launch(ready)
            except BaseException as e:
                launched.append(e)
                raise

        try:
            return orch.up_nodes(provider_name, nodes_named, requests, policy, fields, ssh_timeout=ssh_timeout,
                                 launch=launch_all if launch else None, prepare=prepare)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) or launched:
                raise
            rank = getattr(e, "node_rank", None)
            which = f"node {rank} of {nodes} ({node_name(name, rank)})" if isinstance(rank, int) else f"its {nodes} nodes"
            raise (UsageError if isinstance(e, UsageError) else OrchError)(
                f"group {name}: {which} could not be had ({_why(e)}); the nodes made were destroyed: nothing of "
                "the group bills") from e


def replace_node(orch, lost: Instance, request: Request, *, policy: str | None = None,
                 ssh_timeout: float | None = None, prepare: Provisioning | None = MACHINE,
                 halted: Callable[[], str | None] | None = None) -> Instance:
    """One node rented in place of ``lost`` (destroyed first, if it is not gone yet): the same
    group, rank and name, so its siblings keep theirs. ``request`` is the group's (same offer: the
    same region, and the group's placement group where the provider keeps one). ``halted``: why
    its bring-up is called off (``Orch.bring_up``: what was made is destroyed)."""
    from orchestrator.volumes import volume_mounts

    mounts = volume_mounts.same_as(orch, lost)  # its volumes: free again once it is gone
    if lost.state in states.LIVE:
        orch.down(orch.ledger.get(lost.id), f"node {lost.node_rank} of {lost.group_name} lost: replaced alone")
    req = replace(request, name=lost.name, group=lost.group_id, node_rank=lost.node_rank or 0,
                  nodes=lost.group_size or 1, mounts=mounts, node_mounts=())
    fields = {"group_id": lost.group_id, "group_name": lost.group_name, "node_rank": lost.node_rank,
              "group_size": lost.group_size}
    return orch.up(lost.name, lost.provider, req, ssh_timeout=ssh_timeout, policy=policy, prepare=prepare,
                   group=fields, halted=halted)


def _free(orch, name: str, nodes: int) -> None:
    """The group's name and every node's name are free (checked again per node as each is made)."""
    if live(orch.ledger, name):
        raise UsageError(f"a group named {name!r} already exists (`orch status {name}`)")
    taken = orch.ledger.by_name(name)
    if taken is not None:
        raise UsageError(f"an instance named {name!r} already exists ({taken.state})")
    for rank, node in enumerate(names(name, nodes)):
        taken = orch.ledger.by_name(node)
        if taken is not None:
            raise UsageError(f"an instance named {taken.name!r} already exists ({taken.state}): the group's node "
                             f"{rank} would take that name")


def down(orch, nodes: list[Instance], reason: str) -> list[Instance]:
    """Destroy every node at once; then what the provider made for the group (``Orch.down_all``).
    Raises when a node could not be destroyed (after trying them all: the others are gone)."""
    return orch.down_all(nodes, reason)


# -- one group, one decision ---------------------------------------------------------------------
def busy(orch, inst: Instance, is_busy: Callable[[Instance], bool]) -> bool:
    """Whether any other live node of ``inst``'s group is busy (``is_busy``): the reaper's idle
    rules then leave ``inst`` alone, so no node is ended while its group still trains."""
    return any(n.id != inst.id and n.state in states.LIVE and is_busy(n) for n in members(orch.ledger, inst))


def env(nodes: list[Instance], rank: int, gpus_per_node: int) -> dict[str, str]:
    """``nodes.node_env`` for node ``rank`` of a ready group (rank order)."""
    from orchestrator.nodes import node_env

    ips = [n.private_ip or n.ssh_host for n in nodes]
    return node_env(rank, ips, gpus_per_node)


def hourly(nodes: list[Instance]) -> float:
    return sum(n.price_hr or 0.0 for n in nodes)
