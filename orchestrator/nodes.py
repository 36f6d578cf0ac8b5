"""What every node of a job finds in its environment: who it is in the group and where the others are.

One contract for every kind of job (a LibreYOLO training, a user's command) and every group size
(one machine is a group of one), so `torchrun`, `accelerate launch --num_machines` or a user's script
read the same names on every provider. Modelled on what users already know: SkyPilot's
`SKYPILOT_NODE_IPS` (newline-separated, head first), `SKYPILOT_NODE_RANK`, `SKYPILOT_NUM_NODES`,
`SKYPILOT_NUM_GPUS_PER_NODE` (SkyPilot's "Distributed Multi-Node Jobs",
docs.skypilot.co/en/latest/running-jobs/distributed-jobs.html), and dstack's `DSTACK_MASTER_NODE_IP`
(dstack's "Tasks", dstack.ai/docs/concepts/tasks, "Distributed tasks").

- ``ORCH_NODE_RANK``      this node's rank, 0 for the head
- ``ORCH_NUM_NODES``      how many nodes the group has
- ``ORCH_NODE_IPS``       every node's private address, one per line, rank order (head first)
- ``ORCH_MASTER_ADDR``    the head's private address (rank 0): where a rendezvous listens
- ``ORCH_GPUS_PER_NODE``  GPUs on each node (0 on a CPU instance)
- ``ORCH_PROCS_PER_NODE`` processes to start per node: its GPUs, or 1 on a CPU instance
  (``torchrun --nproc-per-node``, ``accelerate launch --num_processes`` per node)
- ``ORCH_MASTER_PORT``    a TCP port that was free on the head when the command started
  (where a rendezvous listens), where orch chose one

Beside them, the same facts under the peers' names (``peer_env``), so that a SkyPilot or dstack
task file (``peer_tasks``) runs unchanged.
"""

from __future__ import annotations

import ipaddress


def plain_ip(value) -> str:
    """An IP literal as ``ipaddress`` writes it; ValueError for anything else, an IPv6 scope id too
    (``fe80::1%eth0``: what follows ``%`` may be any text, spaces, a newline, ``$(...)``, and would
    reach ``ORCH_NODE_IPS`` and a command line as it is)."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an IP address")
    address = ipaddress.ip_address(value)
    if getattr(address, "scope_id", None) is not None:
        raise ValueError(f"{value!r} carries a scope id: a node's address is a plain IP literal")
    return str(address)


def is_plain_ip(value) -> bool:
    try:
        plain_ip(value)
        return True
    except ValueError:
        return False


def node_env(rank: int, ips: list[str], gpus_per_node: int, master_port: int | None = None) -> dict[str, str]:
    """The variables node ``rank`` of a group whose private addresses are ``ips`` (rank order) gets.
    The addresses come from providers (a shared ledger is input too): only IP literals pass."""
    if not ips:
        raise ValueError("a group has at least one node")
    if not 0 <= rank < len(ips):
        raise ValueError(f"rank {rank} is outside a group of {len(ips)}")
    if gpus_per_node < 0:
        raise ValueError("gpus_per_node must be 0 or more")
    clean = [plain_ip(ip) for ip in ips]
    return {
        "ORCH_NODE_RANK": str(rank),
        "ORCH_NUM_NODES": str(len(clean)),
        "ORCH_NODE_IPS": "\n".join(clean),
        "ORCH_MASTER_ADDR": clean[0],
        "ORCH_GPUS_PER_NODE": str(gpus_per_node),
        "ORCH_PROCS_PER_NODE": str(max(gpus_per_node, 1)),
        **({"ORCH_MASTER_PORT": str(int(master_port))} if master_port else {}),
        **peer_env(rank, clean, gpus_per_node),
    }


def peer_env(rank: int, ips: list[str], gpus_per_node: int) -> dict[str, str]:
    """What SkyPilot's and dstack's commands read, with their formats: SkyPilot's "Environment
    variables" (https://docs.skypilot.co/en/latest/running-jobs/environment-variables.html:
    ``SKYPILOT_NODE_IPS`` one per line, head first; ``SKYPILOT_NUM_GPUS_PER_NODE`` the GPUs each
    node has, 0 without), dstack's "Environment variables"
    (https://dstack.ai/docs/reference/environment-variables/: ``DSTACK_NODES_IPS`` delimited by
    newlines, ``DSTACK_GPUS_NUM`` the run's GPUs in all). ``ips``: plain IP literals, rank order."""
    nodes, listed = len(ips), "\n".join(ips)
    return {
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": listed,
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus_per_node),
        "DSTACK_NODE_RANK": str(rank),
        "DSTACK_NODES_NUM": str(nodes),
        "DSTACK_MASTER_NODE_IP": ips[0],
        "DSTACK_NODES_IPS": listed,
        "DSTACK_GPUS_PER_NODE": str(gpus_per_node),
        "DSTACK_GPUS_NUM": str(gpus_per_node * nodes),
    }
