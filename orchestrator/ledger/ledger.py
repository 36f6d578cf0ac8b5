"""The ledger: every instance orch ever asked for, every state it went through, what it cost.

SQLite at ``$ORCH_HOME/ledger.db`` by default (WAL, 30 s busy timeout, mode 0600), or any
SQLAlchemy URL in ``ORCH_DATABASE_URL`` (PostgreSQL for a team). The schema is owned by the
Alembic migrations in ``migrations/``; these models must match them (a test checks).

Every state change is a compare-and-set on the current state plus an append-only event, in
one transaction, so two orch processes can never both move the same instance.

On SQLite a transaction that writes begins ``IMMEDIATE`` (it takes the write lock first, so a
read-then-write never fails halfway on a lock it cannot upgrade); one that only reads begins
plain (deferred): under WAL it reads its snapshot and never waits for a writer, nor makes a
writer wait. A report beside a long reaper pass or an ``orch up`` answers at once.
"""

from __future__ import annotations

import json
import os
import sqlite3
import weakref
from datetime import datetime
from typing import Any, Iterable, Optional

from sqlalchemy import Column, Text, event, text, update
from sqlalchemy.exc import ArgumentError, DatabaseError
from sqlmodel import Field, Session, SQLModel, create_engine, select

from orchestrator import states
from orchestrator.config import sqlite_path
from orchestrator.errors import IllegalTransition, OrchError, UsageError
from migrations import HEAD
from orchestrator.ledger.ledger_sql import new_id, now  # one clock, one id for every table




class Instance(SQLModel, table=True):
    __tablename__ = "instances"

    id: str = Field(primary_key=True, max_length=12)
    name: str = Field(index=True, max_length=64)
    provider: str = Field(max_length=32)
    provider_id: Optional[str] = Field(default=None, index=True, max_length=128)
    label: str = Field(max_length=128)
    state: str = Field(index=True, max_length=16)
    # the request
    gpu: Optional[str] = Field(default=None, max_length=64)
    gpus: int = 0
    cpu_only: bool = False
    disk_gb: int = 0
    image: Optional[str] = Field(default=None, max_length=256)
    spot: bool = False
    bid: Optional[float] = None
    # what the provider gave and what it costs (the price paid at launch, never today's)
    gpu_name: Optional[str] = Field(default=None, max_length=128)
    price_hr: float = 0.0
    stopped_price_hr: float = 0.0
    ssh_host: Optional[str] = Field(default=None, max_length=255)
    ssh_port: Optional[int] = None
    ssh_user: Optional[str] = Field(default=None, max_length=64)
    host_key: Optional[str] = Field(default=None, sa_column=Column(Text))
    device: Optional[str] = Field(default=None, max_length=255)  # what verify ran its matmul on
    protected: bool = False
    policy: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON: idle/max-hours/...
    # JSON: what orch remembers about this instance between processes (the watchdog it armed, the
    # reaper's last decision, ...). It lives and dies with the row: nothing to clean up.
    memory: Optional[str] = Field(default=None, sa_column=Column(Text))
    # A node of a group (`--nodes N`, see ``groups``): one group per bring-up, its name, this node's
    # rank (0: the head), the group's size, and the private address the other nodes reach it at.
    group_id: Optional[str] = Field(default=None, index=True, max_length=12)
    group_name: Optional[str] = Field(default=None, index=True, max_length=64)
    node_rank: Optional[int] = None
    group_size: Optional[int] = None
    private_ip: Optional[str] = Field(default=None, max_length=64)
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


class Event(SQLModel, table=True):
    __tablename__ = "events"

    id: Optional[int] = Field(default=None, primary_key=True)
    instance_id: str = Field(foreign_key="instances.id", index=True, max_length=12)
    from_state: Optional[str] = Field(default=None, max_length=16)
    to_state: str = Field(max_length=16)
    reason: str = Field(default="", sa_column=Column(Text))
    actor: str = Field(default="cli", max_length=32)
    at: datetime = Field(default_factory=now, index=True)


