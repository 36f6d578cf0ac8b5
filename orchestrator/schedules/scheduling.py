"""Schedules' runs started: each reaper pass (``duty.one_pass``, so ``orch reap`` and the installed
reaper) calls ``run_due``, and ``orch schedule run`` starts one by hand. When an occurrence is due,
and what a late pass does, is ``cron``'s (pure); this module reads the clock's answer against the
ledger (``ledger_schedules``) and starts each run through the one path in, ``jobs.submit``.

A run is an ordinary job named ``NAME-YYYYMMDD-HHMM`` (the occurrence in the schedule's zone):
watched (``watcher.ensure``, as ``orch run`` does), relaunched and capped like any. It runs what
the schedule fixed when it was added: the task's job spec and the snapshot of its workdir (``$ORCH_HOME/schedules/workdir-HASH.tar``, put
in orch's cache under its name for the job to send).

- **One at a time.** A pass holds the schedule's claim while it decides and launches (two reapers
  on one PostgreSQL ledger take turns), and owns an occurrence by its row (compare-and-set,
  ``ledger_schedules.claim``): each occurrence is launched once. A run of the schedule still
  active skips the next one (``--overlap skip``, recorded) or makes it wait (``queue``).
- **Money.** ``--max-price`` ($/hr of the ranked offer: offers above it are not ranked) and
  ``--max-cost`` (the plan's estimate for the whole job, ``estimate``, and the job's own cap while
  it runs): a run with no plan under both is skipped, nothing rented; the reason and the best
  plan's prices go on the occurrence's row and to the webhook (event ``schedule``). Inside a
  ``--window``, each pass tries again until the window closes.
- **Secrets** are the schedule's own: ``orch schedule add`` stores their values from the shell that
  adds it (``schedule_secrets``: a 0600 file per schedule, apart from the reaper's own keys in
  ``reaper.env``), and each run gets those and no other. A row that names a secret not stored for
  it, or one of orch's own credentials not handed over at ``add`` (``credentials``), is skipped
  with the reason: nothing is launched half-configured, and a row written into a shared ledger
  never gets the keys the reaper rents with. Values never reach the ledger.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from orchestrator.schedules import cron
from orchestrator.errors import NoCapacity, OrchError, UsageError
from orchestrator.text import clean
from orchestrator.text import why as _why

SNAPSHOTS = "schedules"  # under ORCH_HOME: each schedule's workdir, packed when it was added
STALE_LAUNCH = timedelta(hours=2)  # a row left launching this long by a pass that ended: settled


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def claim_key(name: str) -> str:
    return f"schedule:{name}"  # a colon: no instance or job name takes this claim


# -- secrets: the schedule's own ----------------------------------------------------------------------
def secrets_for(home: Path, s_name: str, names: list[str],
                task_file: str = "FILE") -> tuple[dict[str, str], str | None]:
    """(the values of ``names`` stored for the schedule, why not): each must be stored for it
    (``schedule_secrets``), and one of orch's own credentials only where it was handed over at
    ``add`` (stored there: ``add`` refuses it otherwise)."""
    from orchestrator.provider import credentials
    from orchestrator.schedules import schedule_secrets

    stored, problem = schedule_secrets.read(home, s_name)
    try:
        credentials.stored(names, set(stored), f"schedule {s_name}")
    except UsageError as e:
        return {}, _why(e)
    missing = [n for n in names if not stored.get(n)]
    if missing:
        return {}, (f"secret {', '.join(missing)} is not stored for schedule {s_name} (`orch schedule add "
                    f"{s_name} -f {clean(task_file, 200)} --replace` with it exported stores it for its runs alone)"
                    + (f"; {problem}" if problem else "") + ": nothing launched half-configured")
    return {n: stored[n] for n in names}, None


# -- what a run runs --------------------------------------------------------------------------------
def job_json(sub) -> str:
    """A submission as the schedule keeps it: the job's spec and caps (names of secrets only)."""
    return json.dumps({"spec": json.loads(sub.spec.to_json()), "max_cost": sub.max_cost,
                       "max_hours": sub.max_hours, "retries": sub.retries, "keep": sub.keep,
                       "disk_given": sub.disk_given}, sort_keys=True)


