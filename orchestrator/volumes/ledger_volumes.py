"""Volumes in the ledger: each volume orch made (or adopted), its history, and where it was mounted.

A volume bills from the moment its provider makes it until it is deleted, whatever runs. So, as
for an instance, the row comes first: ``creating`` is written BEFORE the provider is asked (a
crash mid-create leaves a row ``orch reconcile`` settles from the provider's own listing), then
``ready`` (or ``failed``); ``deleting`` before the provider is asked to delete, ``deleted`` once it
confirms. Every change is a compare-and-set plus an event of its own (``volume_events``: the
``events`` table belongs to instances). ``volume_mounts`` records each instance a volume was mounted
on, at which path: a volume is attached while one of those instances is live (stopped included:
its disk and its mounts come back at a start). ``staged_datasets`` is what orch staged on a volume
(every file's size and SHA-256, computed at home from the tar orch packed): a later job reuses the
dataset only while what it finds there is that (``staged_data``), never on a record kept on the
volume itself, which anything that mounts it may rewrite.

``volume_snapshot`` reads the whole picture without these models (``orch status``, ``orch cost``
and every reaper pass look at it without importing SQLAlchemy).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Optional

from sqlalchemy import Column, Text, UniqueConstraint, delete, text, update
from sqlmodel import Field, SQLModel, select

from orchestrator import states
from orchestrator.errors import IllegalTransition, UsageError
from orchestrator.ledger.ledger_sql import new_id, now as _now  # one clock, one id for every table

CREATING, READY, FAILED = states.VOLUME_CREATING, states.VOLUME_READY, states.VOLUME_FAILED
DELETING, DELETED = states.VOLUME_DELETING, states.VOLUME_DELETED
LIVE = states.VOLUME_LIVE  # what may bill (a create in flight may have made it)
TRANSITIONS = states.VOLUME_TRANSITIONS




class VolumeRow(SQLModel, table=True):
    __tablename__ = "volumes"

    id: str = Field(primary_key=True, max_length=12)
    name: str = Field(index=True, max_length=64)  # orch's name, unique among live rows
    provider: str = Field(max_length=32)
    provider_id: Optional[str] = Field(default=None, max_length=128)  # the provider's own id
    place: Optional[str] = Field(default=None, max_length=128)  # where it lives, in the provider's terms
    size_gb: int = 0
    price_gb_month: Optional[float] = None  # None: the provider did not say
    state: str = Field(index=True, max_length=16)
    idle_noted_at: Optional[datetime] = None  # when the reaper last reported it unattached
    created_at: datetime = Field(default_factory=_now)
    updated_at: datetime = Field(default_factory=_now)
    deleted_at: Optional[datetime] = None


class VolumeEvent(SQLModel, table=True):
    __tablename__ = "volume_events"

    id: Optional[int] = Field(default=None, primary_key=True)
    volume_id: str = Field(foreign_key="volumes.id", index=True, max_length=12)
    from_state: Optional[str] = Field(default=None, max_length=16)
    to_state: str = Field(max_length=16)
    reason: Optional[str] = Field(default="", sa_column=Column(Text))
    actor: str = Field(default="cli", max_length=32)
    at: datetime = Field(default_factory=_now)


class VolumeMount(SQLModel, table=True):
    __tablename__ = "volume_mounts"

    id: Optional[int] = Field(default=None, primary_key=True)
    volume_id: str = Field(foreign_key="volumes.id", index=True, max_length=12)
    instance_id: str = Field(foreign_key="instances.id", index=True, max_length=12)
    use_name: str = Field(max_length=64)  # the name the task used (a per-node volume's base name)
    path: str = Field(sa_column=Column(Text, nullable=False))  # as asked: /data, ~/data
    host_path: Optional[str] = Field(default=None, sa_column=Column(Text))  # as the instance resolved it
    attached_at: datetime = Field(default_factory=_now)


class StagedDataset(SQLModel, table=True):
    __tablename__ = "staged_datasets"
    __table_args__ = (UniqueConstraint("volume_id", "name", name="uq_staged_datasets_volume_name"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    volume_id: str = Field(foreign_key="volumes.id", index=True, max_length=12)
    name: str = Field(max_length=64)  # the dataset's folder on the volume: ds-<its tar's digest>
    tar_sha256: str = Field(max_length=64)
    data_yaml: str = Field(sa_column=Column(Text, nullable=False))  # relative to the dataset's folder
    files: str = Field(sa_column=Column(Text, nullable=False))  # JSON {relative path: [size, sha256]}
    manifest_sha256: str = Field(max_length=64)  # of ``files`` as stored: a row cut or edited is no record
    staged_at: datetime = Field(default_factory=_now)


# -- writes -------------------------------------------------------------------------------------
def create(ledger, actor: str = "cli", reason: str = "requested", **fields: Any) -> VolumeRow:
    """The row, ``creating``, before the provider is asked; refused while a live one has the name."""
    row = VolumeRow(id=new_id(), state=CREATING, **fields)
    with ledger.session() as s:
        if not ledger.sqlite:
            s.execute(text("SELECT pg_advisory_xact_lock(5260573)"))  # one name check at a time
        taken = s.exec(select(VolumeRow).where(VolumeRow.name == row.name, VolumeRow.state.in_(LIVE))).first()
        if taken:
            raise UsageError(f"a volume named {row.name!r} already exists on {taken.provider} ({taken.state}): "
                             "`orch volume ls`")
        _insert(s, row, reason, actor)
    return row


def _insert(s, row: VolumeRow, reason: str, actor: str) -> None:
    """The row and its first event, in the session that checked its name was free."""
    s.add(row)
    s.flush()
    s.add(VolumeEvent(volume_id=row.id, from_state=None, to_state=row.state, reason=reason, actor=actor))
    s.commit()
    s.refresh(row)


def adopt(ledger, row: VolumeRow, reason: str, actor: str) -> VolumeRow | None:
    """A row for a volume found at its provider with orch's tag; None when a live row holds its
    name or its provider id already (a race lost)."""
    with ledger.session() as s:
        if not ledger.sqlite:
            s.execute(text("SELECT pg_advisory_xact_lock(5260573)"))
        taken = s.exec(select(VolumeRow).where(
            VolumeRow.state.in_(LIVE),
            (VolumeRow.name == row.name) | ((VolumeRow.provider == row.provider)
                                            & (VolumeRow.provider_id == row.provider_id)))).first()
        if taken is not None:
            return None
        _insert(s, row, reason, actor)
    return row


def move(ledger, volume_id: str, to: str, reason: str = "", actor: str = "cli",
         expect: str | Iterable[str] | None = None, **fields: Any) -> VolumeRow:
    """Compare-and-set on the volume's state, with its event, in one transaction."""
    with ledger.session() as s:
        row = s.get(VolumeRow, volume_id)
        if row is None:
            raise IllegalTransition(f"no volume {volume_id}")
        src = row.state
        wanted = None if expect is None else ({expect} if isinstance(expect, str) else set(expect))
        if wanted is not None and src not in wanted:
            raise IllegalTransition(f"volume {row.name} is {src}, not {'/'.join(sorted(wanted))}")
        if to != src and to not in TRANSITIONS[src]:
            raise IllegalTransition(f"volume {row.name}: {src} -> {to} is not allowed")
        stamp = _now()
        done = s.exec(update(VolumeRow).where(VolumeRow.id == volume_id, VolumeRow.state == src)
                      .values(state=to, updated_at=stamp, **fields))
        if done.rowcount != 1:
            s.rollback()
            raise IllegalTransition(f"volume {row.name} changed state under us (was {src})")
        s.add(VolumeEvent(volume_id=volume_id, from_state=src, to_state=to, reason=reason, actor=actor, at=stamp))
        s.commit()
        return s.get(VolumeRow, volume_id)