class Run(SQLModel, table=True):
    __tablename__ = "runs"

    id: Optional[int] = Field(default=None, primary_key=True)
    instance_id: str = Field(foreign_key="instances.id", index=True, max_length=12)
    model: str = Field(max_length=64)
    data: str = Field(sa_column=Column(Text))  # where the dataset came from (no secrets)
    data_bytes: Optional[int] = None
    epochs: int = 0
    run_dir: Optional[str] = Field(default=None, sa_column=Column(Text))
    pid: Optional[int] = None
    args: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON of train keys
    state: str = Field(default="starting", max_length=16)  # starting/running/completed/failed/crashed
    gpu_name: Optional[str] = Field(default=None, max_length=128)
    mean_epoch_seconds: Optional[float] = None
    peak_vram_gb: Optional[float] = None
    completed_epochs: Optional[int] = None
    best_metric: Optional[float] = None
    started_at: datetime = Field(default_factory=now)
    ended_at: Optional[datetime] = None
    pulled_at: Optional[datetime] = None


class Meta(SQLModel, table=True):
    __tablename__ = "meta"

    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(default="", sa_column=Column(Text))


class Preemption(SQLModel, table=True):
    """A place where a spot market took a machine, or said it would (``jobs.avoid``)."""

    __tablename__ = "preemptions"

    id: Optional[int] = Field(default=None, primary_key=True)
    provider: str = Field(max_length=32)
    place: str = Field(max_length=128)  # a region or zone, a data center, a host: as the offer named it
    gpu: Optional[str] = Field(default=None, max_length=128)
    instance_name: Optional[str] = Field(default=None, max_length=64)
    reason: Optional[str] = Field(default=None, sa_column=Column(Text))
    at: datetime = Field(default_factory=now, index=True)


class Job(SQLModel, table=True):
    """``orch run``: one training from a dataset to weights on disk, over as many attempts as it takes."""

    __tablename__ = "jobs"

    id: str = Field(primary_key=True, max_length=12)
    name: str = Field(index=True, max_length=64)
    state: str = Field(index=True, max_length=16)  # planned/running/recovering/completed/failed/cancelled
    spec: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON: what to train, where (no secrets)
    plan: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON: the offer chosen first and why
    max_cost: Optional[float] = None
    max_hours: Optional[float] = None
    retries: int = 0
    keep: bool = False
    epoch: Optional[int] = None  # the last epoch seen trained
    checkpoint_epoch: Optional[int] = None  # the epoch of the intact resume copy kept at home
    weights: Optional[str] = Field(default=None, sa_column=Column(Text))  # where the weights are, once home
    cost_usd: float = 0.0
    phases: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON: seconds per phase
    history: Optional[str] = Field(default=None, sa_column=Column(Text))  # JSON: [{at, text}], the last few
    reason: Optional[str] = Field(default=None, sa_column=Column(Text))
    nodes: int = 1  # machines each attempt rents (a group: see ``groups``)
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)
    ended_at: Optional[datetime] = None


class Attempt(SQLModel, table=True):
    """One instance that trained (or tried to train) a job."""

    __tablename__ = "attempts"

    id: Optional[int] = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=12)
    number: int = 1
    instance_name: str = Field(max_length=64)
    instance_id: Optional[str] = Field(default=None, foreign_key="instances.id", index=True, max_length=12)
    run_id: Optional[int] = Field(default=None, foreign_key="runs.id")
    provider: str = Field(max_length=32)
    offer: Optional[str] = Field(default=None, sa_column=Column(Text))  # the plan's line for this attempt
    price_hr: Optional[float] = None
    state: str = Field(max_length=16)  # launching/running/completed/lost/failed/cancelled
    start_epoch: Optional[int] = None
    resumed_from: Optional[str] = Field(default=None, sa_column=Column(Text))
    reason: Optional[str] = Field(default=None, sa_column=Column(Text))
    phases: Optional[str] = Field(default=None, sa_column=Column(Text))
    unreachable_since: Optional[datetime] = None
    started_at: datetime = Field(default_factory=now)
    ended_at: Optional[datetime] = None


