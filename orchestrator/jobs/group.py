"""What `orch run --nodes N` adds to a job (``jobs.engine``): one attempt is one group.

An attempt of a group job rents the group ``NAME-aK`` (nodes ``NAME-aK-0`` ...); its ``attempts``
row points at the head (rank 0), whose run is the job's run. At every look, besides what ``jobs``
reads from the head (its state, its training), every other node is checked (``lost_node``): gone,
stopped, broken, preempted, unreachable past ``job_unreachable_minutes``, or its work ended in a
way its kind calls a failure (``JobKind.node_failed``: a LibreYOLO training's error in its log).
Any of these ends the attempt: the work is ended on every node that still answers (a lost peer
leaves the others waiting on the process group for hours) and the newest intact checkpoint is
kept (taken from the head where it still answers). Where the other nodes answer (``unusable``),
the lost node alone is replaced, rented while that stop and that pull go on (``replace``), and
attempt K+1 runs on the same group (``engine._replace``); else the whole group is destroyed and
the next attempt rents a fresh one. Either way the checkpoint goes on EVERY node (LibreYOLO
resumes from ``last.pt`` on each).
``--retries`` counts both; ``--max-cost`` counts every machine (``cost``: replaced ones too).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from orchestrator import states
from orchestrator.instances import groups
from orchestrator.errors import OrchError, SSHError
from orchestrator.text import why as _why


def nodes_of(orch, inst) -> list:
    return groups.members(orch.ledger, inst)


def cost(orch, inst) -> float:
    """What every node of ``inst``'s group cost (``inst`` alone when it is no group)."""
    from orchestrator.money.cost import instance_cost

    return sum(instance_cost(n, orch.ledger.events(n.id), orch.ledger.runs(n.id)).total_usd
               for n in groups.members(orch.ledger, inst, replaced=True))


def hourly(orch, inst) -> float:
    """What the group bills per hour while it runs (its running nodes)."""
    return sum(n.price_hr or 0.0 for n in nodes_of(orch, inst) if n.state == states.READY)


def lost_node(orch, head, bound_minutes: float, kind) -> tuple[str, object] | None:
    """Why the group of ``head`` is lost through one of its other nodes, and that node; or None. A
    node the provider did not answer for is looked at again next time (nothing is known). ``kind``
    (the job's ``JobKind``) says what a node's ended work means."""
    from playbooks import runs as run_tasks

    for node in nodes_of(orch, head):  # one machine has no other node
        if node.id == head.id:
            continue
        try:
            node = orch.refresh(node)
        except OrchError:
            continue
        if node.state in states.IN_PROGRESS:
            continue
        if node.state != states.READY:
            return f"node {node.node_rank} ({node.name}) is {node.state}", node
        run = orch.ledger.latest_run(node.id)
        if run is None or not run.run_dir:
            return f"node {node.node_rank} ({node.name}) has no training", node
        try:
            with orch.connect(node) as c:
                raw = run_tasks.status(c, run.run_dir, run.pid)
                tail = "" if raw.get("alive") else run_tasks.tail_log(c, 60)
        except SSHError as e:
            since = orch.ledger.recall(node.id, "unreachable_since")
            now = datetime.now(timezone.utc)
            if since is None:
                orch.ledger.remember(node.id, unreachable_since=now.isoformat())
                continue
            away = (now - datetime.fromisoformat(since)).total_seconds() / 60
            if away >= bound_minutes:
                return f"node {node.node_rank} ({node.name}) unreachable for {away:.1f} min ({_why(e)})", node
            continue
        if orch.ledger.recall(node.id, "unreachable_since") is not None:
            orch.ledger.remember(node.id, unreachable_since=None)
        failed = kind.node_failed(tail) if not raw.get("alive") else None
        if failed:
            return f"node {node.node_rank} ({node.name}): {failed}", node
    return None


def unusable(orch, survivors: list) -> str | None:
    """Why the survivors of a lost node cannot carry on with a replacement, or None: each must be
    ready at its provider and answer over SSH now (all asked at once: the replacement waits for
    the answers; the lowest rank's reason is the one given)."""
    from orchestrator import parallel as par
    from orchestrator.ssh import remote

    if not survivors:
        return "no node survived"

    def why_not(node) -> str | None:
        try:
            node = orch.refresh(node)
        except OrchError as e:
            return f"{node.provider} did not answer for node {node.node_rank} ({_why(e)})"
        if node.state != states.READY:
            return f"node {node.node_rank} ({node.name}) is {node.state} too"
        try:
            with orch.connect(node) as c:
                remote.run(c, "true")
        except OrchError as e:
            return f"node {node.node_rank} ({node.name}) does not answer either ({_why(e)})"
        return None

    for why, error in par.each(why_not, survivors, len(survivors)):
        if error is not None:
            raise error
        if why:
            return why
    return None


def end_runs(orch, head) -> list[str]:
    """End the run on every node of the group that still answers."""
    from orchestrator.runs import runs

    return runs.stop(orch, nodes_of(orch, head))


def destroy(orch, inst, reason: str) -> None:
    """Destroy every live node of ``inst``'s group at once (raises when one could not be)."""
    groups.down(orch, nodes_of(orch, inst), reason)


def replace(orch, lost, request, beside: Callable[[], None], **up):
    """``groups.replace_node`` (``up``: its options) while ``beside`` runs (what the lost attempt
    leaves to keep: the survivors' work ended, the newest checkpoint pulled), neither waiting for
    the other; returns the new node once both have ended. Ctrl-C calls the rental off (what it made
    is destroyed) and is raised once both have ended, a node that was ready by then destroyed first:
    nothing rented for the replacement bills. The rental's failure is raised after ``beside`` ended
    (the whole group's relaunch starts from its checkpoint); ``beside``'s, with the new node destroyed."""
    from orchestrator import parallel as par

    outcomes: list = [(None, None), (None, None)]
    what = f"node {lost.node_rank} of {lost.group_name}"

    def rent():
        return groups.replace_node(orch, lost, request, **up,
                                   halted=lambda: f"interrupted (Ctrl-C): {what} not replaced" if halt else None)

    try:
        with par.ctrl_c_held() as halt:  # a Ctrl-C here is seen by the rental's waits, then raised
            outcomes = par.each(lambda step: step(), [rent, beside], 2)
    except KeyboardInterrupt:
        _drop(orch, outcomes[0][0], f"{what}: its replacement interrupted (Ctrl-C)")
        raise
    (fresh, failed), (_, beside_failed) = outcomes
    if beside_failed is not None:
        _drop(orch, fresh, f"{what}: its replacement called off ({_why(beside_failed)})")
        raise beside_failed
    if failed is not None:
        raise failed
    return fresh


def _drop(orch, node, reason: str) -> None:
    """Destroy a node rented in vain, if it lives (``Orch.down`` raises when it could not be)."""
    node = orch.ledger.get(node.id) if node is not None else None
    if node is not None and node.state in states.LIVE:
        orch.down(node, reason)
