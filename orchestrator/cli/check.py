"""orch check: does orch work with this provider account?"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from orchestrator.cli.app import app, emit_json, open_orch, say
from orchestrator.errors import UsageError


@app.command()
def check(
    provider: Optional[str] = typer.Argument(None, help="The provider to check (local, runpod, vastai, ...); "
                                                        "without one, every provider (those without a key are "
                                                        "named as skipped)."),
    live: bool = typer.Option(False, "--live", help="Rent the cheapest thing with SSH and run the whole cycle "
                                                  "(rent, detached process, stop, start, down); leaves nothing behind."),
    deadline: float = typer.Option(20.0, help="Minutes the live cycle may take in all."),
    as_json: bool = typer.Option(False, "--json", help="The steps as JSON."),
):
    """Check a provider account once, after adding its key: the key, offers, SSH keys, what it cannot do
    and, with --live, a whole cycle with each step's time and the money spent. Exit 0 only when every
    step held."""
    from orchestrator import account_check as checking
    from orchestrator.provider import plugins

    if not 1 <= deadline <= 240:
        raise UsageError(f"--deadline must be between 1 and 240 minutes, not {deadline:g}")
    if provider is None:
        if live:
            raise UsageError("--live rents an instance: name the provider to check (`orch check PROVIDER --live`)")
        _every(deadline, as_json)
        return
    plugins.provider_class(provider)  # an unknown name is refused before anything is opened
    orch = open_orch(actor="check")
    report = checking.check(orch, provider, live, deadline, say=say if as_json else print)
    if as_json:
        emit_json(report.to_dict())
    else:
        print(f"{provider}: {'every step held' if report.ok else 'FAILED at ' + _failed(report)}"
              + (f"; spent ${report.spent_usd:.4f}" if live else ""))
    if not report.ok:
        sys.exit(1)


def _every(deadline: float, as_json: bool) -> None:
    """Every installed provider: those without a key are skipped, named with what to set."""
    from orchestrator import account_check as checking
    from orchestrator.provider import plugins

    orch = open_orch(actor="check")
    reports, skipped = [], []
    for name in sorted(plugins.providers()):
        missing = orch.provider(name).missing_credentials()
        if missing:
            skipped.append({"provider": name, "why": f"no key: set {missing}"})
            (say if as_json else print)(f"{name}: skipped, no key: set {missing}")
            continue
        report = checking.check(orch, name, False, deadline, say=say if as_json else print)
        reports.append(report)
        if not as_json:
            print(f"{name}: {'every step held' if report.ok else 'FAILED at ' + _failed(report)}")
    if as_json:
        emit_json({"providers": [r.to_dict() for r in reports], "skipped": skipped,
                   "ok": all(r.ok for r in reports)})
    if not all(r.ok for r in reports):
        sys.exit(1)


def _failed(report) -> str:
    return ", ".join(s.name for s in report.steps if not s.ok)
