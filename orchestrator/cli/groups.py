"""What the instance commands do when NAME is a group (`orch up NAME --nodes N`): up, status, down.

A group's name stands for its head (rank 0) where one machine is meant (logs, pull, monitor,
``orch ssh NAME``; ``orch ssh NAME --node R`` for another), and for every node where the group is
meant as one (status shows them together, down ends them all). What a group is: ``orchestrator.instances.groups``.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.cli.app import emit_json, open_orch, out, say
from orchestrator.text import clean


def up(name, provider, request, nodes, *, spec, policy, disk_given: bool, ssh_timeout, wait: bool,
       as_json: bool) -> None:
    from orchestrator.instances import groups
    from orchestrator.provider import plugins
    from orchestrator.runs import runs, training

    orch = open_orch()
    provider = provider or plugins.default_provider()
    if spec is not None:
        training.prepare(spec, orch.home, say)
        if not disk_given:
            disk, why = training.disk_for(spec)
            request = replace(request, disk_gb=disk)
            say(f"      disk: {why}")
    holder = {}

    def launch(ready):
        from orchestrator.runs import group_training

        holder["run"] = group_training.launch(orch, ready, spec)

    say(f"group {name}: {nodes} nodes on {provider}, brought up together (all or nothing)")
    made = groups.up(orch, name, provider, request, nodes, policy=policy,
                     ssh_timeout=ssh_timeout * 60 if ssh_timeout else None, launch=launch if spec else None)
    run = holder.get("run")
    if run is not None and wait:
        view = runs.follow(orch, made[0], run)
        got, where = runs.pull(orch, made[0], run, view=view)
        say(f"      weights and run files of rank 0 in {where}")
        run = orch.ledger.get_run(run.id)
    show(orch, name, made, as_json, run=run)


def show(orch, name: str, nodes, as_json: bool, run=None) -> None:
    from orchestrator.instances import groups
    from orchestrator.views.instances import model_dict, run_dict

    data = {"group": name, "nodes": [model_dict(n) for n in nodes], "price_hr": groups.hourly(nodes),
            "state": "/".join(sorted({n.state for n in nodes}))}
    if run is not None:
        data["run"] = run_dict(run)
    if as_json:
        emit_json(data)
        return
    out(f"group {name} on {nodes[0].provider}: {len(nodes)} nodes, {data['state']}, ${data['price_hr']:.4f}/hr "
        "together")
    for n in nodes:
        out(f"  node {n.node_rank}  {n.name:<24} {n.state:<12} {n.private_ip or '-':<16} "
            f"{clean(n.device) or '-'}")
    out(f"  ssh      orch ssh {name} --node R   (R 0..{len(nodes) - 1}; 0 by default)")
    if run is not None:
        out(f"  run      {run.model} {run.state} on every node under torchrun; rank 0 writes {run.run_dir}")
        out(f"  watch    orch status {name} | orch logs {name} -f   (rank 0)")


def status(orch, name: str, as_json: bool) -> bool:
    """`orch status NAME` for a group: every node, then rank 0's run as for one instance. False
    when NAME is no group (an instance of that name comes first)."""
    from orchestrator.instances import groups

    if orch.ledger.by_name(name, live_only=False) is not None:
        return False
    nodes = groups.live(orch.ledger, name)
    if not nodes:
        return False
    nodes = [orch.refresh(n) for n in nodes]
    run = orch.ledger.latest_run(nodes[0].id)
    if as_json:
        from orchestrator.views.instances import model_dict

        data = {"group": name, "nodes": [model_dict(n) for n in nodes], "price_hr": groups.hourly(nodes),
                "state": "/".join(sorted({n.state for n in nodes}))}
        if run is not None:
            data["run"] = _run_view(orch, nodes[0], run)
        emit_json(data)
        return True
    show(orch, name, nodes, False)
    if run is not None and run.run_dir:
        r = _run_view(orch, nodes[0], run)
        out(f"  run      {clean(r['model'])} {clean(r.get('progress') or r['state'])} (rank 0: {clean(r['run_dir'])})")
        if r.get("error"):
            out(f"  error    {clean(r['error'])}")
    return True


def _run_view(orch, head, run) -> dict:
    """Rank 0's run: it alone writes checkpoints, status.json and metrics.jsonl."""
    from orchestrator.runs import runs
    from orchestrator.errors import OrchError
    from orchestrator.views.instances import run_dict

    if head.state != "ready" or not run.run_dir:
        return run_dict(run)
    try:
        view = runs.read(orch, head, run)
        runs.pull(orch, head, run, view=view, only_milestones=True)
    except OrchError as e:
        say(f"orch: warning: could not read the run on {head.name}: {e}")
        return run_dict(run)
    return run_dict(orch.ledger.get_run(run.id), view)


def down(orch, name: str, no_pull: bool) -> bool:
    """`orch down NAME` for a group: rank 0's run home (unless --no-pull), then every node at once.
    False when NAME is no group."""
    from orchestrator.ledger import claims
    from orchestrator.instances import groups
    from orchestrator.runs import runs
    from orchestrator.errors import OrchError

    nodes = groups.live(orch.ledger, name)
    if not nodes or orch.ledger.by_name(name) is not None:
        return False
    head = nodes[0]
    with claims.hold(orch.ledger, f"group:{name}"):
        run = orch.ledger.latest_run(head.id)
        if run is not None and run.run_dir and not no_pull and head.node_rank == 0:
            if head.state != "ready" and run.pulled_at is None:
                raise OrchError(f"{head.name} is {head.state} and the group's weights were never pulled: "
                                f"`orch down {name} --no-pull` to lose them")
            if head.state == "ready":
                try:
                    got, where = runs.pull(orch, head, run)
                except OrchError as e:
                    raise OrchError(f"could not pull the weights of {name} from {head.name} ({e}); not destroying "
                                    "it. Use --no-pull to destroy anyway") from None
                say(f"pulled {len(got)} new file(s) to {where}")
        ended = groups.down(orch, nodes, "destroyed by the user (the group as one)")
    out(f"{name}: " + ", ".join(f"{n.name} {n.state}" for n in ended))
    return True
