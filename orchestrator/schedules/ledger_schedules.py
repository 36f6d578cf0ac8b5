"""The ledger's schedules (``orch schedule``): each schedule, and each occurrence a pass settled.

A ``schedules`` row holds what the user fixed when adding it (the cron, its zone, the ceilings,
the window, the rules) and what each run runs (the job's spec as JSON, names of secrets only, and
where the snapshot of its workdir is), plus ``due_at``: the oldest occurrence no pass has settled.

A ``schedule_runs`` row is one occurrence: launched (with its job), skipped (why, and the prices
seen), or waiting (its turn under ``--overlap queue``, or an offer under the ceiling inside its
window). The occurrence is unique per schedule: a pass owns one by inserting its row, or by moving
a waiting one to ``launching`` (compare-and-set on its state), so two reapers on one ledger launch
each occurrence once. ``due_at`` only ever moves forward under a pass.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Optional

from sqlalchemy import Column, Text, UniqueConstraint, column, delete, table, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel, select

from orchestrator.errors import UsageError
from orchestrator.ledger.ledger_sql import new_id, now  # one clock, one id for every table

LAUNCHING, LAUNCHED, WAITING, SKIPPED = "launching", "launched", "waiting", "skipped"
# The jobs' rows, as far as an occurrence reads them (this module is imported by ``ledger``, whose
# ``Job`` model it cannot import back).
_JOBS = table("jobs", column("id"), column("state"))



class Schedule(SQLModel, table=True):
    __tablename__ = "schedules"

    id: str = Field(primary_key=True, max_length=12)
    name: str = Field(index=True, unique=True, max_length=64)
    cron: str = Field(max_length=128)
    tz: str = Field(max_length=64)
    window: Optional[str] = Field(default=None, max_length=16)  # HH:MM-HH:MM in tz
    max_price: Optional[float] = None  # $/hr of the ranked offer
    max_cost: Optional[float] = None  # $ of the plan's estimate for the whole job
    overlap: str = Field(default="skip", max_length=8)
    misfire: str = Field(default="skip", max_length=8)
    paused: bool = False
    task_file: str = Field(sa_column=Column(Text, nullable=False))  # where it came from, as shown
    job: str = Field(sa_column=Column(Text, nullable=False))  # JSON: each run's spec and caps (no secret values)
    snapshot: Optional[str] = Field(default=None, sa_column=Column(Text))  # the workdir's tar, named by its hash
    due_at: datetime
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


class ScheduleRun(SQLModel, table=True):
    __tablename__ = "schedule_runs"
    __table_args__ = (UniqueConstraint("schedule_id", "occurrence", name="uq_schedule_runs_occurrence"),)

    id: Optional[int] = Field(default=None, primary_key=True)
    schedule_id: str = Field(foreign_key="schedules.id", index=True, max_length=12)
    occurrence: datetime
    name: str = Field(index=True, max_length=64)  # the run's job name, NAME-YYYYMMDD-HHMM
    state: str = Field(max_length=16)  # launching/launched/waiting/skipped
    job_id: Optional[str] = Field(default=None, foreign_key="jobs.id", index=True, max_length=12)
    reason: Optional[str] = Field(default=None, sa_column=Column(Text))
    price_hr: Optional[float] = None
    usd: Optional[float] = None
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


# -- schedules ----------------------------------------------------------------------------------
def add(ledger, replace: bool = False, **fields: Any) -> tuple[Schedule, Schedule | None]:
    """A new schedule, or with ``replace`` the one of that name refreshed in place (its history
    kept, its waiting occurrence dropped); (the row, the row it replaced)."""
    with ledger.session() as s:
        old = s.exec(select(Schedule).where(Schedule.name == fields["name"])).first()
        if old is not None and not replace:
            raise UsageError(f"a schedule named {fields['name']!r} exists (`orch schedule add ... --replace` "
                             "refreshes it)")
        if old is None:
            row = Schedule(id=new_id(), **fields)
            s.add(row)
            try:
                s.commit()
            except IntegrityError:
                raise UsageError(f"a schedule named {fields['name']!r} was added meanwhile") from None
            return row, None
        before = Schedule(**old.model_dump())
        s.exec(update(Schedule).where(Schedule.id == old.id).values(updated_at=now(), **fields))
        s.commit()
    skip_waiting(ledger, before.id, "the schedule was replaced")
    return get(ledger, before.name), before


def skip_waiting(ledger, schedule_id: str, reason: str) -> None:
    """Its waiting occurrence (if any) skipped: what the user changed (paused, replaced) wins."""
    with ledger.session() as s:
        s.exec(update(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id, ScheduleRun.state == WAITING)
               .values(state=SKIPPED, reason=reason, updated_at=now()))
        s.commit()


def get(ledger, name: str) -> Schedule | None:
    with ledger.session(write=False) as s:
        return s.exec(select(Schedule).where(Schedule.name == name)).first()


def every(ledger) -> list[Schedule]:
    with ledger.session(write=False) as s:
        return list(s.exec(select(Schedule).order_by(Schedule.name)))


def change(ledger, schedule_id: str, **fields: Any) -> Schedule:
    """Set fields a user changes (paused, due_at on resume)."""
    with ledger.session() as s:
        s.exec(update(Schedule).where(Schedule.id == schedule_id).values(updated_at=now(), **fields))
        s.commit()
        return s.get(Schedule, schedule_id)


def move_due(ledger, schedule_id: str, due: datetime) -> None:
    """A pass moves the schedule's next occurrence forward, never back (two reapers agree)."""
    with ledger.session() as s:
        s.exec(update(Schedule).where(Schedule.id == schedule_id, Schedule.due_at < due)
               .values(due_at=due, updated_at=now()))
        s.commit()