class Ledger:
    def __init__(self, url: str, upgrade: bool = True):
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.path = sqlite_path(url) if self.sqlite else None
        if self.sqlite:
            if self.path is not None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                    # Created 0600 before SQLite touches it: the ledger says where every machine is.
                    # Only when it is new: closing any descriptor of an open database drops every
                    # POSIX lock this process holds on it, its other connections' included, and
                    # another process may then rebuild the WAL index under them ("database disk
                    # image is malformed"; sqlite.org/howtocorrupt.html, section 2.2).
                    try:
                        os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
                    except FileExistsError:
                        pass
                    os.chmod(self.path, 0o600)
                except OSError as e:
                    raise OrchError(f"cannot open the ledger at {self.path}: {e.strerror or e}") from None
            self.engine = create_engine(url, connect_args={"timeout": 30, "isolation_level": None})
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin)
        else:
            self.engine = _engine(url)
        self._reader = self.engine.execution_options(orch_read_only=True)
        # Its connections close when the ledger is dropped or, at the latest, among the process's
        # atexit handlers (``cli.main._end`` ends orch without tearing its modules down): SQLite
        # checkpoints its WAL then, and PostgreSQL sees a client leave instead of a dropped socket.
        weakref.finalize(self, self.engine.dispose)
        if upgrade:
            self.ensure_schema()

    # -- schema ------------------------------------------------------------------------
    def revision(self) -> str | None:
        try:
            conn = self._reader.connect()  # a read: a plain BEGIN (see the module's docstring)
        except DatabaseError as e:  # not a database at all (a corrupt or foreign file)
            raise self._unreadable(e) from None
        with conn:
            return _revision(conn)

    def ensure_schema(self) -> None:
        """Apply migrations when the database is behind; a cheap read when it is not."""
        if self.revision() != HEAD:
            self.upgrade()

    def upgrade(self) -> None:
        """Migrate to this orch's schema. A ledger written by a newer orch is left alone: this one
        would not know its schema (``orch db upgrade`` says so too, in one line).

        Processes meeting a fresh ledger at once (several ``orch up`` in parallel) migrate one at a
        time: the revision is read and every migration runs in one transaction that holds the write
        lock from its start (BEGIN IMMEDIATE on SQLite, an advisory lock on PostgreSQL). Alembic on
        its own reads the revision first and runs SQLite's migrations one transaction each, so two
        processes could both find 0002 and both create 0003's tables."""
        from migrations import known, upgrade

        try:
            with self.engine.connect() as conn, conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(5260571)"))
                found = _revision(conn)
                if found == HEAD:
                    return
                if found is not None and found not in known():
                    raise OrchError(f"the ledger at {_shown(self.url)} was written by a newer orch (schema "
                                    f"{found}; this orch knows up to {HEAD}): upgrade orch")
                upgrade(conn)
        except DatabaseError as e:  # a corrupt or foreign file, a folder where the ledger should be
            raise self._unreadable(e) from None

    def _unreadable(self, e: DatabaseError) -> OrchError:
        return OrchError(f"cannot open the ledger at {_shown(self.url)}: "
                         f"{' '.join(str(e.orig or e).split())[:300]}")

    def session(self, write: bool = True) -> Session:
        """A session; ``write=False`` for one that only reads (a plain BEGIN on SQLite)."""
        return Session(self.engine if write else self._reader, expire_on_commit=False)

    # -- instances ---------------------------------------------------------------------
    def create_instance(self, actor: str = "cli", reason: str = "requested", **fields: Any) -> Instance:
        inst = Instance(id=new_id(), state=states.REQUESTED, **fields)
        from orchestrator.provider import label_for

        inst.label = label_for(inst.id, inst.name)
        with self.session() as s:
            live = s.exec(select(Instance).where(Instance.name == inst.name,
                                                 Instance.state.in_(states.LIVE))).first()
            if live:
                raise UsageError(f"an instance named {inst.name!r} already exists ({live.state})")
            s.add(inst)
            s.flush()
            s.add(Event(instance_id=inst.id, from_state=None, to_state=inst.state, reason=reason, actor=actor))
            s.commit()
        return inst

    def get(self, instance_id: str) -> Instance | None:
        with self.session(write=False) as s:
            return s.get(Instance, instance_id)

    def by_name(self, name: str, live_only: bool = True) -> Instance | None:
        with self.session(write=False) as s:
            q = select(Instance).where(Instance.name == name)
            if live_only:
                q = q.where(Instance.state.in_(states.LIVE))
            return s.exec(q.order_by(Instance.created_at.desc())).first()

    def instances(self, live_only: bool = False, provider: str | None = None) -> list[Instance]:
        with self.session(write=False) as s:
            q = select(Instance)
            if live_only:
                q = q.where(Instance.state.in_(states.LIVE))
            if provider:
                q = q.where(Instance.provider == provider)
            return list(s.exec(q.order_by(Instance.created_at)))

    def update(self, instance_id: str, **fields: Any) -> Instance:
        """Change facts about an instance (not its state: that is ``transition``)."""
        assert "state" not in fields
        with self.session() as s:
            s.exec(update(Instance).where(Instance.id == instance_id).values(updated_at=now(), **fields))
            s.commit()
            return s.get(Instance, instance_id)

    def transition(self, instance_id: str, to: str, reason: str = "", actor: str = "cli",
                   expect: str | Iterable[str] | None = None, **fields: Any) -> Instance:
        """Move an instance to ``to`` if it is (still) in an allowed state: compare-and-set."""
        with self.session() as s:
            inst = s.get(Instance, instance_id)
            if inst is None:
                raise IllegalTransition(f"no instance {instance_id}")
            src = inst.state
            if expect is not None:
                wanted = {expect} if isinstance(expect, str) else set(expect)
                if src not in wanted:
                    raise IllegalTransition(f"{inst.name} is {src}, not {'/'.join(sorted(wanted))}")
            if not states.allowed(src, to):
                raise IllegalTransition(f"{inst.name}: {src} -> {to} is not allowed")
            stamp = now()
            done = s.exec(update(Instance).where(Instance.id == instance_id, Instance.state == src)
                          .values(state=to, updated_at=stamp, **fields))
            if done.rowcount != 1:
                s.rollback()
                raise IllegalTransition(f"{inst.name} changed state under us (was {src})")
            s.add(Event(instance_id=instance_id, from_state=src, to_state=to, reason=reason, actor=actor, at=stamp))
            s.commit()
            inst = s.get(Instance, instance_id)
        from orchestrator.provider import plugins

        plugins.broadcast(inst, {"from": src, "to": to, "reason": reason, "actor": actor, "at": stamp})
        return inst

    def adopt(self, inst: Instance, reason: str, actor: str) -> Instance | None:
        """Write a row for an instance found at its provider (``orch reconcile``), with its first
        event; None when a live row already has its provider id or its name (a race lost)."""
        from sqlalchemy.exc import IntegrityError

        with self.session() as s:
            taken = s.exec(select(Instance).where(
                Instance.state.in_(states.LIVE),
                ((Instance.provider == inst.provider) & (Instance.provider_id == inst.provider_id))
                | (Instance.name == inst.name))).first()
            if taken is not None:
                return None
            s.add(inst)
            try:
                s.flush()
            except IntegrityError:
                s.rollback()
                return None  # the same id written meanwhile by a concurrent reconcile
            s.add(Event(instance_id=inst.id, from_state=None, to_state=inst.state, reason=reason, actor=actor))
            s.commit()
            inst = s.get(Instance, inst.id)
        from orchestrator.provider import plugins

        plugins.broadcast(inst, {"from": None, "to": inst.state, "reason": reason, "actor": actor, "at": now()})
        return inst

    # -- what orch remembers about one instance ------------------------------------------
    def recall(self, instance_id: str, key: str, default: Any = None) -> Any:
        inst = self.get(instance_id)
        return _memory(inst).get(key, default) if inst is not None else default

    def remember(self, instance_id: str, **values: Any) -> None:
        """Set keys of the instance's memory (None removes one), atomically against other writers."""
        with self.session() as s:
            q = select(Instance).where(Instance.id == instance_id)
            if not self.sqlite:
                q = q.with_for_update()  # SQLite's BEGIN IMMEDIATE already serialises writers
            inst = s.exec(q).first()
            if inst is None:
                return
            memory = _memory(inst)
            for key, value in values.items():
                if value is None:
                    memory.pop(key, None)
                else:
                    memory[key] = value
            s.exec(update(Instance).where(Instance.id == instance_id)
                   .values(memory=json.dumps(memory, sort_keys=True, default=str)))
            s.commit()

    def note(self, instance_id: str, reason: str, actor: str = "cli") -> None:
        """An event that records a decision without a state change."""
        with self.session() as s:
            inst = s.get(Instance, instance_id)
            s.add(Event(instance_id=instance_id, from_state=inst.state, to_state=inst.state,
                        reason=reason, actor=actor))
            s.commit()

    def events(self, instance_id: str | None = None) -> list[Event]:
        with self.session(write=False) as s:
            q = select(Event)
            if instance_id:
                q = q.where(Event.instance_id == instance_id)
            return list(s.exec(q.order_by(Event.at, Event.id)))

    # -- runs --------------------------------------------------------------------------
    def add_run(self, **fields: Any) -> Run:
        return self._insert(Run(**fields))

    def _insert(self, row):
        """A new row written, and read back with what the database gave it (its id)."""
        with self.session() as s:
            s.add(row)
            s.commit()
            s.refresh(row)
            return row

    def update_run(self, run_id: int, **fields: Any) -> Run:
        with self.session() as s:
            if fields:
                s.exec(update(Run).where(Run.id == run_id).values(**fields))
                s.commit()
            return s.get(Run, run_id)

    def get_run(self, run_id: int) -> Run | None:
        with self.session(write=False) as s:
            return s.get(Run, run_id)

    def latest_run(self, instance_id: str) -> Run | None:
        with self.session(write=False) as s:
            return s.exec(select(Run).where(Run.instance_id == instance_id)
                          .order_by(Run.id.desc())).first()

    def first_run(self, instance_id: str) -> Run | None:
        with self.session(write=False) as s:
            return s.exec(select(Run).where(Run.instance_id == instance_id).order_by(Run.id)).first()

    def runs(self, instance_id: str | None = None) -> list[Run]:
        with self.session(write=False) as s:
            q = select(Run)
            if instance_id is not None:
                q = q.where(Run.instance_id == instance_id)
            return list(s.exec(q.order_by(Run.id)))

    # -- jobs --------------------------------------------------------------------------
    def create_job(self, active: Iterable[str], **fields: Any) -> Job:
        """A new job, refused while a job of that name is in one of the ``active`` states."""
        job = Job(id=new_id(), **fields)
        with self.session() as s:
            if not self.sqlite:
                s.execute(text("SELECT pg_advisory_xact_lock(5260572)"))  # one name check at a time
            taken = s.exec(select(Job).where(Job.name == job.name, Job.state.in_(tuple(active)))).first()
            if taken:
                raise UsageError(f"a job named {job.name!r} is already {taken.state} (`orch jobs show {job.name}`)")
            s.add(job)
            s.commit()
            s.refresh(job)
        return job

    def job(self, name: str) -> Job | None:
        """The newest job of that name."""
        with self.session(write=False) as s:
            return s.exec(select(Job).where(Job.name == name).order_by(Job.created_at.desc())).first()

    def remove_jobs(self, name: str, ended: Iterable[str]) -> list[Job]:
        """Every job of that name and its attempts, gone from the ledger (a schedule's occurrence
        that launched one keeps its own row, no longer linked); refused while one is not ``ended``."""
        with self.session() as s:
            rows = list(s.exec(select(Job).where(Job.name == name)))
            busy = [j for j in rows if j.state not in tuple(ended)]
            if busy:
                raise UsageError(f"job {name} is {busy[0].state}: `orch jobs cancel {name}` first")
            ids = [j.id for j in rows]
            if ids:
                from sqlalchemy import bindparam

                for sql in ("UPDATE schedule_runs SET job_id = NULL WHERE job_id IN :ids",
                            "DELETE FROM attempts WHERE job_id IN :ids", "DELETE FROM jobs WHERE id IN :ids"):
                    s.execute(text(sql).bindparams(bindparam("ids", expanding=True)), {"ids": ids})
                s.commit()
            return rows

    def get_job(self, job_id: str) -> Job | None:
        with self.session(write=False) as s:
            return s.get(Job, job_id)

    def jobs(self, states_: Iterable[str] | None = None) -> list[Job]:
        with self.session(write=False) as s:
            q = select(Job)
            if states_ is not None:
                q = q.where(Job.state.in_(tuple(states_)))
            return list(s.exec(q.order_by(Job.created_at)))

    def update_job(self, job_id: str, expect: str | Iterable[str] | None = None, **fields: Any) -> Job:
        """Change a job; with ``expect``, only from those states (compare-and-set on its state)."""
        with self.session() as s:
            q = update(Job).where(Job.id == job_id)
            if expect is not None:
                q = q.where(Job.state.in_((expect,) if isinstance(expect, str) else tuple(expect)))
            done = s.exec(q.values(updated_at=now(), **fields))
            if done.rowcount != 1:
                s.rollback()
                job = s.get(Job, job_id)
                raise IllegalTransition(f"job {job.name if job else job_id} is {job.state if job else 'gone'} now")
            s.commit()
            return s.get(Job, job_id)

    def add_attempt(self, **fields: Any) -> Attempt:
        return self._insert(Attempt(**fields))

    def update_attempt(self, attempt_id: int, **fields: Any) -> Attempt:
        with self.session() as s:
            s.exec(update(Attempt).where(Attempt.id == attempt_id).values(**fields))
            s.commit()
            return s.get(Attempt, attempt_id)

    def attempts(self, job_id: str) -> list[Attempt]:
        with self.session(write=False) as s:
            return list(s.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)))

    # -- meta --------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self.session(write=False) as s:
            row = s.get(Meta, key)
            return row.value if row else None

    def get_json_meta(self, key: str):
        """A meta value orch stored as JSON; None when absent or unreadable."""
        raw = self.get_meta(key)
        try:
            return json.loads(raw) if raw else None
        except (ValueError, RecursionError):
            return None

    def set_meta(self, key: str, value: str) -> None:
        with self.session() as s:
            row = s.get(Meta, key) or Meta(key=key)
            row.value = value
            s.add(row)
            s.commit()

    # -- preemptions -------------------------------------------------------------------
    def add_preemption(self, **fields: Any) -> Preemption:
        return self._insert(Preemption(**fields))

    def preemptions(self, since: datetime) -> list[Preemption]:
        with self.session(write=False) as s:
            return list(s.exec(select(Preemption).where(Preemption.at >= since).order_by(Preemption.at)))


