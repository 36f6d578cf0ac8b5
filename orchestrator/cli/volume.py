"""``orch volume``: data that outlives the machine (create, ls, rm).

Every argument is checked before anything is opened; ``rm`` asks first (without a terminal to ask
on, it needs ``--yes``) and is refused while an instance mounts the volume. What a volume is and
how orch keeps it: ``orchestrator.volumes.volumes``; using one: ``--volume NAME:PATH`` on ``orch up`` and
``orch run``, a task file's ``volumes:``.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from orchestrator.cli.app import app, emit_json, open_orch, out
from orchestrator.errors import UsageError

volume_app = typer.Typer(help="Volumes: storage that outlives an instance (create, ls, rm).", no_args_is_help=True)
app.add_typer(volume_app, name="volume")


@volume_app.command("create")
def create(name: str = typer.Argument(..., help="Your name for it (lowercase letters, digits, '-'; at most 40)."),
           provider: str = typer.Option(..., "--provider", "-p", help="Where it lives: local, runpod, lambda, aws, vastai."),
           size: int = typer.Option(..., "--size", help="Size in GB (the provider's range is checked)."),
           region: Optional[str] = typer.Option(None, "--region", help="Where it lives: a region, a data center or a "
                                                "machine (Lambda: us-east-1, RunPod: EU-RO-1, Vast.ai: a machine id)."),
           zone: Optional[str] = typer.Option(None, "--zone", help="Its availability zone (AWS: us-east-1a)."),
           as_json: bool = typer.Option(False, "--json", help="Print the volume as JSON.")):
    """Make a volume at PROVIDER: it bills from now until `orch volume rm`."""
    from orchestrator.volumes import volumes
    from orchestrator.jobs.request import renter

    where = volumes.check_create(name, renter(provider), size, region, zone)  # before anything is opened
    orch = open_orch()
    row = volumes.create(orch, name, provider, size, where)
    shown = next((v for v in volumes.listing(orch.ledger) if v["name"] == row.name), None)
    if as_json:
        emit_json(shown)
        return
    month = f"${shown['usd_month']:.2f}/month" if shown and shown["usd_month"] is not None else "price unknown"
    out(f"volume {row.name}: {row.state} on {row.provider} ({row.place or 'its default place'}), {row.size_gb} GB, "
        f"{month}; mount it with --volume {row.name}:PATH")


@volume_app.command("ls")
def ls(as_json: bool = typer.Option(False, "--json", help="As JSON (name provider where size_gb usd_month "
                                                          "attached_to created_at ...).")):
    """Every volume: its provider, where it lives, size, $/month, what mounts it, when it was made."""
    from orchestrator.volumes import volumes
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.text import clean, columns

    orch = Orch.open(lazy=True)  # a SQLite ledger is read without SQLAlchemy
    rows = volumes.listing(orch.ledger)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out("no volumes (`orch volume create NAME --provider P --size GB` makes one)")
        return
    table = []
    for v in rows:
        att = ", ".join(f"{a['instance']}:{a['path']}" for a in v["attached_to"]) or "-"
        month = f"{v['usd_month']:.2f}" if v["usd_month"] is not None else "?"
        table.append((v["name"], v["provider"], clean(v["where"], 60) or "-", v["state"], f"{v['size_gb']}",
                      month, f"{v['cost_usd']:.2f}", clean(att, 200), v["created_at"] or "-"))
    sys.stdout.write(columns(("NAME", "PROVIDER", "WHERE", "STATE", "GB", "$/MONTH", "COST $", "ATTACHED TO",
                              "CREATED"), table, right=frozenset({4, 5, 6})))


@volume_app.command("rm")
def rm(name: str = typer.Argument(..., help="The volume to delete."),
       yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask (needed without a terminal).")):
    """Delete a volume and everything on it (refused while an instance mounts it)."""
    from orchestrator.volumes import volumes
    from orchestrator.volumes.volume_uses import check_name

    check_name(name, "orch volume rm")

    def confirm(question: str) -> None:
        if yes:
            return
        if not sys.stdin.isatty():
            raise UsageError(f"deleting volume {name} loses what it holds: add --yes to delete without asking "
                             "(no terminal to ask on)")
        if not typer.confirm(question, default=False, err=True):
            raise UsageError("nothing deleted")

    row = volumes.remove(open_orch(), name, confirm)
    out(f"volume {row.name}: {row.state}")