def submission(s, name: str, ceilings: bool = True):
    """The run ``name`` of schedule ``s``; with ``ceilings``, held to the schedule's: offers above
    --max-price are not ranked, and --max-cost caps the plan and the job (the task's own caps too)."""
    from orchestrator import jobs

    jobs.check_job_name(name)
    try:
        d = json.loads(s.job)
        spec, retries = json.dumps(d["spec"]), d.get("retries", 3)
        max_cost, max_hours = d.get("max_cost"), d.get("max_hours")
        for value in (max_cost, max_hours):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < 1e6):
                raise ValueError(value)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= jobs.MAX_RETRIES:
            raise ValueError(retries)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError):
        raise UsageError(f"schedule {s.name}: its stored job is not one orch wrote: nothing runs") from None
    js = jobs.JobSpec.from_json(spec)  # held to what making it checked, as any job's stored spec
    if ceilings and s.max_price is not None:
        js = replace(js, max_price=min(s.max_price, js.max_price if js.max_price is not None else s.max_price))
    if ceilings and s.max_cost is not None:
        max_cost = min(s.max_cost, max_cost if max_cost is not None else s.max_cost)
    return jobs.Submission(name, js, max_cost=max_cost, max_hours=max_hours, retries=retries,
                           keep=d.get("keep") is True, disk_given=d.get("disk_given") is not False)


def secrets_of(sub) -> list[str]:
    return sub.spec.kind_of().secrets()


def snapshot(home: Path, sub) -> Path | None:
    """The task's workdir packed under ``$ORCH_HOME/schedules``, named by its content; every run
    uploads this tar, whatever the folder holds later (``--replace`` takes a new one)."""
    from orchestrator.tasks import workdir

    work = sub.spec.work
    if not getattr(work, "workdir", None):
        return None
    tar, size = workdir.pack(Path(work.workdir), Path(home) / SNAPSHOTS)
    work.workdir_tar, work.workdir_bytes = str(tar), size
    return tar


def snapshot_path(home: Path, stored: str | None) -> Path | None:
    """Where a schedule's snapshot is, from the name its row gives (a shared ledger is input too: a
    row names a file in ``$ORCH_HOME/schedules`` that ``workdir.pack`` named, never a path)."""
    from orchestrator.tasks.workdir import TAR

    name = Path(stored).name if isinstance(stored, str) else ""
    return Path(home) / SNAPSHOTS / name if TAR.fullmatch(name) else None


def stage(home: Path, stored: str | None) -> str | None:
    """The snapshot put where a job takes its packed workdir from (orch's cache, by its name: a
    hard link, else a copy); why not, when it cannot be."""
    import shutil

    src = snapshot_path(home, stored)
    if src is None or not src.is_file():
        return f"its workdir snapshot {src or stored} is gone"
    dst = Path(home) / "cache" / src.name
    if dst.is_file() and not dst.is_symlink():
        return None  # the job checks its content against its name before sending it
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{src.name}.{os.getpid()}")
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return None


def drop_snapshot(orch, stored: str | None) -> None:
    """A snapshot no schedule names any more is removed (an active run's job has its own copy in
    orch's cache)."""
    from orchestrator.schedules import ledger_schedules

    path = snapshot_path(orch.home, stored)
    if path is None or any(snapshot_path(orch.home, s.snapshot) == path for s in ledger_schedules.every(orch.ledger)):
        return
    path.unlink(missing_ok=True)


# -- a pass -----------------------------------------------------------------------------------------
def _any_due(ledger, now: datetime) -> bool:
    """Whether a schedule may be due, asked with the standard library on a SQLite ledger (a pass
    over a quiet fleet imports no SQLAlchemy); elsewhere the ledger answers."""
    import sqlite3

    from orchestrator.ledger import ledger_sql

    if not getattr(ledger, "sqlite", False):
        return True
    conn = ledger_sql.reader(ledger.path)
    if conn is None:
        return False
    try:
        rows = conn.execute("SELECT due_at FROM schedules WHERE paused = 0").fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return False  # a ledger not yet migrated: no schedule in it
        raise
    finally:
        conn.close()
    for (due,) in rows:
        try:
            if cron.utc(datetime.fromisoformat(str(due))) <= now:
                return True
        except ValueError:
            return True  # unreadable here: the ledger proper reads it
    return False


def _grace(orch) -> timedelta:
    from orchestrator.reaper import reaper_timer

    info = reaper_timer.installed(orch.ledger) or {}
    every = info.get("every")
    return cron.grace(float(every) if isinstance(every, (int, float)) else None)


def rule_of(s, grace: timedelta = cron.MIN_GRACE) -> cron.Rule:
    """The schedule's row as ``cron`` decides with it, every field checked again (a shared ledger
    is input too)."""
    return cron.Rule(cron.Cron.of(s.cron, s.tz), cron.parse_window(s.window) if s.window else None,
                     cron.check_choice(s.misfire, cron.MISFIRE, "misfire"), grace)


