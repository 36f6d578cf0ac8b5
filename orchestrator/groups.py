"""A group: N instances of one offer rented together (`--nodes N`), all or nothing, ended together.

A group is not a new kind of machine: each node is an ordinary instance row (so sync, the reaper,
the watchdog, reconcile and the cost report see it like any other) named ``NAME-R`` and marked
with its group (``group_id``, one per bring-up; ``group_name`` NAME), its rank (0 is the head,
where a rendezvous listens) and the group's size. Nothing here knows what runs on the nodes:
``up`` takes ``launch``, the kind-specific part (a LibreYOLO training under torchrun,
``group_training``; a user's command), called once every node is ready with the nodes in rank
order. Every node finds the same variables in its environment (``nodes.node_env``).

- **Up.** Every check first (the name, the size, the provider's ``groups`` capability), then the
  provider's ``open_group`` (what the nodes share: a rule admitting each other, a placement group),
  then every node's ``Orch.up`` at once, one thread each: the group is ready in the time of its
  slowest node, not the sum. Any node that cannot be had (no capacity, no SSH, a failed verify)
  fails the group: the nodes already made are destroyed, in parallel, and nothing bills.
- **Down.** Every node destroyed at once, then the provider's ``close_group``.
- **One.** The reaper and the watchdog's decisions see a group as one (``busy``): no node is
  stopped or destroyed for idleness while another of its group still trains.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from orchestrator import claims, states
from orchestrator import parallel as par
from orchestrator.errors import OrchError, UsageError
from orchestrator.ledger import Instance, new_id
from orchestrator.provider import RentsGroups, Request
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
        raise UsageError(f"--nodes {nodes}: {provider.name} cannot rent a group of instances ({provider.groups_refused})")


# -- the ledger's view of groups -----------------------------------------------------------------
def members(ledger, inst: Instance) -> list[Instance]:
    """Every node of ``inst``'s group, rank order (``[inst]`` for a lone instance)."""
    if not inst.group_id:
        return [inst]
    from sqlmodel import select

    with ledger.session(write=False) as s:
        rows = list(s.exec(select(Instance).where(Instance.group_id == inst.group_id)))
    return sorted(rows, key=lambda i: (i.node_rank or 0, i.created_at))


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
def up(orch, name: str, provider_name: str, request: Request, nodes: int, *, policy: str | None = None,
       ssh_timeout: float | None = None, launch: Callable[[list[Instance]], None] | None = None) -> list[Instance]:
    """Rent ``nodes`` instances as group ``name``, all at once, all or nothing; then ``launch`` on
    them (rank order). Whatever fails destroys every node; the error says which node and why."""
    check_nodes(nodes)
    check_name(name, nodes)
    provider = orch.provider(provider_name)
    provider.validate(request)
    check_provider(provider, nodes, request)
    with claims.hold(orch.ledger, f"group:{name}"):  # a colon: no instance name takes this claim
        _free(orch, name, nodes)
        group = new_id()
        if isinstance(provider, RentsGroups):  # a group of one needs nothing shared
            provider.open_group(group, request)

        def bring(rank: int) -> Instance:
            node = node_name(name, rank)
            mine = replace(orch, say=lambda m, node=node: orch.say(f"[{node}] {m}"))
            req = replace(request, name=node, group=group, node_rank=rank, nodes=nodes)
            return mine.up(node, provider_name, req, ssh_timeout=ssh_timeout, policy=policy,
                           group={"group_id": group, "group_name": name, "node_rank": rank, "group_size": nodes})

        # Every node at once, every outcome gathered, then judged.
        outcomes = par.each(bring, list(range(nodes)), nodes)
        errors = [(rank, e) for rank, (_, e) in enumerate(outcomes) if e is not None]
        if errors:
            rank, error = min(errors, key=lambda x: x[0])
            _destroy_group(orch, group, f"node {rank} of {nodes} could not be had: {_why(error)}")
            if isinstance(error, KeyboardInterrupt):
                raise error
            raise OrchError(f"group {name}: node {rank} of {nodes} ({node_name(name, rank)}) could not be had "
                            f"({_why(error)}); the other nodes were destroyed: nothing of the group bills")
        ready = [orch.ledger.get(i.id) for i, _ in outcomes]
        if launch is not None:
            try:
                launch(ready)
            except BaseException as e:
                _destroy_group(orch, group, f"the launch on the group failed: {_why(e)}")
                raise
        return [orch.ledger.get(i.id) for i in ready]


def _free(orch, name: str, nodes: int) -> None:
    """The group's name and every node's name are free (checked again per node as each is made)."""
    if live(orch.ledger, name):
        raise UsageError(f"a group named {name!r} already exists (`orch status {name}`)")
    taken = orch.ledger.by_name(name)
    if taken is not None:
        raise UsageError(f"an instance named {name!r} already exists ({taken.state})")
    for rank in range(nodes):
        taken = orch.ledger.by_name(node_name(name, rank))
        if taken is not None:
            raise UsageError(f"an instance named {taken.name!r} already exists ({taken.state}): the group's node "
                             f"{rank} would take that name")


def _destroy_group(orch, group: str, reason: str) -> None:
    nodes = _by_id(orch.ledger, group)
    down(orch, nodes, reason)


def _by_id(ledger, group: str) -> list[Instance]:
    from sqlmodel import select

    with ledger.session(write=False) as s:
        return sorted(s.exec(select(Instance).where(Instance.group_id == group)), key=lambda i: i.node_rank or 0)


def down(orch, nodes: list[Instance], reason: str) -> list[Instance]:
    """Destroy every node at once; then what the provider made for the group. Raises when a node
    could not be destroyed (after trying them all: the others are gone)."""
    live_nodes = [n for n in nodes if orch.ledger.get(n.id).state in states.LIVE]
    # Gathered: a node that could not be destroyed stops none of the others.
    outcomes = par.each(lambda node: orch.down(orch.ledger.get(node.id), reason), live_nodes, len(live_nodes))
    errors = [(node, e) for node, (_, e) in zip(live_nodes, outcomes) if e is not None]
    if errors:
        node, error = errors[0]
        raise OrchError(f"could not destroy {node.name} ({_why(error)}): it may bill; `orch down "
                        f"{node.group_name or node.name}` again")
    provider = orch.provider(nodes[0].provider) if nodes and nodes[0].group_id else None
    if isinstance(provider, RentsGroups):
        try:
            provider.close_group(nodes[0].group_id)
        except OrchError as e:
            orch.say(f"orch: warning: the group's shared resources at {nodes[0].provider} were not removed "
                     f"({_why(e)}); nothing there bills, `orch reconcile` tries again")
    return [orch.ledger.get(n.id) for n in nodes]


# -- one group, one decision ---------------------------------------------------------------------
def busy(orch, inst: Instance, is_busy: Callable[[Instance], bool]) -> bool:
    """Whether any other live node of ``inst``'s group is busy (``is_busy``): the reaper's idle
    rules then leave ``inst`` alone, so no node is ended while its group still trains."""
    if not is_group(inst):
        return False
    return any(n.id != inst.id and n.state in states.LIVE and is_busy(n) for n in members(orch.ledger, inst))


def env(nodes: list[Instance], rank: int, gpus_per_node: int) -> dict[str, str]:
    """``nodes.node_env`` for node ``rank`` of a ready group (rank order)."""
    from orchestrator.nodes import node_env

    ips = [n.private_ip or n.ssh_host for n in nodes]
    return node_env(rank, ips, gpus_per_node)


def hourly(nodes: list[Instance]) -> float:
    return sum(n.price_hr or 0.0 for n in nodes)
