"""The live instances' rows read with plain SQL, without the ledger's models.

Two readers need this and cannot use ``ledger``: the ssh-config listener, which the ledger itself
calls after each transition (through ``plugins``: importing the ledger from there would be a
cycle), and shell completion, which answers on every Tab and must not import SQLAlchemy (0.2 s).
``reconcile`` reads the fleet's ids and labels here too: 10,000 ORM objects cost seconds a pass;
a reaper pass asks here whether any job is active, and records itself here (``set_meta``) when it
changed nothing, so that a scheduled pass over a quiet fleet never imports the models.
A SQLite ledger is read with the standard library, read-only, creating nothing; any other
database through SQLAlchemy Core. Only columns every schema revision has are read.
"""

from __future__ import annotations

import atexit
import secrets
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from orchestrator import config, states


def now() -> datetime:
    """Every ledger row's clock (UTC), one for the models of every table."""
    return datetime.now(timezone.utc)


def new_id() -> str:
    """A row's id: 12 hex characters."""
    return secrets.token_hex(6)

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


def jobs_in(job_states: tuple[str, ...], url: str | None = None) -> list[str]:
    """The names of the jobs in ``job_states``: a reaper pass asks this before it imports the job
    engine and opens the ledger for a fleet that has no job to advance."""
    marks = ", ".join("?" for _ in job_states)
    url = url or config.database_url()
    if url.startswith("sqlite"):
        db = config.sqlite_path(url)
        return [r["name"] for r in _sqlite(db, f"SELECT name FROM jobs WHERE state IN ({marks})", ("name",),
                                           tuple(job_states))] if db is not None else []
    from sqlalchemy import bindparam, text

    query = text("SELECT name FROM jobs WHERE state IN :states").bindparams(bindparam("states", expanding=True))
    return [r["name"] for r in _sqlalchemy(url, query, ("name",), {"states": list(job_states)})]


# What shell completion offers for a NAME argument that is not an instance: our own queries.
_NAMES = {"jobs": "SELECT DISTINCT name FROM jobs",
          "schedules": "SELECT name FROM schedules",
          "volumes": f"SELECT name FROM volumes WHERE state != '{states.VOLUME_DELETED}'"}


def names(table: str, url: str | None = None) -> list[str]:
    """The names of the jobs, schedules or volumes (not deleted) in the ledger, sorted; [] where
    there is no ledger yet."""
    query = _NAMES[table]
    url = url or config.database_url()
    if url.startswith("sqlite"):
        db = config.sqlite_path(url)
        rows = _sqlite(db, query, ("name",)) if db is not None else []
    else:
        rows = _sqlalchemy(url, query, ("name",))
    return sorted({r["name"] for r in rows})


def set_meta(db: Path, key: str, value: str) -> bool:
    """``Ledger.set_meta`` on a SQLite ledger that exists, with the standard library: a reaper pass
    that changed nothing records itself without importing SQLAlchemy (0.3 s of CPU, bench/fleet.py).
    False where this cannot answer (no ledger file, no meta table yet): the caller opens the ledger."""
    if not db.is_file():
        return False
    conn = sqlite3.connect(str(db), timeout=30, isolation_level=None)  # the file exists: nothing is created
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                     (key, value))
        return True
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return False
        raise
    finally:
        conn.close()


def memory(row) -> dict:
    """What orch remembers about an instance (``Ledger.remember``), from its row (a model or a
    ``snapshot`` row): a reaper pass reads it from the rows it has, asking no query per instance."""
    from orchestrator.text import row_json

    return row_json(row.memory, {})


def open_ro(db: Path) -> sqlite3.Connection:
    """A SQLite ledger opened read-only: mode=ro never creates the file; the path is quoted, as a
    '?' or '#' in it would end the URI."""
    return sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True, timeout=30)


def reader(db: Path | None) -> sqlite3.Connection | None:
    """A read-only connection to the SQLite ledger at ``db``; None when there is none to read
    (the fast readers then leave it to the ledger proper, which makes or migrates it)."""
    if db is None or not db.is_file():
        return None
    try:
        return open_ro(db)
    except sqlite3.Error:
        return None


def _sqlite(db: Path, query: str, columns, params: tuple = ()) -> list[dict]:
    if not db.is_file():
        return []
    conn = open_ro(db)
    try:
        return [dict(zip(columns, row)) for row in conn.execute(query, params)]
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []  # a ledger made but never migrated: nothing in it
        raise
    finally:
        conn.close()


_engines: dict[str, object] = {}


def _sqlalchemy(url: str, query, columns, params: dict | None = None) -> list[dict]:
    from sqlalchemy import create_engine, text

    engine = _engines.get(url)
    if engine is None:
        engine = _engines[url] = create_engine(url, pool_pre_ping=True)
        atexit.register(engine.dispose)  # kept for the process: its connections close as it ends
    with engine.connect() as conn:
        return [dict(zip(columns, row)) for row in conn.execute(text(query) if isinstance(query, str) else query,
                                                                 params or {})]
