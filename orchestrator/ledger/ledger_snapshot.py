"""The ledger's instances, events and runs read whole, one query per table, for what looks at the fleet.

``orch cost`` and every reaper pass need each instance with its events and its runs. Asked
instance by instance that is three queries each (30,000 for a fleet of 10,000), and SQLAlchemy's
ORM building every row besides: seconds. Here a SQLite ledger at the schema head is read with the
standard library, the three queries in one read transaction (one consistent picture; under WAL a
reader never waits for a writer), and SQLAlchemy is not even imported (0.3 s of a command that
must keep up with ``orch status``). Any other ledger (PostgreSQL, one to migrate) is read through
the ledger proper, one query per table too.

The rows are plain objects with the models' attribute names and Python types (aware UTC
datetimes, as the ledger hands them back): whatever reads an ``Instance``, ``Event`` or
``Run`` reads them alike. They are a picture: writes go through the ledger.
"""

from __future__ import annotations

import gc
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from orchestrator import config, states
from orchestrator.ledger import ledger_sql

# Columns that SQLite stores as text or integers and the models read as datetimes or booleans
# (tests/test_fleet_scale.py checks these against the models).
DATETIMES = frozenset({"created_at", "updated_at", "at", "started_at", "ended_at", "pulled_at"})
BOOLEANS = frozenset({"cpu_only", "spot", "protected"})
_LIVE = ", ".join(f"'{s}'" for s in sorted(states.LIVE))  # our own constants, never user input


@dataclass
class Snapshot:
    instances: list  # by creation time
    events: dict[str, list] = field(default_factory=dict)  # instance id -> its events, in order
    runs: dict[str, list] = field(default_factory=dict)  # instance id -> its runs, oldest first

    def events_of(self, instance_id: str) -> list:
        return self.events.get(instance_id, [])

    def runs_of(self, instance_id: str) -> list:
        return self.runs.get(instance_id, [])

    def first_run(self, instance_id: str):
        runs = self.runs.get(instance_id)
        return runs[0] if runs else None

    def latest_run(self, instance_id: str):
        runs = self.runs.get(instance_id)
        return runs[-1] if runs else None


def read(ledger, live_only: bool = False, name: str | None = None) -> Snapshot:
    """The instances (live ones only, or those named ``name``) with their events and runs.
    ``ledger`` is a ``Ledger`` or anything with its ``url`` (``lifecycle.Orch``'s unopened one):
    a SQLite ledger at the schema head is read without opening it."""
    fast = _sqlite(ledger.url, live_only, name) if ledger.url.startswith("sqlite") else None
    return fast if fast is not None else _through(ledger, live_only, name)


@contextmanager
def quiet_gc():
    """The cyclic collector kept off a loop that makes tens of thousands of objects and no cycle
    (rows, decisions, costs), and off what it made, afterwards: it would otherwise walk the growing
    heap again and again, for nothing (a quarter of a reaper pass over 10,000 instances). Reference
    counting still frees all of it; ``release_gc`` hands it back to the collector (at the end of a
    reaper pass, so a ``--watch`` loop keeps nothing it does not use)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # what exists now: out of every later walk, until ``release_gc``
        if was:
            gc.enable()


def release_gc() -> None:
    gc.unfreeze()


def _where(live_only: bool, name: str | None) -> tuple[str, tuple]:
    clauses, args = [], ()
    if live_only:
        clauses.append(f"state IN ({_LIVE})")
    if name is not None:  # an instance of that name, or the nodes of the group of that name
        clauses.append("(name = ? OR group_name = ?)")
        args = (name, name)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def _sqlite(url: str, live_only: bool, name: str | None) -> Snapshot | None:
    """None when the file is missing or not at the schema head: the ledger proper migrates it."""
    from migrations import HEAD

    conn = ledger_sql.reader(config.sqlite_path(url))
    if conn is None:
        return None
    try:
        with quiet_gc():
            conn.execute("BEGIN")  # deferred: the three reads see one state of the ledger, and lock nothing
            if conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] != HEAD:
                return None
            where, args = _where(live_only, name)
            instances = _rows(conn.execute(f"SELECT * FROM instances{where} ORDER BY created_at", args))
            of = f" WHERE instance_id IN (SELECT id FROM instances{where})" if where else ""
            events = _grouped(_rows(conn.execute(f"SELECT * FROM events{of} ORDER BY at, id", args)))
            runs = _grouped(_rows(conn.execute(f"SELECT * FROM runs{of} ORDER BY id", args)))
            return Snapshot(instances, events, runs)
    except (sqlite3.Error, TypeError):
        return None
    finally:
        conn.close()


def _rows(cursor: sqlite3.Cursor) -> list:
    names = [d[0] for d in cursor.description]
    make = _row_class(tuple(names))
    stamps = [i for i, n in enumerate(names) if n in DATETIMES]
    flags = [i for i, n in enumerate(names) if n in BOOLEANS]
    parse = datetime.fromisoformat
    if not stamps and not flags:
        return [make(*row) for row in cursor]
    out = []
    for row in cursor:
        row = list(row)
        for i in stamps:
            if row[i] is not None:
                row[i] = parse(row[i] + "+00:00")  # stored as UTC without its zone; 6x faster than .replace()
        for i in flags:
            if row[i] is not None:
                row[i] = bool(row[i])
        out.append(make(*row))
    return out


_classes: dict[tuple[str, ...], type] = {}


def _row_class(names: tuple[str, ...]) -> type:
    """A plain class for rows of these columns, built once: its generated ``__init__`` takes a row
    four times faster than ``SimpleNamespace(**dict(zip(names, row)))``."""
    cls = _classes.get(names)
    if cls is None:
        assert all(n.isidentifier() and not n.startswith("_") for n in names), names  # the schema's own columns
        scope: dict = {}
        exec(f"def __init__(self, {', '.join(names)}):\n" + "".join(f"    self.{n} = {n}\n" for n in names), scope)
        cls = _classes[names] = type("Row", (), {"__init__": scope["__init__"], "__repr__": _repr})
    return cls


def _repr(row) -> str:
    return f"Row({', '.join(f'{k}={v!r}' for k, v in vars(row).items())})"


def _grouped(rows: list) -> dict[str, list]:
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r.instance_id, []).append(r)
    return by


def _through(ledger, live_only: bool, name: str | None) -> Snapshot:
    """The same picture through SQLAlchemy: one query per table, one read transaction."""
    from sqlmodel import select

    from orchestrator.ledger.ledger import Event, Instance, Run

    with ledger.session(write=False) as s:
        q = select(Instance)
        if live_only:
            q = q.where(Instance.state.in_(states.LIVE))
        if name is not None:
            q = q.where((Instance.name == name) | (Instance.group_name == name))
        instances = list(s.exec(q.order_by(Instance.created_at)))
        events_q, runs_q = select(Event), select(Run)
        if live_only or name is not None:
            ids = q.with_only_columns(Instance.id).order_by(None)
            events_q, runs_q = events_q.where(Event.instance_id.in_(ids)), runs_q.where(Run.instance_id.in_(ids))
        events = _grouped(list(s.exec(events_q.order_by(Event.at, Event.id))))
        runs = _grouped(list(s.exec(runs_q.order_by(Run.id))))
    return Snapshot(instances, events, runs)