def run_due(orch, now: datetime | None = None) -> list[dict]:
    """Every due schedule's occurrence started, skipped or left waiting, one schedule's trouble
    never stopping the others; one dict per run touched (``name``, ``state``, ``reason``)."""
    now = cron.utc(now or utcnow())
    if not _any_due(orch.ledger, now):
        return []  # before the ledger's models are imported: a quiet pass never needs them
    from orchestrator.ledger import claims
    from orchestrator.schedules import ledger_schedules

    out: list[dict] = []
    grace = _grace(orch)
    for s in ledger_schedules.every(orch.ledger):
        if s.paused:
            continue
        try:
            with claims.try_hold(orch.ledger, claim_key(s.name)) as mine:
                if not mine:
                    continue  # another reaper's pass is at it: it settles what is due
                s = ledger_schedules.get(orch.ledger, s.name)  # as it is now that this pass holds it
                if s is not None and not s.paused:
                    out += _one(orch, s, now, grace)
        except Exception as e:  # noqa: BLE001 - reported; the next schedule still gets its turn
            out.append({"name": s.name, "state": "error", "reason": f"schedule {s.name}: {_why(e)}"})
    return out


def _one(orch, s, now: datetime, grace: timedelta) -> list[dict]:
    from orchestrator.schedules import ledger_schedules as ls

    rule = rule_of(s, grace)
    _settle_stale(orch, s)
    waiting = ls.runs(orch.ledger, s.id, [ls.WAITING], newest=1)
    held = waiting[0] if waiting else None
    st = cron.step(rule, s.due_at, now, held.occurrence if held else None)
    if st.action == "wait":
        ls.move_due(orch.ledger, s.id, st.due)
        return []
    name = rule.cron.run_name(s.name, st.occurrence)
    if st.action == "skip":
        reason = st.reason + (f"; the last try: {held.reason}" if held is not None and held.reason else "")
        row = ls.claim(orch.ledger, s.id, st.occurrence, name, ls.SKIPPED, reason=reason)
        ls.move_due(orch.ledger, s.id, st.due)
        if row is None:
            return []  # another pass settled it
        _notify(s.name, name, reason)
        return [{"name": name, "state": "skipped", "reason": f"schedule {s.name}: {reason}"}]
    row = ls.claim(orch.ledger, s.id, st.occurrence, name)
    if row is None:
        ls.move_due(orch.ledger, s.id, st.due)
        return []
    return [launch(orch, s, row, st)]


def _settle_stale(orch, s) -> None:
    """Occurrences a pass left ``launching`` (it ended mid-launch): launched where its job was
    recorded, else skipped once they are old."""
    from orchestrator.schedules import ledger_schedules as ls

    for r in ls.runs(orch.ledger, s.id, [ls.LAUNCHING]):
        job = orch.ledger.job(r.name)
        if job is not None and cron.utc(job.created_at) >= cron.utc(r.created_at) - timedelta(minutes=1):
            ls.settle(orch.ledger, r.id, ls.LAUNCHED, job_id=job.id)
        elif utcnow() - cron.utc(r.updated_at) > STALE_LAUNCH:
            ls.settle(orch.ledger, r.id, ls.SKIPPED, reason="the pass launching it ended before its job was recorded")


