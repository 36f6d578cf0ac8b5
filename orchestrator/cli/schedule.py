"""``orch schedule``: jobs that start themselves. ``add`` (a task file on a cron, in a time zone,
under a price ceiling, inside a window), ``ls``, ``rm``, ``pause``, ``resume`` and ``run`` (once,
now). Every argument and the whole task file are checked before anything is stored: one line,
exit 2. What a pass does with a schedule is ``scheduling``'s; when it is due, ``cron``'s.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import List, Optional

import typer

from orchestrator.cli.app import app, emit_json, open_orch, out, say
from orchestrator.cli import task_run
from orchestrator.errors import UsageError
from orchestrator.text import clean

schedule_app = typer.Typer(help="Jobs that start themselves: a task file on a cron, in a time zone, under a price "
                                "ceiling and inside a window, started by the reaper's passes.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")

STAMP = len("-YYYYMMDD-HHMM")


def check_name(name: str) -> None:
    from orchestrator import jobs
    from orchestrator.instances.lifecycle import check_name as check

    longest = jobs.MAX_NAME - STAMP
    try:
        check(name)
    except UsageError:  # said with a schedule's own limit, not an instance's 40
        raise UsageError(f"invalid schedule name {name!r}: use 1-{longest} lowercase letters, digits and '-', "
                         "starting with a letter or digit (its runs are NAME-YYYYMMDD-HHMM)") from None
    if len(name) > longest:
        raise UsageError(f"a schedule's name has at most {longest} characters (its runs are NAME-YYYYMMDD-HHMM), "
                         f"not {len(name)}")


def _ceiling(value: float | None, flag: str) -> float | None:
    if value is not None and not (math.isfinite(value) and 0 <= value < 1e6):
        raise UsageError(f"{flag} is a $ amount of 0 or more, not {value:g}")
    return value


@schedule_app.command("add")
def add(
    name: Optional[str] = typer.Argument(None, help="The schedule's name (default: the task's name:); its runs are "
                                                    "NAME-YYYYMMDD-HHMM, at most 22 characters."),
    file: Path = typer.Option(..., "--file", "-f", help="The task file each run runs (`orch run -f`); its workdir is "
                                                        "snapshotted now."),
    cron_expr: Optional[str] = typer.Option(None, "--cron", help="Five cron fields (minute hour day-of-month month "
                                            "day-of-week) or @hourly/@daily/@weekly/@monthly; default: the file's "
                                            "schedule: cron."),
    tz: Optional[str] = typer.Option(None, "--tz", help="The zone the cron and the window are in (IANA name; "
                                                        "default UTC)."),
    max_price: Optional[float] = typer.Option(None, "--max-price", help="$/hr: a run with no ranked offer at or "
                                              "under it is skipped, nothing rented."),
    max_cost: Optional[float] = typer.Option(None, "--max-cost", help="$: a run whose plan is estimated above it (a "
                                             "command's: $/hr x its max_hours) is skipped; it also caps each run "
                                             "as `orch run --max-cost`."),
    window: Optional[str] = typer.Option(None, "--window", help="HH:MM-HH:MM: a run starts only inside it; each pass "
                                                                "tries again until it closes."),
    overlap: Optional[str] = typer.Option(None, "--overlap", help="skip (default) or queue: a run due while the "
                                                                  "last one is still active."),
    misfire: Optional[str] = typer.Option(None, "--misfire", help="skip (default) or run-once: a run whose time "
                                                                  "passed with no reaper pass."),
    replace: bool = typer.Option(False, "--replace", help="Refresh the schedule of that name: the task file, a new "
                                                          "snapshot of its workdir, and the flags."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="A local folder snapshotted as the command's "
                                                                  "working directory (a task file's own workdir: "
                                                                  "is beside it)."),
    workdir_max_mb: Optional[float] = task_run.workdir_max_mb_option(),
    allow_secret: Optional[List[str]] = task_run.allow_secret_option(),
):
    """Add a schedule: the reaper's passes start each run as a job, named NAME-YYYYMMDD-HHMM."""
    from orchestrator import config
    from orchestrator.provider import credentials
    from orchestrator.schedules import cron, schedule_secrets, scheduling
    from orchestrator.reaper import reaper_timer
    from orchestrator.tasks import task
    from orchestrator.schedules import ledger_schedules as ls

    t, lines = task.load(file)
    sec = t.schedule

    def pick(flag_value, key: str, flag: str, default=None):
        """(the value, where it came from): a flag given wins over the file's schedule: key."""
        if flag_value is not None:
            return flag_value, flag
        value = getattr(sec, key) if sec is not None else None
        return (value, f"{task.where(file, lines, 'schedule', key)}: schedule.{key}") if value is not None \
            else (default, flag)

    expr, where = pick(cron_expr, "cron", "--cron")
    if expr is None:
        raise UsageError(f"orch schedule add needs --cron EXPR, or schedule: {{cron: ...}} in {file}")
    expr = cron.parse(expr, where)
    tz_name, where = pick(tz, "tz", "--tz", "UTC")
    cron.zone(tz_name, where)
    win_text, where = pick(window, "window", "--window")
    win = cron.parse_window(win_text, where) if win_text is not None else None
    price, price_at = pick(max_price, "max_price", "--max-price")
    price = _ceiling(price, price_at)
    cost, where = pick(max_cost, "max_cost", "--max-cost")
    cost = _ceiling(cost, where)
    over, where = pick(overlap, "overlap", "--overlap", "skip")
    cron.check_choice(over, cron.OVERLAP, where)
    late, where = pick(misfire, "misfire", "--misfire", "skip")
    cron.check_choice(late, cron.MISFIRE, where)
    name = name or t.name
    if not name:
        raise UsageError(f"the schedule needs a NAME: `orch schedule add NAME -f {file} ...`, or name: in the file")
    check_name(name)

    c = cron.Cron(expr, tz_name)
    now = scheduling.utcnow()
    due = c.next_after(now)
    home = config.home()
    allow = list(allow_secret or [])
    for n in allow:  # one of orch's own credentials, or refused before anything is read or stored
        credentials.allowed(n, "orch schedule add")
    names = list(dict.fromkeys([*t.secrets, *allow]))
    before = schedule_secrets.read(home, name)[0] if replace else {}  # --replace: what it has, unless exported anew
    values = {n: os.environ.get(n) or before.get(n) or "" for n in names}
    missing = [n for n, v in values.items() if not v]
    if missing:
        at = task.where(file, lines, "secrets") if set(missing) & set(t.secrets) else "orch schedule add --allow-secret"
        raise UsageError(f"{at}: secret {', '.join(missing)} is not set in this "
                         "environment: export it and add the schedule again (orch keeps it for this schedule's runs "
                         f"alone in {schedule_secrets.FOLDER}/{name}.json under $ORCH_HOME, 0600; never in the ledger)")
    from orchestrator.jobs import request

    # The task file says it all (no `orch run` flag is typed here; the schedule's own are the schedule's),
    # its secrets checked against the values kept for its runs, never put in this process's environment.
    flags = request.Flags(up=task_run.up_defaults(), workdir=workdir, allow_secret=allow,
                          workdir_max_mb=workdir_max_mb, command="orch schedule add")
    sub = request.build(c.run_name(name, due), None, file, flags, environ={**os.environ, **values}, say=say)
    req = sub.spec.request
    if price is not None and (req.cpu or req.offer):
        known = _known_price(sub)
        if known is None:
            what = "a CPU-only task at a provider that prices it once rented" if req.cpu else "an offer given"
            raise UsageError(f"--max-price holds a ranked offer's $/hr; {what} has none to rank (its price is known "
                             "once rented): drop it, or ask for a GPU")
        known *= max(sub.spec.nodes, 1)  # what the plan holds to the ceiling (``jobs.plan``): the group's $/hr
        if known > price:  # every run would be skipped: said now, not at each run
            raise UsageError(f"{price_at}: ${price:g}/hr is below the ${known:.4f}/hr this task is known to cost "
                             f"({_provider(sub)}'s price, before anything is rented): every run would be skipped; "
                             f"raise it to at least {known:g}, or drop it")

    orch = open_orch()
    if not replace and ls.get(orch.ledger, name) is not None:
        raise UsageError(f"a schedule named {name!r} exists (`orch schedule add ... --replace` refreshes it)")
    tar = scheduling.snapshot(orch.home, sub)
    row, old = ls.add(orch.ledger, replace=replace, name=name, cron=expr, tz=tz_name, window=str(win) if win else None,
                      max_price=price, max_cost=cost, overlap=over, misfire=late, task_file=str(Path(file).resolve()),
                      job=scheduling.job_json(sub), snapshot=str(tar) if tar else None, due_at=due)
    if old is not None and old.snapshot != row.snapshot:
        scheduling.drop_snapshot(orch, old.snapshot)
    kept = schedule_secrets.write(home, name, values)  # for its runs alone; none: no file
    if kept is not None:
        say(f"orch: secret {', '.join(sorted(values))} kept for schedule {name}'s runs alone in {kept} (0600)")
    work = sub.spec.work
    out(f"schedule {name} {'replaced' if old else 'added'}: {expr} ({tz_name}), next run "
        f"{c.local(due).isoformat()} as {c.run_name(name, due)}" + (" (paused)" if row.paused else ""))
    runs = work.run if getattr(work, "run", None) else " ".join(sub.spec.kind_of().plan_lines(sub.name)[0].split())
    out(f"  runs      {file}: {clean(runs, 200)}")
    if tar is not None:
        out(f"  workdir   {work.workdir}, as it is now: {tar} ({work.workdir_bytes / 1e6:.2f} MB)")
    money = [f"--max-price ${price:g}/hr" if price is not None else "",
             f"--max-cost ${cost:g}" if cost is not None else "", f"window {win}" if win else ""]
    out(f"  limits    {', '.join(m for m in money if m) or 'none'}")
    out(f"  rules     overlap {over}, misfire {late}")
    if not reaper_timer.installed(orch.ledger):
        say("orch: warning: no reaper is installed: nothing starts these runs until `orch reaper install` (or an "
            "`orch reap` pass by hand)")


