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
"""

from __future__ import annotations

import ipaddress


def node_env(rank: int, ips: list[str], gpus_per_node: int) -> dict[str, str]:
    """The variables node ``rank`` of a group whose private addresses are ``ips`` (rank order) gets.
    The addresses come from providers (a shared ledger is input too): only IP literals pass."""
    if not ips:
        raise ValueError("a group has at least one node")
    if not 0 <= rank < len(ips):
        raise ValueError(f"rank {rank} is outside a group of {len(ips)}")
    if gpus_per_node < 0:
        raise ValueError("gpus_per_node must be 0 or more")
    clean = [str(ipaddress.ip_address(ip)) for ip in ips]
    return {
        "ORCH_NODE_RANK": str(rank),
        "ORCH_NUM_NODES": str(len(clean)),
        "ORCH_NODE_IPS": "\n".join(clean),
        "ORCH_MASTER_ADDR": clean[0],
        "ORCH_GPUS_PER_NODE": str(gpus_per_node),
    }
