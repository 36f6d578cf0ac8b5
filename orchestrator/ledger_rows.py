"""The live instances' rows read with plain SQL, without the ledger's models.

Two readers need this and cannot use ``ledger``: the ssh-config listener, which the ledger itself
calls after each transition (through ``plugins``: importing the ledger from there would be a
cycle), and shell completion, which answers on every Tab and must not import SQLAlchemy (0.2 s).
``reconcile`` reads the fleet's ids and labels here too: 10,000 ORM objects cost seconds a pass.
A SQLite ledger is read with the standard library, read-only, creating nothing; any other
database through SQLAlchemy Core. Only columns every schema revision has are read.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from orchestrator import config, states

COLUMNS = frozenset({"id", "name", "state", "provider", "provider_id", "label", "ssh_host", "ssh_port", "ssh_user",
                     "host_key", "created_at"})
_LIVE = ", ".join(f"'{s}'" for s in sorted(states.LIVE))  # our own constants, never user input


def live(columns: tuple[str, ...], url: str | None = None) -> list[dict]:
    """Each live instance as ``{column: value}``, by name; [] where there is no ledger yet."""
    assert set(columns) <= COLUMNS, columns
    query = f"SELECT {', '.join(columns)} FROM instances WHERE state IN ({_LIVE}) ORDER BY name, created_at"
    url = url or config.database_url()
    if url.startswith("sqlite"):
        db = config.sqlite_path(url)
        return _sqlite(db, query, columns) if db is not None else []
    return _sqlalchemy(url, query, columns)


def memory(row) -> dict:
    """What orch remembers about an instance (``Ledger.remember``), from its row (a model or a
    ``snapshot`` row): a reaper pass reads it from the rows it has, asking no query per instance."""
    import json

    try:
        found = json.loads(row.memory) if row.memory else {}
    except (ValueError, RecursionError):  # RecursionError: JSON nested past Python's stack
        return {}
    return found if isinstance(found, dict) else {}


def open_ro(db: Path) -> sqlite3.Connection:
    """A SQLite ledger opened read-only: mode=ro never creates the file; the path is quoted, as a
    '?' or '#' in it would end the URI."""
    return sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True, timeout=30)


def _sqlite(db: Path, query: str, columns) -> list[dict]:
    if not db.is_file():
        return []
    conn = open_ro(db)
    try:
        return [dict(zip(columns, row)) for row in conn.execute(query)]
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []  # a ledger made but never migrated: nothing in it
        raise
    finally:
        conn.close()


_engines: dict[str, object] = {}


def _sqlalchemy(url: str, query: str, columns) -> list[dict]:
    from sqlalchemy import create_engine, text

    engine = _engines.get(url)
    if engine is None:
        engine = _engines[url] = create_engine(url, pool_pre_ping=True)
    with engine.connect() as conn:
        return [dict(zip(columns, row)) for row in conn.execute(text(query))]