def _provider(sub) -> str:
    """The provider a CPU task (or a given offer) rents at, as the plan takes it (``jobs.plan``)."""
    from orchestrator.provider import plugins

    return (sub.spec.providers or [None])[0] or plugins.default_provider()


def _known_price(sub) -> float | None:
    """A CPU task's (or a given offer's) $/hr where its provider knows it before renting (the local provider's)."""
    from orchestrator.jobs.plan import known_price

    return known_price(_provider(sub), sub.spec.request)


@schedule_app.command("ls")
def ls_(as_json: bool = typer.Option(False, "--json", help="As JSON (name cron tz next_run last_run last_skip "
                                                           "paused ...).")):
    """Every schedule: its cron and zone, its next run, its last run and outcome, its last skip and why."""
    from orchestrator.schedules import ledger_schedules as ls
    from orchestrator.schedules import scheduling

    orch = open_orch()
    rows = [scheduling.describe(orch, s) for s in ls.every(orch.ledger)]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out("no schedules (`orch schedule add NAME -f task.yaml --cron '0 2 * * *'` adds one)")
        return
    for d in rows:
        out(f"{d['name']}  {d['cron']}  {d['tz']}" + (f"  window {d['window']}" if d["window"] else "")
            + ("  PAUSED" if d["paused"] else ""))
        limits = [f"--max-price ${d['max_price']:g}/hr" if d["max_price"] is not None else "",
                  f"--max-cost ${d['max_cost']:g}" if d["max_cost"] is not None else ""]
        if any(limits):
            out(f"  limits     {', '.join(x for x in limits if x)}")
        out(f"  next run   {d['next_run']}" + (f" (waits: {clean(d['waits'], 300)})" if d["waits"] else ""))
        last = d["last_run"]
        out(f"  last run   {last['name']}: {last['state']}" + (f" ({clean(last['reason'], 200)})" if last["reason"]
                                                                  else "") if last else "  last run   none")
        skip = d["last_skip"]
        out(f"  last skip  {skip['name']}: {clean(skip['reason'], 300)}" if skip else "  last skip  none")