def launch(orch, s, row, st: cron.Step) -> dict:
    """Start the occurrence this pass owns (``row``), or say why not: the run launched, skipped, or
    waiting for another pass (its turn, or an offer under the ceiling inside its window)."""
    from orchestrator import jobs
    from orchestrator.schedules import ledger_schedules as ls

    c = cron.Cron.of(s.cron, s.tz)

    def end(state: str, reason: str, job_state: str | None = None, exit_code: int = UsageError.exit_code,
            **fields) -> dict:
        """``exit_code``: what `orch schedule run` exits with when the run is not started, the code
        `orch run` gives the same refusal (a limit or rule the user set, a stored row refused: 2;
        no offer, a provider's failure: 1)."""
        ls.settle(orch.ledger, row.id, state, reason=reason, **fields)
        if st.due is not None:
            ls.move_due(orch.ledger, s.id, cron.utc(row.occurrence) if state == ls.WAITING else st.due)
        if state == ls.SKIPPED:
            _notify(s.name, row.name, reason)
        shown = {ls.WAITING: "waiting", ls.SKIPPED: "skipped"}.get(state) or job_state or state
        return {"name": row.name, "state": shown, "reason": f"schedule {s.name}: {reason}", "exit_code": exit_code}

    busy = [(r, doing) for r, doing in ls.active(orch.ledger, s.id, jobs.ACTIVE) if r.id != row.id]
    if busy:
        other, doing = busy[0]
        if s.overlap == "queue":
            return end(ls.WAITING, f"waits for {other.name} ({doing}) to end (--overlap queue)")
        return end(ls.SKIPPED, f"{other.name} is still {doing} (--overlap skip)")
    try:
        sub = submission(s, row.name)
    except UsageError as e:  # its stored spec refused (a shared ledger is input too): nothing runs
        return end(ls.SKIPPED, _why(e))
    gone = stage(orch.home, s.snapshot) if getattr(sub.spec.work, "workdir", None) else None
    if gone:
        return end(ls.SKIPPED, f"{gone}: `orch schedule add {s.name} -f {clean(s.task_file, 200)} --replace` takes "
                               "a new one")
    values, problem = secrets_for(orch.home, s.name, secrets_of(sub), s.task_file)
    if problem:
        return end(ls.SKIPPED, problem)
    # Stored for it at `add`: handed over there, and handed to the launch with the submission (never this
    # process's environment); --max-cost checked on the one plan the run rents.
    sub = replace(sub, allowed_secrets=frozenset(values), secrets=values, max_estimate=s.max_cost)
    retry = st.closes is not None  # inside a window: the next pass tries again, until it closes
    until = f"; the next pass tries again, until {c.local(st.closes):%H:%M %Z}" if retry else ""
    try:
        got = jobs.submit(orch, sub)
    except jobs.OverEstimate as e:
        return end(ls.WAITING if retry else ls.SKIPPED, _why(e) + until, price_hr=e.choice.price_hr, usd=e.usd)
    except OrchError as e:
        job = orch.ledger.job(row.name)
        if job is not None and cron.utc(job.created_at) >= cron.utc(row.created_at) - timedelta(minutes=1):
            return end(ls.LAUNCHED, f"launched, then: {_why(e)}", job_id=job.id, job_state=job.state,
                       exit_code=OrchError.exit_code)
        reason, prices = _refused(orch, s, row.name, e)
        return end(ls.WAITING if retry else ls.SKIPPED, reason + until, exit_code=e.exit_code, **prices)
    from orchestrator.jobs.record import note

    when = f"{c.local(row.occurrence):%Y-%m-%d %H:%M %Z}"
    job = note(orch, got.job, f"a run of schedule {s.name} (its occurrence {when})", say=False)
    said = f"{st.reason}; " if st.reason else ""
    done = end(ls.LAUNCHED, f"{said}launched: {got.choice.line}", job_id=job.id, price_hr=got.choice.price_hr,
               usd=sub.estimate(got.choice), job_state=job.state, exit_code=OrchError.exit_code)  # failed at once: 1
    if job.state in jobs.ACTIVE:
        # Watched from now on, as `orch run` watches its job: --max-cost, completion, pulls and
        # teardown within seconds, not at a next pass that may never come (no reaper installed).
        from orchestrator.reaper import watcher

        done["watched"] = watcher.ensure(orch, job.name)
    return done


def _refused(orch, s, name: str, e: OrchError) -> tuple[str, dict]:
    """Why a run was not launched; where the price ceiling left no offer, with the best plan's
    prices (the plan made again without the ceiling from the listing just made, orch's offers cache:
    nothing rented, nothing recorded)."""
    from orchestrator import jobs

    reason = _why(e)
    if s.max_price is None or not isinstance(e, (NoCapacity, UsageError)):
        return (reason if isinstance(e, UsageError) else f"could not start: {reason}"), {}
    sub = submission(s, name, ceilings=False)
    try:
        choice = jobs.submit(orch, sub, dry_run=True, fresh=False).choice  # the listing just made
    except OrchError as probe:
        return (f"no offer under --max-price ${s.max_price:g}/hr ({reason}; without it: {_why(probe)}); "
                "nothing rented"), {}
    prices = {"price_hr": choice.price_hr, "usd": sub.estimate(choice)}
    if choice.price_hr is None or choice.price_hr <= s.max_price:
        return f"no offer under --max-price ${s.max_price:g}/hr now ({reason}); nothing rented", prices
    return (f"the best plan, {clean(choice.line, 300)}: ${choice.price_hr:.4f}/hr is over --max-price "
            f"${s.max_price:g}; nothing rented"), prices