def _revision(conn) -> str | None:
    """The schema revision, None on a database orch has not migrated yet. Inside a transaction the
    failed read is undone to a savepoint, so the transaction goes on."""
    try:
        if conn.in_transaction():
            with conn.begin_nested():
                return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DatabaseError:
        return None


def _memory(inst: Instance) -> dict:
    from orchestrator.ledger.ledger_sql import memory

    return memory(inst)


def _shown(url: str) -> str:
    """The URL with its password starred: it goes into error messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _engine(url: str):
    try:
        return create_engine(url, pool_pre_ping=True)
    except ArgumentError:
        raise UsageError("the ledger's database URL (ORCH_DATABASE_URL, or database_url in config.toml) is not "
                         "one SQLAlchemy understands: use e.g. postgresql+psycopg://USER:PASSWORD@HOST/DB") from None
    except ImportError as e:
        raise UsageError(f"no database driver for {_shown(url)} ({e.name or e}): for PostgreSQL install "
                         "orch's postgres extra (psycopg)") from None


def _sqlite_begin(conn) -> None:
    """IMMEDIATE for a transaction that may write, plain for a reader (see the module's docstring)."""
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("orch_read_only") else "BEGIN IMMEDIATE")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    try:
        cur.execute("PRAGMA journal_mode=WAL")
    except sqlite3.OperationalError as e:
        if "locked" not in str(e):
            raise
        _wal_again(cur)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _wal_again(cur) -> None:
    """WAL mode for a new ledger that other processes are opening at the same moment (parallel `orch
    up`s on a new machine): switching a file to WAL takes an exclusive lock, and SQLite answers
    "database is locked" at once, without waiting in its busy handler, to a connection it would
    otherwise deadlock with another (sqlite.org/c3ref/busy_handler.html). Asked again, with jittered
    backoff, for as long as the busy timeout; the mode persists in the file, so only its first opens
    ever meet this."""
    import tenacity

    tenacity.Retrying(stop=tenacity.stop_after_delay(30), wait=tenacity.wait_random_exponential(0.01, 0.5),
                      retry=tenacity.retry_if_exception(lambda e: "locked" in str(e)), reraise=True)(
        cur.execute, "PRAGMA journal_mode=WAL")


# The volumes' tables (their models live in ``ledger_volumes``): on the metadata whenever the
# ledger is, as the migrations make them.
from orchestrator.volumes import ledger_volumes  # noqa: E402,F401


# The schedules' tables live in their own module; imported here so that the ledger's schema is one
# (the migrations and the models are checked against each other whole).
from orchestrator.schedules import ledger_schedules  # noqa: E402,F401
