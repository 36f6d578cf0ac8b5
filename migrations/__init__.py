"""Alembic migrations for the ledger, applied on first use and by ``orch db upgrade``."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
HEAD = "0008"  # the newest revision in versions/; the ledger upgrades when the database is behind


def known() -> set[str]:
    """Every revision this orch has a migration for."""
    return {p.name.split("_", 1)[0] for p in (HERE / "versions").glob("[0-9]*_*.py")}


def config(connection=None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(connection, revision: str = "head") -> None:
    """Run the migrations on ``connection``, inside the transaction its caller began (the caller
    holds the write lock, so two processes never migrate the same ledger at once)."""
    from alembic import command

    command.upgrade(config(connection), revision)