def _schedule(orch, name: str):
    from orchestrator.schedules import ledger_schedules as ls

    check_name(name)
    s = ls.get(orch.ledger, name)
    if s is None:
        raise UsageError(f"no schedule named {name!r} (`orch schedule ls`)")
    return s


@schedule_app.command("rm")
def rm(name: str):
    """Remove the schedule (its runs so far stay, as jobs)."""
    from orchestrator import jobs
    from orchestrator.schedules import schedule_secrets, scheduling
    from orchestrator.schedules import ledger_schedules as ls

    orch = open_orch()
    s = _schedule(orch, name)
    running = [r.name for r, _ in ls.active(orch.ledger, s.id, jobs.ACTIVE)]
    ls.remove(orch.ledger, name)
    scheduling.drop_snapshot(orch, s.snapshot)
    schedule_secrets.remove(orch.home, name)
    out(f"schedule {name} removed" + (f"; {', '.join(running)} goes on as a job (`orch jobs`)" if running else ""))


@schedule_app.command("pause")
def pause(name: str):
    """Start no run of it until `orch schedule resume`."""
    from orchestrator.schedules import ledger_schedules as ls

    orch = open_orch()
    s = _schedule(orch, name)
    ls.change(orch.ledger, s.id, paused=True)
    ls.skip_waiting(orch.ledger, s.id, "the schedule was paused")
    out(f"schedule {name} paused")


@schedule_app.command("resume")
def resume(name: str):
    """Start its runs again, from its next occurrence (what fell due while paused is not run)."""
    from orchestrator.schedules import cron, scheduling
    from orchestrator.schedules import ledger_schedules as ls

    orch = open_orch()
    s = _schedule(orch, name)
    c = cron.Cron.of(s.cron, s.tz)
    due = c.next_after(scheduling.utcnow())
    ls.change(orch.ledger, s.id, paused=False, due_at=due)
    out(f"schedule {name} resumed: next run {c.local(due).isoformat()}")


@schedule_app.command("run")
def run(name: str):
    """One run now (outside the cron and the window; still under the ceilings, one at a time)."""
    import sys

    from orchestrator.schedules import scheduling

    orch = open_orch()
    got = scheduling.run_now(orch, _schedule(orch, name))
    out(f"{got['name']}: {got['state']} ({clean(got['reason'], 400)})")
    if got.get("watched"):
        say(got["watched"])
    if got["state"] in ("skipped", "failed"):
        sys.exit(got["exit_code"])  # the code `orch run` gives the same refusal (README, "CLI reference")
