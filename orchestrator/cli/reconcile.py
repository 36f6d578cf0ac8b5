"""``orch reconcile``, and the line ``orch status`` prints about its last run.

This module is imported by every ``orch`` command: it loads nothing heavy at import.
"""

from __future__ import annotations

import sys

import typer

from orchestrator.cli.app import app, emit_json, instance_named, open_orch

LISTS = ("adopted", "lost", "destroyed", "failed", "found", "abandoned", "settled", "swept", "busy")


@app.command()
def reconcile(as_json: bool = typer.Option(False, "--json", help="The report as JSON.")):
    """Match the ledger with every provider's own list: adopt strays, mark the lost, settle what
    an interrupted orch left. A provider whose listing fails is reported and left alone (exit 1)."""
    from orchestrator.instances import reconcile as rec

    report = rec.reconcile(open_orch(actor=rec.ACTOR))
    if as_json:
        emit_json(report.to_dict())
    else:
        for p in report.providers:
            print(f"{p.provider:<10} {_line(p)}")
        for line in report.volumes.changed + [f"problem: {x}" for x in report.volumes.problems]:
            print(f"volumes    {line}")
    if not report.ok:
        sys.exit(1)


def _line(p) -> str:
    if p.error:
        alone = f"; left alone: {', '.join(p.untouched)}" if p.untouched else ""
        return f"{p.error}{alone}"
    parts = [f"{k} {', '.join(getattr(p, k))}" for k in LISTS if getattr(p, k)]
    parts += [f"problem: {x}" for x in p.problems]
    return f"{p.listed} listed: " + ("; ".join(parts) if parts else "in step with the ledger")



@app.command()
def forget(name: str):
    """Close the row of an instance its provider confirms gone (one no reconcile could settle).
    Refused, exit 2, while the provider still shows it or cannot be asked."""
    from orchestrator.instances import reconcile as rec
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    orch = open_orch()
    inst = instance_named(orch, name)
    before = inst.state
    inst = rec.forget(orch, inst)
    print(f"{inst.name}: {before} -> {inst.state} (forgotten: its provider confirms it gone)")