def note(ledger, volume_id: str, reason: str, actor: str = "cli", **fields: Any) -> None:
    """An event without a state change (an attachment, a report), and facts on the row."""
    with ledger.session() as s:
        row = s.get(VolumeRow, volume_id)
        if fields:
            s.exec(update(VolumeRow).where(VolumeRow.id == volume_id).values(updated_at=_now(), **fields))
        s.add(VolumeEvent(volume_id=volume_id, from_state=row.state, to_state=row.state, reason=reason, actor=actor))
        s.commit()


def attach(ledger, instance_id: str, instance_name: str, uses: list[tuple[str, str, str]], actor: str = "cli") -> None:
    """Record that ``instance_id`` mounts each (volume name, name the task used, path), before its
    provider is asked to make it: from then on the volume is attached while the instance lives."""
    with ledger.session() as s:
        for name, use_name, path in uses:
            row = s.exec(select(VolumeRow).where(VolumeRow.name == name, VolumeRow.state == READY)).first()
            if row is None:
                raise UsageError(f"volume {name!r} is not ready (`orch volume ls`)")
            s.add(VolumeMount(volume_id=row.id, instance_id=instance_id, use_name=use_name, path=path))
            s.add(VolumeEvent(volume_id=row.id, from_state=row.state, to_state=row.state, actor=actor,
                              reason=f"attached to {instance_name} at {path}"))
        s.commit()


