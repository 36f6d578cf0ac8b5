"""orch db: the ledger's database."""

from __future__ import annotations

import typer

from orchestrator.cli.app import app, out

db_app = typer.Typer(help="The ledger's database.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade():
    """Apply the ledger's migrations (also done automatically on first use)."""
    from orchestrator import config
    from orchestrator.ledger.ledger import Ledger

    ledger = Ledger(config.database_url(), upgrade=False)
    ledger.upgrade()
    out(f"ledger at revision {ledger.revision()}")