def _notify(schedule: str, run: str, reason: str) -> None:
    """A skipped run to the webhook (event ``schedule``): nobody watched the pass that skipped it."""
    from orchestrator import notify

    try:
        url, wanted = notify.settings()
        if url and "schedule" in wanted:
            notify.post(url, f"orch: schedule {clean(schedule, 64)}: {clean(run, 64)} skipped: {clean(reason, 400)}")
    except Exception as e:  # noqa: BLE001 - a notification never breaks the pass that caused it
        notify._warn(type(e).__name__)


# -- by hand: `orch schedule run NAME` --------------------------------------------------------------
def run_now(orch, s, now: datetime | None = None) -> dict:
    """One run now, outside the cron and the window (still under the ceilings, the overlap rule
    and the secrets): its occurrence is this minute."""
    from orchestrator.ledger import claims
    from orchestrator.schedules import ledger_schedules as ls

    now = cron.utc(now or utcnow()).replace(second=0, microsecond=0)
    c = cron.Cron.of(s.cron, s.tz)
    name = c.run_name(s.name, now)
    with claims.hold(orch.ledger, claim_key(s.name), wait=30):
        _settle_stale(orch, s)
        row = ls.claim(orch.ledger, s.id, now, name)
        if row is None:
            raise UsageError(f"{name} already ran or was skipped this minute (`orch schedule ls`)")
        return launch(orch, s, row, cron.Step("run", None, now, "run by hand (`orch schedule run`)"))


# -- what `orch schedule ls` shows ------------------------------------------------------------------
def describe(orch, s) -> dict:
    from orchestrator.schedules import ledger_schedules as ls
    from orchestrator.views.instances import iso

    c = cron.Cron.of(s.cron, s.tz)
    recent = ls.runs(orch.ledger, s.id, newest=50)
    launched = next((r for r in recent if r.state in (ls.LAUNCHED, ls.LAUNCHING)), None)
    skipped = next((r for r in recent if r.state == ls.SKIPPED), None)
    waiting = next((r for r in recent if r.state == ls.WAITING), None)
    job = orch.ledger.job(launched.name) if launched is not None else None

    def occ(r) -> str:
        return c.local(r.occurrence).isoformat()

    nxt, waits = _next_run(orch, s, c, waiting)
    return {"name": s.name, "cron": s.cron, "tz": s.tz, "window": s.window, "max_price": s.max_price,
            "max_cost": s.max_cost, "overlap": s.overlap, "misfire": s.misfire, "paused": s.paused,
            "task_file": s.task_file, "snapshot": s.snapshot,
            "next_run": c.local(nxt).isoformat(), "waits": waits,
            "last_run": None if launched is None else {
                "name": launched.name, "occurrence": occ(launched), "state": job.state if job else launched.state,
                "reason": job.reason if job else launched.reason, "price_hr": launched.price_hr, "usd": launched.usd},
            "last_skip": None if skipped is None else {
                "name": skipped.name, "occurrence": occ(skipped), "reason": skipped.reason,
                "price_hr": skipped.price_hr, "usd": skipped.usd, "at": iso(skipped.updated_at)},
            "waiting": None if waiting is None else {"name": waiting.name, "occurrence": occ(waiting),
                                                     "reason": waiting.reason}}


def _next_run(orch, s, c: cron.Cron, waiting, now: datetime | None = None) -> tuple[datetime, str | None]:
    """(when its next run starts, what it waits for, if anything): an occurrence a pass left
    waiting, one held until its window opens (the window's opening, not the past occurrence), or
    one already due that the next reaper pass starts."""
    from orchestrator.reaper import reaper_timer

    now = cron.utc(now or utcnow())
    due = cron.utc(waiting.occurrence if waiting is not None else s.due_at)
    if waiting is not None:
        return due, waiting.reason
    if s.paused or due > now:
        return due, None
    if s.window:
        opens, _ = cron.window_of(cron.parse_window(s.window), c.tz, due)
        if now < opens:
            return opens, (f"the run of {c.local(due):%Y-%m-%d %H:%M %Z} waits for its window {s.window}: the first "
                           f"reaper pass after {c.local(opens):%H:%M %Z} starts it")
    pass_ = "the next reaper pass starts it" if reaper_timer.installed(orch.ledger) else \
        "no reaper is installed: `orch reap` (or `orch reaper install`) starts it"
    return due, f"due since {c.local(due):%Y-%m-%d %H:%M %Z}: {pass_}"