def set_host_path(ledger, mount_id: int, host_path: str) -> None:
    with ledger.session() as s:
        s.exec(update(VolumeMount).where(VolumeMount.id == mount_id).values(host_path=host_path))
        s.commit()


def record_staged(ledger, volume_id: str, name: str, tar_sha256: str, data_yaml: str, files: str,
                  manifest_sha256: str) -> None:
    """What orch just staged on the volume as ``name``, in place of any earlier record of it."""
    with ledger.session() as s:
        s.exec(delete(StagedDataset).where(StagedDataset.volume_id == volume_id, StagedDataset.name == name))
        s.add(StagedDataset(volume_id=volume_id, name=name, tar_sha256=tar_sha256, data_yaml=data_yaml, files=files,
                            manifest_sha256=manifest_sha256))
        s.commit()


# -- reads through the ledger -------------------------------------------------------------------
def by_name(ledger, name: str) -> VolumeRow | None:
    """The live volume of that name."""
    with ledger.session(write=False) as s:
        return s.exec(select(VolumeRow).where(VolumeRow.name == name, VolumeRow.state.in_(LIVE))).first()


def get(ledger, volume_id: str) -> VolumeRow | None:
    with ledger.session(write=False) as s:
        return s.get(VolumeRow, volume_id)


def rows(ledger, live_only: bool = True, provider: str | None = None) -> list[VolumeRow]:
    with ledger.session(write=False) as s:
        q = select(VolumeRow)
        if live_only:
            q = q.where(VolumeRow.state.in_(LIVE))
        if provider:
            q = q.where(VolumeRow.provider == provider)
        return list(s.exec(q.order_by(VolumeRow.created_at)))


def events(ledger, volume_id: str) -> list[VolumeEvent]:
    with ledger.session(write=False) as s:
        return list(s.exec(select(VolumeEvent).where(VolumeEvent.volume_id == volume_id)
                           .order_by(VolumeEvent.at, VolumeEvent.id)))


def mounts_of(ledger, instance_id: str) -> list[tuple[VolumeMount, VolumeRow]]:
    """What ``instance_id`` mounts, in the order it was asked for."""
    with ledger.session(write=False) as s:
        found = s.exec(select(VolumeMount, VolumeRow).where(VolumeMount.instance_id == instance_id,
                                                            VolumeMount.volume_id == VolumeRow.id)
                       .order_by(VolumeMount.id))
        return [(m, v) for m, v in found]


def staged(ledger, volume_id: str, name: str) -> StagedDataset | None:
    """orch's record of the dataset ``name`` staged on the volume (None: orch staged none there)."""
    with ledger.session(write=False) as s:
        return s.exec(select(StagedDataset).where(StagedDataset.volume_id == volume_id,
                                                  StagedDataset.name == name)).first()
