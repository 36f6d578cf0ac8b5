"""The volumes read whole, with what each is attached to, for what looks at all of them.

``orch status``, ``orch cost``, ``orch volume ls`` and every reaper pass need each volume and its
live attachments; on a SQLite ledger at the schema head they are read here with the standard
library in one read transaction (SQLAlchemy is not imported: 0.3 s of a command that must keep up
with ``orch status``), any other ledger through the models (``ledger_volumes``). No ledger yet is
an empty picture: nothing is created by looking.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone

from orchestrator import config, states
from orchestrator.ledger import ledger_sql

@dataclass
class Picture:
    volumes: list  # rows with the model's attribute names (live ones, or all), by creation time
    attached: dict[str, list[dict]] = field(default_factory=dict)  # volume id -> [{instance, state, path, ...}]
    last_detached: dict[str, datetime] = field(default_factory=dict)  # volume id -> when its last instance ended

    def attached_to(self, volume_id: str) -> list[dict]:
        return self.attached.get(volume_id, [])


_COLUMNS = ("id", "name", "provider", "provider_id", "place", "size_gb", "price_gb_month", "state", "idle_noted_at",
            "created_at", "updated_at", "deleted_at")
_STAMPS = ("idle_noted_at", "created_at", "updated_at", "deleted_at")


class Unopened:
    """The ledger's URL, for ``read`` where no ledger is open: a SQLite ledger is read, never made;
    another database is opened (to read) when it is read."""

    def __init__(self, url: str):
        self.url = url
        self._ledger = None

    def session(self, write: bool = True):
        if self._ledger is None:
            from orchestrator.ledger.ledger import Ledger

            self._ledger = Ledger(self.url)
        return self._ledger.session(write)


def read(ledger, live_only: bool = True) -> Picture:
    """Every volume with what it is attached to now and when it was last detached. ``ledger`` is a
    ``Ledger`` or anything with its ``url`` (an unopened one)."""
    if ledger.url.startswith("sqlite"):
        db = config.sqlite_path(ledger.url)
        if db is None or not db.is_file():
            return Picture([])
        fast = _sqlite(db, live_only)
        if fast is not None:
            return fast
    return _through(ledger, live_only)


def _mount_query(where: str) -> str:
    return ("SELECT m.volume_id, i.name, i.state, m.path, m.host_path, m.attached_at, i.updated_at, i.id "
            f"FROM volume_mounts m JOIN instances i ON i.id = m.instance_id {where} ORDER BY m.id")


def _sqlite(db, live_only: bool) -> Picture | None:
    from migrations import HEAD

    conn = ledger_sql.reader(db)
    if conn is None:
        return None
    try:
        conn.execute("BEGIN")  # one consistent picture; under WAL it waits for no writer
        if conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] != HEAD:
            return None
        marks = ", ".join(f"'{s}'" for s in sorted(states.VOLUME_LIVE))  # our own constants
        where = f" WHERE state IN ({marks})" if live_only else ""
        vols = [_plain(dict(zip(_COLUMNS, r)))
                for r in conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM volumes{where} ORDER BY created_at")]
        mounts = conn.execute(_mount_query("")).fetchall()
        return _picture(vols, [(r[0], r[1], r[2], r[3], r[4], _stamp(r[5]), _stamp(r[6]), r[7]) for r in mounts])
    except (sqlite3.Error, TypeError):
        return None  # a ledger to migrate, or unreadable here: the ledger proper says why
    finally:
        conn.close()


def _through(ledger, live_only: bool) -> Picture:
    from sqlmodel import select

    from orchestrator.ledger.ledger import Instance
    from orchestrator.volumes.ledger_volumes import VolumeMount, VolumeRow

    with ledger.session(write=False) as s:
        q = select(VolumeRow)
        if live_only:
            q = q.where(VolumeRow.state.in_(states.VOLUME_LIVE))
        vols = [_plain({c: getattr(v, c) for c in _COLUMNS}) for v in s.exec(q.order_by(VolumeRow.created_at))]
        mounts = s.exec(select(VolumeMount, Instance).where(VolumeMount.instance_id == Instance.id)
                        .order_by(VolumeMount.id))
        found = [(m.volume_id, i.name, i.state, m.path, m.host_path, _utc(m.attached_at), _utc(i.updated_at), i.id)
                 for m, i in mounts]
    return _picture(vols, found)


def _picture(vols: list, mounts: list[tuple]) -> Picture:
    pic = Picture(vols)
    for volume_id, name, state, path, host_path, at, ended, instance_id in mounts:
        if state in states.LIVE:
            pic.attached.setdefault(volume_id, []).append(
                {"instance": name, "instance_id": instance_id, "state": state, "path": path, "host_path": host_path,
                 "attached_at": at})
        elif ended is not None:  # an ended instance's row last moved when it ended
            pic.last_detached[volume_id] = max(pic.last_detached.get(volume_id, ended), ended)
    return pic


class _Row:
    def __init__(self, d: dict):
        self.__dict__.update(d)

    def __repr__(self) -> str:
        return f"VolumeRow({self.__dict__!r})"


def _plain(d: dict) -> _Row:
    for key in _STAMPS:
        d[key] = _stamp(d[key])
    return _Row(d)


def _stamp(v) -> datetime | None:
    """SQLite's stored text (UTC without its zone) as an aware datetime."""
    if v is None:
        return None
    if isinstance(v, datetime):
        return _utc(v)
    return datetime.fromisoformat(str(v) + "+00:00") if "+" not in str(v)[10:] else datetime.fromisoformat(str(v))


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