def remove(ledger, name: str) -> Schedule | None:
    """The schedule and its occurrences' rows; its runs stay, as ordinary jobs."""
    with ledger.session() as s:
        row = s.exec(select(Schedule).where(Schedule.name == name)).first()
        if row is None:
            return None
        s.exec(delete(ScheduleRun).where(ScheduleRun.schedule_id == row.id))
        s.exec(delete(Schedule).where(Schedule.id == row.id))
        s.commit()
        return row


# -- occurrences --------------------------------------------------------------------------------
def claim(ledger, schedule_id: str, occurrence: datetime, name: str, state: str = LAUNCHING,
          **fields: Any) -> ScheduleRun | None:
    """Own ``occurrence``: its row inserted in ``state``, or its waiting row moved to ``state``
    (compare-and-set). None when another pass owns or settled it."""
    with ledger.session() as s:
        row = ScheduleRun(schedule_id=schedule_id, occurrence=occurrence, name=name, state=state, **fields)
        s.add(row)
        try:
            s.commit()
            s.refresh(row)
            return row
        except IntegrityError:
            s.rollback()  # the occurrence has its row: a waiting one may be taken below
    with ledger.session() as s:
        done = s.exec(update(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id,
                                                ScheduleRun.occurrence == occurrence, ScheduleRun.state == WAITING)
                      .values(state=state, updated_at=now(), **fields))
        if done.rowcount != 1:
            s.rollback()
            return None
        s.commit()
        return s.exec(select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id,
                                                ScheduleRun.occurrence == occurrence)).first()


def settle(ledger, run_id: int, state: str, expect: Iterable[str] = (LAUNCHING,), **fields: Any) -> bool:
    """Move an occurrence this pass owns to ``state`` (launched, skipped, waiting)."""
    with ledger.session() as s:
        done = s.exec(update(ScheduleRun).where(ScheduleRun.id == run_id, ScheduleRun.state.in_(tuple(expect)))
                      .values(state=state, updated_at=now(), **fields))
        s.commit()
        return done.rowcount == 1


def runs(ledger, schedule_id: str, states: Iterable[str] | None = None, newest: int | None = None) -> list[ScheduleRun]:
    with ledger.session(write=False) as s:
        q = select(ScheduleRun).where(ScheduleRun.schedule_id == schedule_id)
        if states is not None:
            q = q.where(ScheduleRun.state.in_(tuple(states)))
        q = q.order_by(ScheduleRun.occurrence.desc(), ScheduleRun.id.desc())
        return list(s.exec(q.limit(newest) if newest else q))


def active(ledger, schedule_id: str, job_states: Iterable[str]) -> list[tuple[ScheduleRun, str]]:
    """(occurrence, what it is doing): those being launched, and those launched whose job is in
    ``job_states`` (the jobs' active states, given by the layer that owns them)."""
    wanted = tuple(job_states)
    with ledger.session(write=False) as s:
        rows = s.exec(select(ScheduleRun, _JOBS.c.state).join(_JOBS, ScheduleRun.job_id == _JOBS.c.id, isouter=True)
                      .where(ScheduleRun.schedule_id == schedule_id, ScheduleRun.state.in_((LAUNCHING, LAUNCHED))))
        return [(r, LAUNCHING if r.state == LAUNCHING else state) for r, state in rows
                if r.state == LAUNCHING or state in wanted]


def of_jobs(ledger, job_ids: Iterable[str]) -> dict[str, str]:
    """{job id: the name of the schedule that launched it} (``orch jobs`` shows it)."""
    ids = list(job_ids)
    if not ids:
        return {}
    with ledger.session(write=False) as s:
        rows = s.exec(select(ScheduleRun.job_id, Schedule.name).join(Schedule, ScheduleRun.schedule_id == Schedule.id)
                      .where(ScheduleRun.job_id.in_(ids)))
        return {job_id: name for job_id, name in rows}
