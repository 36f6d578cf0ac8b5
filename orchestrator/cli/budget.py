"""``orch budget``: the ``[budget]`` of config.toml against what the ledger says was spent this
period (instances, volumes, schedules), what the active jobs commit, and what is left."""

from __future__ import annotations

import typer

from orchestrator.cli.app import app, emit_json, open_orch


@app.command("budget")
def show(as_json: bool = typer.Option(False, "--json", help="As JSON.")):
    """The budget: spent this period (instances, volumes, schedules), committed by running jobs, left."""
    from orchestrator.money import budget

    if not budget.limits()[0]:  # before anything is opened
        if as_json:
            emit_json(None)
            return
        print("no budget set: [budget] daily_usd, monthly_usd (and timezone) in config.toml")
        return
    st = budget.standing(open_orch(lazy=True).ledger)
    if as_json:
        emit_json(st.to_dict())
        return
    for line in st.lines():
        print(line)
