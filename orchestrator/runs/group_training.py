"""A LibreYOLO training on a group (`--nodes N`): the kind-specific launch on a ready group.

PyTorch's own launcher, never a home-made one: on every node ``python -m torch.distributed.run
--nnodes N --nproc-per-node G --node-rank R --master-addr HEAD --master-port PORT --local-addr NODE
train_entry.py run.json`` (static ranks, which proved reliable where a c10d rendezvous did not: it
gives ranks in joining order, and rank 0 is the one that writes the run). The rendezvous listens
on rank 0's private address (a port rank 0 itself says is free); each node gives its own address,
so the group's traffic stays on the private network. LibreYOLO takes ``LOCAL_RANK`` as "launched by torchrun", joins the
process group (NCCL on GPUs, gloo on CPUs), splits the global ``batch`` over the world and lets
rank 0 alone write checkpoints, ``status.json`` and ``metrics.jsonl`` (LibreYOLO 1.6.0's
``trainer.py`` and ``distributed.py``, read in its wheel).

- The same data on every node: each stages the same packed dataset (in parallel).
- The Python API (``train_entry.py``'s api mode), because it alone takes ``sync_bn``: SyncBatchNorm
  refuses CPU modules, so a CPU group trains with ``sync_bn=False``.
- Every node also gets ``nodes.node_env``'s variables (ORCH_NODE_RANK, ...).
- A resume needs ``last.pt`` at the resume path on EVERY node (with it on rank 0 alone, rank 1
  raises FileNotFoundError and the group dies): each node's resume copy is checked there first.

Rank 0's run row is the group's run (status, logs, monitor and pull read it); every other node has
a row of its own, for its process.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator import parallel as par
from orchestrator.runs.runs import raise_first, stop


def launch(orch, nodes: list, spec, notes: list | None = None) -> Any:
    """Stage the data on every node, then start torchrun on every node; returns rank 0's run row.
    ``notes``: what the job's history should keep of the staging (``training.stage``)."""
    from orchestrator.instances import groups
    from orchestrator.runs import training
    from orchestrator.volumes import volume_mounts
    from orchestrator.kill_points import kill_point
    from playbooks import host, train
    from playbooks import runs as run_tasks

    size = len(nodes)
    head = nodes[0]
    per_node = 1 if head.cpu_only else max(head.gpus or 1, 1)
    limits = training.extract_limits(head.disk_gb or 20, spec.data_bytes)

    def stage(rank: int) -> dict:
        node = nodes[rank]
        with orch.connect(node) as c:
            work = host.workdir(c)
            data_yaml = training.stage(orch, node, c, spec, limits, log=lambda m: None,  # on its volume, if any
                                       notes=notes)
            run = orch.ledger.latest_run(node.id) if spec.resume else None
            if run is None:
                run = orch.ledger.add_run(instance_id=node.id, model=spec.model, data=spec.data,
                                          data_bytes=spec.data_bytes, epochs=spec.epochs,
                                          gpu_name=node.gpu_name, state="starting")
            name, project = f"r{run.id}", f"{work}/runs"
            if spec.resume:
                training._ensure_checkpoint(orch, node, c, f"{project}/{name}", spec.epochs)
            if spec.push_to:
                train.ensure_hub_client(c)
            return {"run": run, "data_yaml": data_yaml, "project": project, "name": name}

    orch.say(f"      staging the data on {size} nodes")
    outcomes = par.each(stage, list(range(size)), size)  # the group launches on every node or none
    raise_first(nodes, outcomes, "staging")
    staged = [s for s, _ in outcomes]
    with orch.connect(head) as c:
        master = head.private_ip or head.ssh_host
        port = run_tasks.free_port(c, master)
    def start(rank: int) -> int:
        node, s = nodes[rank], staged[rank]
        keys = training.train_keys(spec, s["data_yaml"], s["project"], s["name"], per_node, node.cpu_only)
        if node.cpu_only:
            keys["sync_bn"] = False  # SyncBatchNorm refuses CPU modules; only the API takes it
        entry = {"mode": "api", "name": s["name"], "kwargs": keys,
                 "push_to": spec.push_to[5:].strip("/") if spec.push_to and rank == 0 else None}
        # Static ranks: node R is torchrun's node R, so LibreYOLO's rank 0 (the one that writes the
        # run) is node 0. A c10d rendezvous hands ranks out in joining order: node 1 was seen
        # taking rank 0 (and writing the checkpoints on its own disk).
        launcher = ["-m", "torch.distributed.run", f"--nnodes={size}", f"--nproc-per-node={per_node}",
                    f"--node-rank={rank}", f"--master-addr={master}", f"--master-port={port}",
                    f"--local-addr={node.private_ip or node.ssh_host}", "--max-restarts=0"]
        env = {**volume_mounts.env(orch, node), **groups.env(nodes, rank, 0 if node.cpu_only else per_node)}
        if spec.push_to and rank == 0:
            env.update(training.hub_env())
        with orch.connect(node) as c:
            kill_point("before-train")
            pid = train.start(c, entry, env, launcher=launcher)
        public = {k: v for k, v in keys.items() if k != "data"}
        public.update(orch_nodes=size, orch_world_size=size * per_node, orch_node_rank=rank)
        orch.ledger.update_run(s["run"].id, run_dir=f"{s['project']}/{s['name']}", pid=pid,
                               state="running", args=json.dumps(public, sort_keys=True), ended_at=None)
        orch.ledger.note(node.id, f"training {'resumed' if spec.resume else 'started'} as node {rank} of {size} "
                                  f"under torchrun (rendezvous {master}:{port}), pid {pid}", orch.actor)
        return pid

    outcomes = par.each(start, list(range(size)), size)  # gathered, then the caller gives the group back
    if any(e is not None for _, e in outcomes):
        stop(orch, nodes)  # a half-started group would wait for its missing nodes for ever
    raise_first(nodes, outcomes, "starting the training")
    run = orch.ledger.latest_run(head.id)
    orch.say(f"      training {spec.model} for {spec.epochs} epochs on {size} nodes x {per_node} "
             f"(world size {size * per_node}), rendezvous {master}:{port}; rank 0 writes {run.run_dir}")
    return run
