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
task file (``peer_tasks``) runs unchanged; and, for a command, who the run is (``run_env``): the
job's id as SkyPilot's task id (the same across relaunches), its name as dstack's run name, and an
MPI hostfile written on each node.
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from dataclasses import dataclass

# The variables that count GPUs (0 on a CPU machine): a process count taken from one starts no process there.
GPU_COUNTS = ("ORCH_GPUS_PER_NODE", "SKYPILOT_NUM_GPUS_PER_NODE", "SKYPILOT_SETUP_NUM_GPUS_PER_NODE",
              "DSTACK_GPUS_PER_NODE", "DSTACK_GPUS_NUM")


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
        # setup: runs on every node with the same facts (SkyPilot's "Environment variables for setup").
        "SKYPILOT_SETUP_NODE_RANK": str(rank),
        "SKYPILOT_SETUP_NODE_IPS": listed,
        "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": str(gpus_per_node),
        "DSTACK_NODE_RANK": str(rank),
        "DSTACK_NODES_NUM": str(nodes),
        "DSTACK_MASTER_NODE_IP": ips[0],
        "DSTACK_NODES_IPS": listed,
        "DSTACK_GPUS_PER_NODE": str(gpus_per_node),
        "DSTACK_GPUS_NUM": str(gpus_per_node * nodes),
    }


def gpu_counts_read(*scripts) -> list[str]:
    """The GPU-count variables (``GPU_COUNTS``) that ``scripts`` read (``$NAME``, ``${NAME}``), in that order."""
    text = "\n".join(s for s in scripts if isinstance(s, str))
    return [name for name in GPU_COUNTS if re.search(r"\$\{?" + name + r"\b", text)]


@dataclass(frozen=True)
class Run:
    """Who a command's run is, for ``run_env``: ``task_id`` stays the same across relaunches (orch's
    job id; for `orch exec`, one per exec), ``node`` is this node's rented machine (a new one at each
    relaunch), ``cluster`` the group's (or the lone machine's) name, ``provider`` where it runs."""

    task_id: str
    name: str
    node: str
    cluster: str
    provider: str


def mpi_hostfile(ips: list[str], gpus_per_node: int) -> str:
    """dstack's MPI hostfile ("Environment variables", ``DSTACK_MPI_HOSTFILE``; its runner's
    executor.go): one node a line, rank order, ``<ip> slots=<gpus>`` for GPU nodes, ``<ip>`` for CPU ones."""
    clean = [plain_ip(ip) for ip in ips]
    return "".join(f"{ip} slots={gpus_per_node}\n" if gpus_per_node else f"{ip}\n" for ip in clean)


def run_env(run: Run, working_dir: str, workdir: str | None, hostfile: str) -> dict[str, str]:
    """What SkyPilot's and dstack's commands read of their run, with the peers' meanings:

    - ``SKYPILOT_TASK_ID``: "a unique ID assigned to each task", the same "across recoveries" of a
      managed job (SkyPilot's "Environment variables"; github.com/skypilot-org/skypilot,
      sky/skylet/constants.py ``TASK_ID_ENV_VAR``): orch's job id, which every relaunch keeps. ``SKYPILOT_CLUSTER_INFO``: JSON with ``cluster_name``,
      ``cloud``, ``region``, ``zone`` (orch keeps no region or zone of a machine: null).
    - dstack's (dstack.ai/docs/reference/environment-variables/, its runner's ``executor.go``):
      ``DSTACK_RUN_NAME`` the run's name, ``DSTACK_RUN_ID`` "the UUID of the run" (one per job, kept
      across relaunches), ``DSTACK_JOB_ID`` "the UUID of the job submission" (one per node per
      attempt), ``DSTACK_WORKING_DIR`` where the command runs, ``DSTACK_REPO_DIR`` and
      ``DSTACK_REPO_ID`` where a workdir was uploaded (``workdir``: the folder at home, one id per
      folder; "if any": unset without one),
      ``DSTACK_MPI_HOSTFILE`` the hostfile's path (``mpi_hostfile``).
    """
    env = {
        "SKYPILOT_TASK_ID": run.task_id,
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": run.cluster, "cloud": run.provider, "region": None,
                                             "zone": None}),
        "DSTACK_RUN_NAME": run.name,
        "DSTACK_RUN_ID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"orch:job:{run.task_id}")),
        "DSTACK_JOB_ID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"orch:node:{run.task_id}:{run.node}")),
        "DSTACK_WORKING_DIR": working_dir,
        "DSTACK_MPI_HOSTFILE": hostfile,
    }
    if workdir:
        env["DSTACK_REPO_DIR"] = working_dir
        env["DSTACK_REPO_ID"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"orch:workdir:{workdir}"))
    return env
