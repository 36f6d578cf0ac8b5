"""A test's fresh ledger gets its schema from one that orch's migrations built once per test
process, instead of running them again.

Each test has an ORCH_HOME of its own, so the first orch that opens it (the test's process, or an
orch command it runs) meets an empty ledger and runs every migration: Alembic compiles and runs each
table and index as it goes, 20-30 ms of CPU, in about 700 tests. Here the SQL those migrations
made, read back from a ledger they built in this test process (``build``), is run instead, in the
same transaction and under the same write lock as ``Ledger.upgrade`` holds, only where:

- the ledger is the test's ``$ORCH_HOME/ledger.db`` (``conftest.orch_home`` names the built one in
  ORCH_TEST_LEDGER_SEED), SQLite, and empty;
- orch asks for the newest schema (an upgrade from an older revision is the migrations' own).

Everything else (a ledger at another path, PostgreSQL, an orch started by the interpreter instead
of forked by ``tests.zygote``) runs the migrations themselves, as the tests of the migrations do.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ORCH_TEST_LEDGER_SEED"
_statements: dict[str, list[str]] = {}


def build(folder: Path) -> Path:
    """A ledger at ``folder/seed.db`` that orch's own migrations built (no ORCH_HOME points there)."""
    from orchestrator.ledger.ledger import Ledger

    path = folder / "seed.db"
    if not path.exists():
        Ledger(f"sqlite:///{path}").engine.dispose()  # its WAL checkpointed into the file
    return path


def _seeded(path: str) -> list[str]:
    if path not in _statements:
        import sqlite3

        with sqlite3.connect(path) as db:
            _statements[path] = [s for s in db.iterdump() if s not in ("BEGIN TRANSACTION;", "COMMIT;")]
    return _statements[path]


def install() -> None:
    """From now on in this process, ``migrations.upgrade`` seeds a test's fresh ledger (see above)."""
    import migrations

    real = migrations.upgrade
    if getattr(real, "seeds", False):
        return

    def upgrade(connection, revision: str = "head") -> None:
        seed, home = os.environ.get(ENV), os.environ.get("ORCH_HOME")
        if (seed and home and revision == "head" and connection.dialect.name == "sqlite"
                and connection.engine.url.database == str(Path(home) / "ledger.db")
                and connection.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar() == 0):
            for statement in _seeded(seed):
                connection.exec_driver_sql(statement)
            return
        real(connection, revision)

    upgrade.seeds = True
    migrations.upgrade = upgrade
