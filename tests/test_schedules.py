"""Jobs that start themselves (``orch schedule``): cron as users write it, in a time zone, through
daylight-saving nights, missed runs and windows (a clock the test controls, no waiting for real
minutes), launched by reaper passes on the local provider one at a time, under a price ceiling on
the fake RunPod, and once per occurrence with two reapers on one PostgreSQL ledger."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from itertools import islice
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.clouds import configure, local_billing, runpod, wait_for  # noqa: F401  (runpod: the fake RunPod fixture)
from tests.conftest import ROOT, run_orch
from tests.postgres import pg_server, pg_url  # noqa: F401  (fixtures)
from tests.racers import race

MADRID = ZoneInfo("Europe/Madrid")
UTC = timezone.utc
MIN = timedelta(minutes=1)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def at(*args, tz=UTC) -> datetime:
    return datetime(*args, tzinfo=tz).astimezone(UTC)


def reaper():
    from orchestrator.instances.lifecycle import Orch

    return Orch.open(actor="reaper", say=lambda m: None)


def one_pass(orch, t: datetime) -> list[dict]:
    """A reaper pass (``orch reap``'s) at the test's clock: what it did with jobs and schedules."""
    from orchestrator.reaper import duty

    return duty.one_pass(orch, now=lambda: t)[1]


def schedule(orch, name: str):
    from orchestrator.schedules import ledger_schedules

    return ledger_schedules.get(orch.ledger, name)


def occurrences(orch, name: str) -> list:
    from orchestrator.schedules import ledger_schedules

    s = schedule(orch, name)
    return sorted(ledger_schedules.runs(orch.ledger, s.id), key=lambda r: r.occurrence)


# -- cron as users write it -----------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--cron", "0 25 * * *"], "the hour field '25' is not valid: 0-23"),
    (["--cron", "61 2 * * *"], "the minute field '61' is not valid: 0-59"),
    (["--cron", "0 2 * * 8"], "the day-of-week field '8' is not valid: 0-7 or sun-sat (0 and 7 are Sunday)"),
    (["--cron", "0 2 L * *"], "the day-of-month field 'L' is not valid"),
    (["--cron", "0 2 * * * *"], "has 6 field(s); cron has five"),
    (["--cron", "0 0 31 2 *"], "never happens"),
    (["--cron", "@reboot"], "not a cron alias"),
    (["--cron", "0 2 * * *", "--tz", "Europe/Madird"], "--tz: unknown time zone 'Europe/Madird'"),
    (["--cron", "0 2 * * *", "--window", "22:00-25:00"], "--window takes HH:MM-HH:MM"),
    (["--cron", "0 2 * * *", "--max-cost", "-1"], "--max-cost is a $ amount of 0 or more"),
    (["--cron", "0 2 * * *", "--overlap", "never"], "--overlap is one of skip, queue"),
    ([], "needs --cron EXPR"),
    (["Bad_Name", "--cron", "0 2 * * *"], "invalid schedule name 'Bad_Name': use 1-22 lowercase letters"),
])
def test_bad_input_is_one_line_naming_what_is_wrong_exit_2_and_nothing_stored(orch_home, tmp_path, args, says):
    task = write(tmp_path / "task.yaml", """
        name: nightly
        resources: {cpu: true}
        run: echo hi
        """)
    proc = run_orch("schedule", "add", "-f", task, *args, check=2)
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (orch_home / "ledger.db").exists(), "refused before the ledger is opened"


def test_a_scheduled_task_files_workdir_stays_beside_it_and_a_folder_elsewhere_is_given_with_workdir(orch_home,
                                                                                                      tmp_path):
    write(tmp_path / "proj" / "train.py", "print('hi')\n")
    task = write(tmp_path / "downloads" / "task.yaml", f"""
        name: nightly
        resources: {{cpu: true}}
        workdir: {tmp_path / "user"}
        run: python train.py
        """)
    proc = run_orch("schedule", "add", "-f", task, "--cron", "@daily", check=2)
    assert f"{task}:3: workdir '{tmp_path / 'user'}' leaves the task file's folder" in proc.stderr, proc.stderr
    assert not (orch_home / "ledger.db").exists() and not (orch_home / "schedules").exists()
    proc = run_orch("schedule", "add", "-f", task, "--cron", "@daily", "--workdir", tmp_path / "user", check=2)
    assert "--workdir: workdir " in proc.stderr and "is your home folder" in proc.stderr
    added = run_orch("schedule", "add", "-f", task, "--cron", "@daily", "--workdir", tmp_path / "proj", check=0)
    assert f"workdir   {(tmp_path / 'proj').resolve()}, as it is now" in added.stdout, added.stdout


def test_a_bad_field_in_the_task_files_schedule_names_its_line(orch_home, tmp_path):
    task = write(tmp_path / "task.yaml", """
        name: nightly
        resources: {cpu: true}
        run: echo hi
        schedule:
          cron: "0 2 * * mon-fry"
        """)
    proc = run_orch("schedule", "add", "-f", task, check=2)
    assert f"{task}:5: schedule.cron: the day-of-week field 'mon-fry' is not valid" in proc.stderr, proc.stderr


def test_cron_fields_as_posix_has_them():
    from orchestrator.schedules import cron

    start = at(2025, 1, 1)  # a Wednesday
    first = {expr: cron.Cron.of(expr, "UTC").next_after(start) for expr in (
        "0 0 * * 0", "0 0 * * 7", "0 0 * * sun", "@weekly", "0 9 * * mon-fri", "*/20 9-10 * * *",
        "0 0 1,15 * *", "0 0 1 jan,jul *", "@daily", "@hourly", "@monthly", "0 0 13 * fri")}
    assert first["0 0 * * 0"] == first["0 0 * * 7"] == first["0 0 * * sun"] == first["@weekly"] == at(2025, 1, 5)
    assert first["0 9 * * mon-fri"] == at(2025, 1, 1, 9) and first["*/20 9-10 * * *"] == at(2025, 1, 1, 9)
    assert first["0 0 1,15 * *"] == at(2025, 1, 15) and first["0 0 1 jan,jul *"] == at(2025, 7, 1)
    assert (first["@daily"], first["@hourly"], first["@monthly"]) == (at(2025, 1, 2), at(2025, 1, 1, 1), at(2025, 2, 1))
    assert first["0 0 13 * fri"] == at(2025, 1, 3), "both day fields restricted: either one matches (POSIX)"


def test_the_day_fields_as_cronie_runs_them():
    """cronie's rule (github.com/cronie-crond/cronie: ``src/entry.c`` sets DOM_STAR/DOW_STAR for a
    day field starting with '*', ``src/cron.c`` then needs dom AND dow; OR otherwise), not
    croniter's: ``*/2`` beside a weekday is the odd days that are that weekday."""
    from orchestrator.schedules import cron

    def first(expr: str, n: int = 4) -> list[datetime]:
        return list(islice(cron.Cron.of(expr, "UTC").occurrences(at(2025, 2, 1)), n))

    # Odd days AND Mondays: Feb 3 and 17, Mar 3 and 17 (croniter alone adds every odd day and every Monday).
    assert first("0 0 */2 * 1") == [at(2025, 2, 3), at(2025, 2, 17), at(2025, 3, 3), at(2025, 3, 17)]
    # The 1st AND a Sunday, Tuesday, Thursday or Saturday: after July 2nd 2025 (a Wednesday), August 1st is a
    # Friday, September 1st a Monday, October 1st a Wednesday: November 1st (a Saturday) is the next.
    assert cron.Cron.of("0 0 1 * */2", "UTC").next_after(at(2025, 7, 2)) == at(2025, 11, 1)
    # The same days written without a leading '*': either field matches (POSIX).
    assert first("0 0 1-31/2 * 1") == [at(2025, 2, 1), at(2025, 2, 3), at(2025, 2, 5), at(2025, 2, 7)]
    # Both restricted, one side never meets the month: the other still runs (every Monday of February).
    assert first("0 0 30 2 1") == [at(2025, 2, 3), at(2025, 2, 10), at(2025, 2, 17), at(2025, 2, 24)]
    assert cron.Cron.of("0 0 30 2 1", "UTC").latest(at(2025, 6, 1)) == at(2025, 2, 24)
    # A Sunday written 0 at the end of a day-of-week range is 7 (cronie's get_range): Friday to Sunday.
    assert first("0 0 * * fri-sun", 3) == first("0 0 * * 5-0", 3) == [at(2025, 2, 1), at(2025, 2, 2), at(2025, 2, 7)]


@pytest.mark.parametrize("expr, said", [
    ("0 0 5-1 * *", "the day-of-month field '5-1' has a range that goes down (5-1)"),
    ("0 22-2 * * *", "the hour field '22-2' has a range that goes down (22-2)"),
    ("0 0 * dec-jan *", "the month field 'dec-jan' has a range that goes down (dec-jan)"),
    ("0 0 * * 5-1", "the day-of-week field '5-1' has a range that goes down (5-1)"),
    ("0 0 30 2 */2", "never happens: the day-of-month field '30' and the month field '2' never meet (a day field "
                     "starting with * makes both day fields required"),
])
def test_cron_refuses_what_cron_would_never_run_as_written(expr, said):
    """Vixie cron refuses a range that goes down (``num1 > num2`` in its ``get_range``); today's
    cronie sets no value for it (the field never matches); croniter would wrap it round."""
    from orchestrator.schedules import cron
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError) as e:
        cron.parse(expr)
    assert said in str(e.value), str(e.value)


def test_the_next_run_of_0_2_in_madrid_is_0200_madrid_time(orch_home, tmp_path):
    from orchestrator.schedules import cron

    c = cron.Cron.of("0 2 * * *", "Europe/Madrid")
    assert c.next_after(at(2025, 1, 10, 12)) == at(2025, 1, 11, 1)  # 02:00 CET (+01:00)
    assert c.next_after(at(2025, 7, 10, 12)) == at(2025, 7, 11, 0)  # 02:00 CEST (+02:00)
    task = write(tmp_path / "task.yaml", """
        name: nightly
        resources: {cpu: true}
        run: echo hi
        """)
    added = run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", "--tz", "Europe/Madrid", check=0)
    assert "no reaper is installed" in added.stderr, "add warns that nothing will start the runs"
    shown = json.loads(run_orch("schedule", "ls", "--json", check=0).stdout)
    assert [d["name"] for d in shown] == ["nightly"]
    nxt = datetime.fromisoformat(shown[0]["next_run"])
    assert nxt.utcoffset() == nxt.astimezone(MADRID).utcoffset(), "ISO 8601 with Madrid's offset that night"
    assert (nxt.astimezone(MADRID).hour, nxt.minute) == (2, 0)
    assert timedelta(0) < nxt - datetime.now(UTC) <= timedelta(hours=24)
    assert f"nightly-{nxt.astimezone(MADRID):%Y%m%d}-0200" in added.stdout


# -- what passes decide, on a clock the test controls ----------------------------------------------
def simulate(rule, start: datetime, end: datetime, every: timedelta = 5 * MIN, gaps=(), starts=lambda occ, t: True):
    """Passes every ``every`` from ``start`` to ``end`` (none inside ``gaps``), as ``scheduling``
    drives ``cron.step``: (runs as (occurrence, when), skips as (occurrence, why))."""
    from orchestrator.schedules import cron

    due, waiting, runs, skips, t = rule.cron.next_after(start), None, [], [], start
    while t <= end:
        if not any(a <= t < b for a, b in gaps):
            st = cron.step(rule, due, t, waiting)
            if st.action == "wait":
                due = max(due, st.due)
            elif st.action == "skip":
                skips.append((st.occurrence, st.reason))
                waiting, due = None, st.due
            elif starts(st.occurrence, t):
                runs.append((st.occurrence, t))
                waiting, due = None, st.due
            else:  # a window's retry: the next pass tries again
                waiting, due = st.occurrence, max(due, st.occurrence)
        t += every
    return runs, skips


def test_daylight_saving_nights_a_time_that_does_not_exist_runs_once_and_one_that_exists_twice_runs_once():
    from orchestrator.schedules import cron

    nightly = cron.Rule(cron.Cron.of("30 2 * * *", "Europe/Madrid"))
    # 2025-03-30: at 02:00 Madrid's clocks jump to 03:00; 02:30 does not exist. It runs once, when they jump.
    runs, skips = simulate(nightly, at(2025, 3, 29, 12), at(2025, 3, 30, 12))
    assert [occ for occ, _ in runs] == [at(2025, 3, 30, 3, 0, tz=MADRID)] and skips == []
    assert nightly.cron.run_name("n", runs[0][0]) == "n-20250330-0300"
    # 2025-10-26: at 03:00 they go back to 02:00; 02:30 happens twice. It runs once, the first time.
    runs, skips = simulate(nightly, at(2025, 10, 25, 12), at(2025, 10, 26, 12))
    assert [occ for occ, _ in runs] == [at(2025, 10, 26, 0, 30)] and skips == []  # 02:30 CEST
    # Every 15 minutes across both nights: the skipped hour is one run, the repeated hour runs once.
    quarter = cron.Cron.of("*/15 * * * *", "Europe/Madrid")
    spring = [quarter.local(u).strftime("%H:%M%z") for u in islice(quarter.occurrences(at(2025, 3, 30, 0, 30)), 4)]
    assert spring == ["01:30+0100", "01:45+0100", "03:00+0200", "03:15+0200"]
    fall = list(islice(quarter.occurrences(at(2025, 10, 25, 23, 50)), 9))
    assert [quarter.local(u).strftime("%H:%M%z") for u in fall] == [
        "02:00+0200", "02:15+0200", "02:30+0200", "02:45+0200", "03:00+0100", "03:15+0100", "03:30+0100",
        "03:45+0100", "04:00+0100"]
    assert len({quarter.run_name("q", u) for u in fall}) == len(fall), "every run's name is its own"
    # The same rule in New York (2025-03-09 02:30 does not exist there).
    ny = cron.Rule(cron.Cron.of("30 2 * * *", "America/New_York"))
    runs, _ = simulate(ny, at(2025, 3, 8, 12), at(2025, 3, 9, 12))
    assert [occ for occ, _ in runs] == [at(2025, 3, 9, 3, 0, tz=ZoneInfo("America/New_York"))]


def test_a_missed_run_follows_misfire_skip_or_run_once_and_never_runs_a_backlog():
    from orchestrator.schedules import cron

    daily = cron.Cron.of("0 2 * * *", "UTC")
    asleep = [(at(2025, 1, 1, 1), at(2025, 1, 4, 9))]  # the laptop slept three nights
    runs, skips = simulate(cron.Rule(daily, misfire="skip"), at(2025, 1, 1), at(2025, 1, 5, 12), gaps=asleep)
    assert [occ for occ, _ in runs] == [at(2025, 1, 5, 2)]
    assert [occ for occ, _ in skips] == [at(2025, 1, 4, 2)]
    assert "missed" in skips[0][1] and "came 7 h later" in skips[0][1] and "3 earlier occurrence(s)" in skips[0][1]
    runs, skips = simulate(cron.Rule(daily, misfire="run-once"), at(2025, 1, 1), at(2025, 1, 5, 12), gaps=asleep)
    assert runs == [(at(2025, 1, 4, 2), at(2025, 1, 4, 9)), (at(2025, 1, 5, 2), at(2025, 1, 5, 2))] and skips == []
    # A pass within the grace is on time; two installed-reaper intervals widen it.
    late = cron.step(cron.Rule(daily), at(2025, 1, 1, 2), at(2025, 1, 1, 2, 9))
    assert late.action == "run" and late.reason == ""
    assert cron.step(cron.Rule(daily), at(2025, 1, 1, 2), at(2025, 1, 1, 2, 11)).action == "skip"
    assert cron.grace(1800) == timedelta(hours=1) and cron.grace(None) == cron.MIN_GRACE


def test_a_window_starts_a_run_only_inside_it_and_tries_again_until_it_closes():
    from orchestrator.schedules import cron

    # Due at 23:00, started only between 00:00 and 06:00 (Madrid), when an offer is under the ceiling.
    rule = cron.Rule(cron.Cron.of("0 23 * * *", "Europe/Madrid"), cron.parse_window("00:00-06:00"))
    cheap_at = at(2025, 2, 2, 3, 40, tz=MADRID)
    runs, skips = simulate(rule, at(2025, 2, 1, 12), at(2025, 2, 2, 12), starts=lambda occ, t: t >= cheap_at)
    assert runs == [(at(2025, 2, 1, 23, tz=MADRID), at(2025, 2, 2, 3, 40, tz=MADRID))] and skips == []
    # No offer under the ceiling all night: skipped when the window closes, and only then.
    runs, skips = simulate(rule, at(2025, 2, 1, 12), at(2025, 2, 2, 12), starts=lambda occ, t: False)
    assert runs == [] and [occ for occ, _ in skips] == [at(2025, 2, 1, 23, tz=MADRID)]
    assert "its window 00:00-06:00 closed at 2025-02-02 06:00 CET before it could start" in skips[0][1]
    # A window across midnight, and a pass that came after it closed.
    late = cron.Rule(cron.Cron.of("0 22 * * *", "UTC"), cron.parse_window("22:30-01:00"))
    assert cron.step(late, at(2025, 2, 1, 22), at(2025, 2, 1, 22, 10)).action == "wait"
    assert cron.step(late, at(2025, 2, 1, 22), at(2025, 2, 2, 0, 50)).action == "run"
    gone = cron.step(late, at(2025, 2, 1, 22), at(2025, 2, 2, 1, 5))
    assert gone.action == "skip" and "closed" in gone.reason


# -- launched by reaper passes -------------------------------------------------------------------
def blocking_task(tmp_path: Path, name: str, flag: Path) -> Path:
    work = tmp_path / "work"
    write(work / "msg.txt", "as added\n")
    return write(tmp_path / f"{name}.yaml", f"""
        name: {name}
        resources: {{cpu: true}}
        workdir: work
        run: cat msg.txt > out.txt; while [ ! -e {flag} ]; do sleep 0.1; done
        outputs: [out.txt]
        """)


def jobs_of(orch, prefix: str) -> dict:
    return {j.name: j for j in orch.ledger.jobs() if j.name.startswith(prefix + "-")}


def until_ended(orch, name: str, t: datetime):
    """Reaper passes at the test's clock until the job ``name`` has ended."""
    from orchestrator import jobs

    def ended():
        one_pass(orch, t)
        job = orch.ledger.job(name)
        return job if job is not None and job.state in jobs.ENDED else None

    return wait_for(ended, timeout=90, what=f"{name} ended")


@pytest.mark.long
def test_an_every_minute_schedule_started_by_reaper_passes_completes_its_runs_never_two_at_once(orch_home, tmp_path):
    from orchestrator.schedules import cron

    flag = tmp_path / "go"
    task = blocking_task(tmp_path, "tick", flag)
    run_orch("schedule", "add", "-f", task, "--cron", "* * * * *", check=0)
    (tmp_path / "work" / "msg.txt").write_text("changed after\n")  # a run runs the snapshot taken by add
    orch = reaper()
    c, t0 = cron.Cron("* * * * *", "UTC"), cron.utc(schedule(orch, "tick").due_at)
    first, second, third = (c.run_name("tick", t0 + k * MIN) for k in range(3))

    assert [(d["name"], d["state"]) for d in one_pass(orch, t0 + 10 * timedelta(seconds=1))] == [(first, "running")]
    got = one_pass(orch, t0 + MIN + timedelta(seconds=5))  # the first still runs: the next is skipped
    assert [(d["name"], d["state"]) for d in got if d["name"] == second] == [(second, "skipped")]
    assert f"{first} is still running (--overlap skip)" in got[-1]["reason"]
    assert list(jobs_of(orch, "tick")) == [first]
    flag.touch()
    until_ended(orch, first, t0 + MIN + timedelta(seconds=30))  # the schedule is not due again in that minute
    got = one_pass(orch, t0 + 2 * MIN + timedelta(seconds=2))
    assert [(d["name"], d["state"]) for d in got] == [(third, "running")]
    until_ended(orch, third, t0 + 2 * MIN + timedelta(seconds=30))

    runs = jobs_of(orch, "tick")
    assert sorted(runs) == [first, third] and {j.state for j in runs.values()} == {"completed"}
    assert cron.utc(runs[first].ended_at) <= cron.utc(runs[third].created_at), "never two runs at once"
    for name in (first, third):
        assert (orch_home / "runs" / name / "out.txt").read_text() == "as added\n"
    assert local_billing(orch_home) == set()
    shown = json.loads(run_orch("schedule", "ls", "--json", check=0).stdout)[0]
    assert (shown["last_run"]["name"], shown["last_run"]["state"]) == (third, "completed")
    assert shown["last_skip"]["name"] == second and "--overlap skip" in shown["last_skip"]["reason"]
    listed = {d["name"]: d["schedule"] for d in json.loads(run_orch("jobs", "--json", check=0).stdout)}
    assert listed == {first: "tick", third: "tick"}
    assert "schedule tick started it" in run_orch("jobs", "show", first, check=0).stdout


def test_overlap_queue_waits_for_the_run_before_it_and_runs_once(orch_home, tmp_path):
    from orchestrator.schedules import cron

    flag = tmp_path / "go"
    run_orch("schedule", "add", "-f", blocking_task(tmp_path, "q", flag), "--cron", "* * * * *", "--overlap", "queue",
             check=0)
    orch = reaper()
    c, t0 = cron.Cron("* * * * *", "UTC"), cron.utc(schedule(orch, "q").due_at)
    first, queued = c.run_name("q", t0), c.run_name("q", t0 + MIN)
    assert [d["state"] for d in one_pass(orch, t0 + timedelta(seconds=5))] == ["running"]
    for t in (t0 + MIN + timedelta(seconds=5), t0 + 2 * MIN + timedelta(seconds=5)):  # still running: it waits
        got = [d for d in one_pass(orch, t) if d["name"] != first]
        assert [(d["name"], d["state"]) for d in got] == [(queued, "waiting")], got
        assert f"waits for {first} (running) to end (--overlap queue)" in got[0]["reason"]
    flag.touch()
    later = t0 + 2 * MIN + timedelta(seconds=20)

    def started() -> bool:  # the pass that ends the first run starts the one that waited
        one_pass(orch, later)
        return queued in jobs_of(orch, "q")

    wait_for(started, timeout=90, what="the queued run")
    until_ended(orch, queued, later)
    assert sorted(jobs_of(orch, "q")) == [first, queued], "the occurrences it waited through run as one"
    states = [(cron.utc(r.occurrence), r.state) for r in occurrences(orch, "q")]
    assert states == [(t0, "launched"), (t0 + MIN, "launched")]


def test_a_missed_run_is_recorded_skipped_once_and_said(orch_home, tmp_path):
    from orchestrator.schedules import scheduling

    task = write(tmp_path / "task.yaml", """
        name: nightly
        resources: {cpu: true}
        run: echo hi
        """)
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", "--tz", "Europe/Madrid", check=0)
    orch = reaper()
    due = schedule(orch, "nightly").due_at
    woke = due + timedelta(hours=7)  # the first pass after it: seven hours late
    got = scheduling.run_due(orch, woke)
    assert [d["state"] for d in got] == ["skipped"] and "missed" in got[0]["reason"], got
    assert scheduling.run_due(orch, woke + MIN) == [], "settled once"
    assert orch.ledger.jobs() == [] and local_billing(orch_home) == set()
    shown = json.loads(run_orch("schedule", "ls", "--json", check=0).stdout)[0]
    assert "came 7 h later" in shown["last_skip"]["reason"] and shown["last_run"] is None
    assert datetime.fromisoformat(shown["next_run"]) > woke


def test_a_pass_with_nothing_due_asks_sqlite_alone(orch_home, tmp_path):
    """Every reaper pass asks whether a schedule is due: with none due it reads SQLite with the
    standard library and never imports the ledger's models (a quiet pass stays cheap)."""
    task = write(tmp_path / "task.yaml", "name: later\nresources: {cpu: true}\nrun: 'true'\n")
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", check=0)
    code = ("import sys\nfrom orchestrator.instances.lifecycle import Orch\nfrom orchestrator.schedules import scheduling\n"
            "print(scheduling.run_due(Orch.open(lazy=True)), 'sqlalchemy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["[]", "False"], done.stdout + done.stderr


# -- money ----------------------------------------------------------------------------------------
def gpu_task(tmp_path: Path, name: str, extra: str = "") -> Path:
    return write(tmp_path / f"{name}.yaml", f"""
        name: {name}
        resources:
          provider: runpod
          gpu: RTX 4090
        run: echo hi
        {extra}
        """)


def notify_to(orch_home: Path, url: str) -> None:
    from orchestrator import config

    path = orch_home / "config.toml"
    path.write_text(path.read_text() + f'\n[notify]\nwebhook_url = "{url}"\nevents = ["schedule"]\n')
    config._load.cache_clear()


def test_a_ceiling_no_offer_meets_skips_the_run_rents_nothing_and_says_why(orch_home, tmp_path, runpod):
    from orchestrator import notify
    from tests.fakes.webhook import Hook

    fake, env = runpod
    hook = Hook()
    notify_to(orch_home, hook.url)
    run_orch("schedule", "add", "-f", gpu_task(tmp_path, "cheap"), "--cron", "0 0 * * *", "--tz", "Europe/Madrid",
             "--max-price", "0.05", "--window", "00:00-06:00", env=env, check=0)
    orch = reaper()
    due = schedule(orch, "cheap").due_at
    for hours in (0.1, 3):  # inside the window: each pass asks again
        got = one_pass(orch, due + timedelta(hours=hours))
        assert [d["state"] for d in got] == ["waiting"], got
        assert "/hr is over --max-price $0.05; nothing rented; the next pass tries again, until 06:00" in \
            got[0]["reason"], got
    assert hook.posts == [], "a run still trying says nothing yet"
    got = one_pass(orch, due + timedelta(hours=6, minutes=5))
    assert [d["state"] for d in got] == ["skipped"], got
    reason = got[0]["reason"]
    assert "window 00:00-06:00 closed" in reason and "over --max-price $0.05" in reason
    notify.drain()
    assert len(hook.texts()) == 1 and "cheap-" in hook.texts()[0] and "over --max-price" in hook.texts()[0]
    hook.close()
    assert fake.pods == {} and orch.ledger.instances() == [] and orch.ledger.jobs() == [], "nothing rented"
    shown = json.loads(run_orch("schedule", "ls", "--json", env=env, check=0).stdout)[0]
    assert shown["last_skip"]["price_hr"] > 0.05 and shown["last_run"] is None


def test_a_plan_estimated_over_max_cost_is_skipped_with_its_estimate(orch_home, tmp_path, runpod):
    from orchestrator.schedules import scheduling

    fake, env = runpod
    run_orch("schedule", "add", "-f", gpu_task(tmp_path, "est", "max_hours: 2"), "--cron", "@hourly",
             "--max-cost", "0.1", env=env, check=0)
    orch = reaper()
    got = scheduling.run_due(orch, schedule(orch, "est").due_at + MIN)
    assert [d["state"] for d in got] == ["skipped"], got
    assert "is over --max-cost $0.1; nothing rented" in got[0]["reason"]
    row = occurrences(orch, "est")[-1]
    assert row.usd == pytest.approx(row.price_hr * 2) and row.usd > 0.1
    assert fake.pods == {} and orch.ledger.jobs() == []


def test_a_scheduled_run_with_max_cost_asks_each_provider_for_its_offers_once(orch_home, tmp_path, runpod):
    """The estimate checked against --max-cost is the plan the run rents: RunPod's catalog is listed
    for it as often as for one `orch run --dry-run` of the task (once per cloud), not twice."""
    fake, env = runpod
    task = gpu_task(tmp_path, "once", "max_hours: 2")
    run_orch("run", "-f", task, "--dry-run", env=env, check=0)
    listings = [p for m, p, _ in fake.requests if m == "GET" and "/catalog/gpus" in p]
    assert listings, fake.requests[:5]
    run_orch("schedule", "add", "-f", task, "--cron", "@hourly", "--max-cost", "100", env=env, check=0)
    fake.requests.clear()
    orch = reaper()
    due = schedule(orch, "once").due_at + MIN
    got = scheduling_run_due(orch, due)
    assert [d["state"] for d in got] == ["running"], got
    asked = [p for m, p, _ in fake.requests if m == "GET" and "/catalog/gpus" in p]
    assert len(asked) == len(listings), (asked, listings)
    row = occurrences(orch, "once")[-1]
    assert row.usd == pytest.approx(row.price_hr * 2) and row.usd <= 100
    until_ended(orch, got[0]["name"], due + MIN)
    assert fake.pods == {} or all(p.status == "TERMINATED" for p in fake.pods.values())


def scheduling_run_due(orch, t: datetime) -> list[dict]:
    from orchestrator.schedules import scheduling

    return scheduling.run_due(orch, t)


@pytest.mark.training
@pytest.mark.long(weight=2)
def test_a_scheduled_libreyolo_training_runs_on_a_reaper_pass_and_brings_its_weights_home(orch_home, tmp_path):
    """The seed's nightly job: a train: task on a cron; a reaper pass starts the run, later passes
    follow it to its end, and its weights are home under the run's name."""
    pytest.importorskip("torch")
    from orchestrator.tasks import dataset

    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    task = write(tmp_path / "nightly.yaml", f"""
        name: nightly
        resources: {{cpu: true}}
        train:
          data: {ds}
          model: yolo9-t
          epochs: 1
          imgsz: 64
          batch: 4
          args: {{workers: 0}}
        """)
    added = run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", check=0)
    assert "runs      " in added.stdout and "train yolo9-t for 1 epochs" in added.stdout, added.stdout
    orch = reaper()
    due = schedule(orch, "nightly").due_at + MIN
    got = one_pass(orch, due)
    assert [d["state"] for d in got if d["name"].startswith("nightly-")] in (["running"], ["training"]), got
    name = next(d["name"] for d in got if d["name"].startswith("nightly-"))

    def ended():
        one_pass(orch, due + MIN)
        job = orch.ledger.job(name)
        return job if job is not None and job.state in ("completed", "failed", "stopped", "cancelled") else None

    job = wait_for(ended, timeout=500, what=f"{name} ended")
    assert job.state == "completed", job.reason
    assert (orch_home / "runs" / name / "weights" / "last.pt").is_file()
    assert local_billing(orch_home) == set()


# -- secrets: the schedule's own, apart from the reaper's keys ----------------------------------------
def secret_task(tmp_path: Path, name: str, secrets: str = "[SCHED_TEST_TOKEN]") -> Path:
    return write(tmp_path / f"{name}.yaml", f"""
        name: {name}
        resources: {{cpu: true}}
        run: printf %s "$SCHED_TEST_TOKEN" | sha256sum > out.txt; env > env.txt
        secrets: {secrets}
        outputs: [out.txt, env.txt]
        """)


def test_a_scheduled_runs_secret_is_its_own_kept_whole_and_a_missing_one_skips_it(orch_home, tmp_path):
    """Finding 5 of issue 53: a value over several lines (a PEM key) made the reaper's environment
    file unreadable, every schedule skipped and `orch reaper install` raise ValueError. Each
    schedule's secrets are now its own file (0600), read back whole; reaper.env holds none."""
    from orchestrator.reaper import reaper_timer
    from orchestrator.schedules import scheduling

    token = ("-----BEGIN PRIVATE KEY-----\n" + os.urandom(12).hex() + "\nit's \"quoted\" $HOME `x`\n"
             "-----END PRIVATE KEY-----\n")
    task = secret_task(tmp_path, "secretive")
    assert "SCHED_TEST_TOKEN is not set" in run_orch("schedule", "add", "-f", task, "--cron", "@hourly",
                                                     check=2).stderr
    added = run_orch("schedule", "add", "-f", task, "--cron", "@hourly", env={"SCHED_TEST_TOKEN": token}, check=0)
    kept = orch_home / "schedule-secrets" / "secretive.json"
    assert f"kept for schedule secretive's runs alone in {kept}" in added.stderr, added.stderr
    assert kept.stat().st_mode & 0o777 == 0o600 and kept.parent.stat().st_mode & 0o777 == 0o700
    (orch_home / "reaper.env").write_text("OLD='one\ntwo'\nPATH=/usr/bin\n")  # an older orch's many-line value
    reaper_timer.write_env(orch_home)  # `orch reaper install`: no ValueError, and not the schedule's secret
    assert token not in (orch_home / "reaper.env").read_text() and "OLD" not in (orch_home / "reaper.env").read_text()
    ledger_bytes = b"".join(p.read_bytes() for p in orch_home.glob("ledger.db*"))
    assert token.encode() not in ledger_bytes, "never in the ledger"

    orch = reaper()
    due = schedule(orch, "secretive").due_at
    saved = kept.read_bytes()
    kept.unlink()
    os.environ["SCHED_TEST_TOKEN"] = "the reaper's own, not the schedule's"  # its environment is not the schedule's
    try:
        got = scheduling.run_due(orch, due + MIN)
    finally:
        del os.environ["SCHED_TEST_TOKEN"]
    assert [d["state"] for d in got] == ["skipped"], got
    assert "secret SCHED_TEST_TOKEN is not stored for schedule secretive" in got[0]["reason"]
    assert orch.ledger.jobs() == [] and local_billing(orch_home) == set(), "nothing launched half-configured"
    kept.write_bytes(saved)
    kept.chmod(0o600)
    got = scheduling.run_due(orch, due + timedelta(hours=1, minutes=1))
    assert [d["state"] for d in got] == ["running"], got
    assert "SCHED_TEST_TOKEN" not in os.environ, "the pass's environment is as it was"
    until_ended(orch, got[0]["name"], due + timedelta(hours=1, minutes=2))
    out = (orch_home / "runs" / got[0]["name"] / "out.txt").read_text()
    assert out.split()[0] == hashlib.sha256(token.encode()).hexdigest(), "the command had the secret, whole"
    assert (orch_home / "runs" / got[0]["name"] / "train.log").is_file(), "its log came home: the pass hid the secret"
    ledger_bytes = b"".join(p.read_bytes() for p in orch_home.glob("ledger.db*"))
    assert token.encode() not in ledger_bytes
    assert "removed" in run_orch("schedule", "rm", "secretive", check=0).stdout
    assert not kept.exists(), "its secrets went with it"


def test_a_schedule_row_naming_a_provider_key_is_skipped_and_the_key_never_reaches_the_instance(orch_home, tmp_path):
    """Finding 2 of issue 53: a scheduled run read its secrets from the reaper's environment, which
    holds every provider's key, so a row a teammate wrote into a shared ledger (or a schedule whose
    secrets were changed there) got them. A row naming one of orch's own credentials, or any secret
    not stored for that schedule, is skipped with the reason; the other schedules still run."""
    from sqlalchemy import text

    from orchestrator.schedules import scheduling

    token = "sched-" + os.urandom(12).hex()
    provider_key = "rpa_" + os.urandom(16).hex()
    for name in ("victim", "other", "fine"):
        run_orch("schedule", "add", "-f", secret_task(tmp_path, name), "--cron", "@hourly",
                 env={"SCHED_TEST_TOKEN": token}, check=0)
    (orch_home / "schedule-secrets" / "other.json").write_text("{not json")  # one bad file: its schedule alone
    orch = reaper()
    for name, secret in (("victim", "RUNPOD_API_KEY"), ("fine", "SCHED_TEST_TOKEN")):
        job = json.loads(schedule(orch, name).job)
        job["spec"]["command"]["secrets"] = [secret] if name == "fine" else ["SCHED_TEST_TOKEN", secret]
        with orch.ledger.engine.begin() as conn:  # straight into the table, as anyone who can write it can
            conn.execute(text("UPDATE schedules SET job = :job WHERE name = :name"),
                         {"job": json.dumps(job), "name": name})
    os.environ["RUNPOD_API_KEY"] = provider_key  # what reaper.env gives the reaper's own process
    due = schedule(orch, "fine").due_at
    try:
        got = {d["name"].rsplit("-", 2)[0]: d for d in scheduling.run_due(orch, due + MIN)}
    finally:
        del os.environ["RUNPOD_API_KEY"]
    assert got["victim"]["state"] == "skipped", got
    assert "secret RUNPOD_API_KEY is one of the runpod provider's own settings" in got["victim"]["reason"]
    assert got["other"]["state"] == "skipped" and "cannot be read" in got["other"]["reason"], got["other"]
    assert got["fine"]["state"] == "running", got["fine"]
    fine = got["fine"]["name"]
    until_ended(orch, fine, due + 2 * MIN)
    assert [j.name for j in orch.ledger.jobs()] == [fine], "nothing launched for the refused rows"
    seen = (orch_home / "runs" / fine / "env.txt").read_text()
    assert provider_key not in seen and token in seen
    for path in orch_home.rglob("*"):
        if path.is_file():
            assert provider_key.encode() not in path.read_bytes(), f"the provider key reached {path}"
    shown = {d["name"]: d for d in json.loads(run_orch("schedule", "ls", "--json", check=0).stdout)}
    assert "RUNPOD_API_KEY" in shown["victim"]["last_skip"]["reason"]


def test_schedule_add_refuses_a_provider_key_unless_allowed_and_then_stores_it_for_that_schedule_alone(orch_home,
                                                                                                       tmp_path):
    from orchestrator.schedules import scheduling

    key = "rpa_" + os.urandom(16).hex()
    task = secret_task(tmp_path, "keyed", "[RUNPOD_API_KEY]")
    proc = run_orch("schedule", "add", "-f", task, "--cron", "@hourly", env={"RUNPOD_API_KEY": key}, check=2)
    assert f"{task}:4: secret RUNPOD_API_KEY is one of the runpod provider's own settings" in proc.stderr, proc.stderr
    assert "--allow-secret RUNPOD_API_KEY" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (orch_home / "ledger.db").exists() and not (orch_home / "schedule-secrets").exists()
    run_orch("schedule", "add", "-f", task, "--cron", "@hourly", "--allow-secret", "RUNPOD_API_KEY",
             env={"RUNPOD_API_KEY": key}, check=0)
    assert key.encode() not in b"".join(p.read_bytes() for p in orch_home.glob("ledger.db*"))
    orch = reaper()
    due = schedule(orch, "keyed").due_at
    got = scheduling.run_due(orch, due + MIN)
    assert [d["state"] for d in got] == ["running"], got
    until_ended(orch, got[0]["name"], due + 2 * MIN)
    out = (orch_home / "runs" / got[0]["name"] / "out.txt").read_text()
    assert out.split()[0] == hashlib.sha256(b"").hexdigest()  # its run printed $SCHED_TEST_TOKEN: not set
    assert key in (orch_home / "runs" / got[0]["name"] / "env.txt").read_text(), "handed over on purpose"


# -- the commands --------------------------------------------------------------------------------
def test_pause_resume_run_replace_and_rm(orch_home, tmp_path):
    from orchestrator.schedules import scheduling

    work = tmp_path / "work"
    write(work / "msg.txt", "one\n")
    task = write(tmp_path / "task.yaml", """
        name: hand
        resources: {cpu: true}
        workdir: work
        run: cat msg.txt > out.txt
        outputs: [out.txt]
        """)
    run_orch("schedule", "add", "-f", task, "--cron", "0 3 * * *", check=0)
    assert "exists" in run_orch("schedule", "add", "-f", task, "--cron", "0 3 * * *", check=2).stderr
    orch = reaper()
    first_snapshot = schedule(orch, "hand").snapshot
    assert "paused" in run_orch("schedule", "pause", "hand", check=0).stdout
    assert scheduling.run_due(orch, schedule(orch, "hand").due_at + MIN) == [], "a paused schedule starts nothing"
    assert "PAUSED" in run_orch("schedule", "ls", check=0).stdout
    assert "resumed: next run" in run_orch("schedule", "resume", "hand", check=0).stdout
    (work / "msg.txt").write_text("two\n")
    replaced = run_orch("schedule", "add", "-f", task, "--cron", "0 4 * * *", "--replace", check=0).stdout
    assert "replaced: 0 4 * * *" in replaced
    assert schedule(orch, "hand").snapshot != first_snapshot and not Path(first_snapshot).exists()
    ran = run_orch("schedule", "run", "hand", check=0).stdout
    name = ran.split(":")[0]
    assert name.startswith("hand-") and ": running" in ran, ran
    until_ended(orch, name, datetime.now(UTC))
    assert (orch_home / "runs" / name / "out.txt").read_text() == "two\n", "--replace took a new snapshot"
    assert "no schedule named 'nope'" in run_orch("schedule", "rm", "nope", check=2).stderr
    assert "schedule hand removed" in run_orch("schedule", "rm", "hand", check=0).stdout
    assert json.loads(run_orch("schedule", "ls", "--json", check=0).stdout) == []
    assert not any((orch_home / "schedules").iterdir()), "its snapshot went with it"
    assert orch.ledger.job(name).state == "completed", "its runs stay, as jobs"


# -- two reapers, one PostgreSQL ledger ----------------------------------------------------------
def test_two_passes_claim_one_occurrence_once_on_sqlite(orch_home, tmp_path):
    from orchestrator.schedules import ledger_schedules as ls

    run_orch("schedule", "add", "-f", write(tmp_path / "t.yaml", "name: c\nresources: {cpu: true}\nrun: 'true'\n"),
             "--cron", "@daily", check=0)
    a, b = reaper(), reaper()
    s = schedule(a, "c")
    occ = cron_utc(s.due_at)
    won = [ls.claim(o.ledger, s.id, occ, "c-x") for o in (a, b)]
    assert [w is not None for w in won] == [True, False]
    assert ls.settle(a.ledger, won[0].id, ls.WAITING)
    assert ls.claim(b.ledger, s.id, occ, "c-x") is not None, "a waiting occurrence is taken by compare-and-set"
    assert ls.claim(a.ledger, s.id, occ, "c-x") is None


def cron_utc(dt):
    from orchestrator.schedules import cron

    return cron.utc(dt)


RACE = ("import json, sys\nfrom datetime import datetime\nfrom orchestrator.instances.lifecycle import Orch\n"
        "from orchestrator.schedules import scheduling\n")
CONNECTED = 'orch = Orch.open(actor="reaper", say=lambda m: None)\norch.ledger.revision()\n'
PASS = "print(json.dumps(scheduling.run_due(orch, datetime.fromisoformat(sys.argv[1]))))\n"


def test_two_reapers_on_one_postgresql_ledger_launch_each_occurrence_once(orch_home, tmp_path, pg_url):
    from orchestrator.schedules import ledger_schedules as ls

    task = write(tmp_path / "t.yaml", "name: team\nresources: {cpu: true}\nrun: 'true'\n")
    run_orch("schedule", "add", "-f", task, "--cron", "*/5 * * * *", check=0)
    orch = reaper()
    s = schedule(orch, "team")
    when = (cron_utc(s.due_at) + timedelta(seconds=30)).isoformat()
    racers = race(3, RACE, before=CONNECTED, body=PASS, argv=(when,), timeout=300)  # connected: passes together
    assert [r.rc for r in racers] == [0, 0, 0], [r.err[-2000:] for r in racers]
    said = [json.loads(r.out.strip().splitlines()[-1]) for r in racers]
    assert sorted(len(d) for d in said) == [0, 0, 1], said
    launched = [d for got in said for d in got]
    assert launched[0]["state"] == "running", launched
    assert [j.name for j in orch.ledger.jobs()] == [launched[0]["name"]], "one job for the occurrence"
    assert [r.state for r in ls.runs(orch.ledger, s.id)] == ["launched"]
    until_ended(orch, launched[0]["name"], cron_utc(s.due_at) + MIN)

    # The occurrence's row itself, inserted at once over six connections of their own: one wins.
    import threading

    from orchestrator.ledger.ledger import Ledger

    ledgers = [Ledger(pg_url) for _ in range(6)]
    other, ready, answers = cron_utc(s.due_at) + timedelta(days=1), threading.Barrier(6), []

    def claim(led) -> None:
        ready.wait(timeout=60)
        answers.append(ls.claim(led, s.id, other, "team-x") is not None)

    threads = [threading.Thread(target=claim, args=(led,)) for led in ledgers]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert sorted(answers) == [False] * 5 + [True], answers


# -- issue 55, 7: a CPU task's known price, the limits shown, a run held for its window ----------------
def test_max_price_holds_a_cpu_task_at_the_local_providers_known_price_and_ls_shows_the_limits(orch_home, tmp_path):
    configure(orch_home, "local", {"price_per_hour": 0.05})
    task = write(tmp_path / "task.yaml", """
        name: cpu
        resources: {cpu: true}
        run: echo hi
        """)
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", "--max-price", "0.1", "--max-cost", "2", check=0)
    configure(orch_home, "local", {"price_per_hour": 0.5})  # the price rose after the schedule was added
    ran = run_orch("schedule", "run", "cpu", check=1)
    assert ": skipped" in ran.stdout and "$0.5000/hr is over --max-price $0.1; nothing rented" in ran.stdout, ran.stdout
    assert reaper().ledger.jobs() == [] and local_billing(orch_home) == set(), "nothing rented"
    listed = run_orch("schedule", "ls", check=0).stdout
    assert "limits     --max-price $0.1/hr, --max-cost $2" in listed, listed
    run_orch("schedule", "add", "at-price", "-f", task, "--cron", "0 2 * * *", "--max-price", "0.5", check=0)
    ran = run_orch("schedule", "run", "at-price", check=0)
    assert ": running" in ran.stdout and "at $0.5000/hr" in ran.stdout, ran.stdout
    until_ended(reaper(), ran.stdout.split(":")[0], datetime.now(UTC))


def test_a_max_price_below_the_known_price_is_refused_at_add_not_skipped_at_every_run(orch_home, tmp_path):
    """`--max-price 0.1` on a CPU task the local provider prices at $0.5/hr was added, and every run
    was then skipped. The price is known before anything is rented: refused at `add`, one line
    naming both prices, exit 2, no schedule stored."""
    configure(orch_home, "local", {"price_per_hour": 0.5})
    task = write(tmp_path / "task.yaml", """
        name: cpu
        resources: {cpu: true}
        run: echo hi
        """)
    proc = run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", "--max-price", "0.1", check=2)
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("orch: error: --max-price: $0.1/hr is below the "
                                                           "$0.5000/hr"), line
    assert "every run would be skipped" in line, line
    filed = write(tmp_path / "filed.yaml", """
        name: filed
        resources: {cpu: true}
        nodes: 2
        run: echo hi
        schedule: {cron: "0 2 * * *", max_price: 0.9}
        """)
    line = run_orch("schedule", "add", "-f", filed, check=2).stderr.strip()
    assert f"{filed}:5: schedule.max_price: $0.9/hr is below the $1.0000/hr" in line, "two nodes at $0.5: " + line
    assert "no schedules" in run_orch("schedule", "ls", check=0).stdout.lower()


def test_a_run_held_outside_its_window_shows_when_it_will_run_and_that_it_waits(orch_home, tmp_path):
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    opens = now + timedelta(hours=2)
    window = f"{opens:%H:%M}-{opens + timedelta(hours=1):%H:%M}"
    task = write(tmp_path / "task.yaml", """
        name: late
        resources: {cpu: true}
        run: echo hi
        """)
    run_orch("schedule", "add", "-f", task, "--cron", "* * * * *", "--window", window, check=0)
    from orchestrator.schedules import ledger_schedules as ls
    from orchestrator.schedules import scheduling

    orch = reaper()
    ls.change(orch.ledger, schedule(orch, "late").id, due_at=now)  # due this minute, not a wait for the next
    assert scheduling.run_due(orch) == [], "held: its window has not opened"
    shown = json.loads(run_orch("schedule", "ls", "--json", check=0).stdout)[0]
    assert datetime.fromisoformat(shown["next_run"]) == opens, shown
    assert f"waits for its window {window}" in shown["waits"], shown
    listed = run_orch("schedule", "ls", check=0).stdout
    assert f"(waits: the run of" in listed and f"after {opens:%H:%M} UTC starts it" in listed, listed
    assert orch.ledger.jobs() == []


def test_a_reaper_pass_hides_each_runs_text_with_its_own_schedules_secret_alone(orch_home, tmp_path):
    """A pass hid every schedule's stored values in every run it looked after: schedule `tally`'s
    TOKEN of `2026` turned this run's `report for 2026-12-08` into `report for ***-12-08`, in the
    log that came home and in the reason its failure gave. Each run is hidden with its own
    schedule's values (and this process's), never another's."""
    secret = "s3cret-" + os.urandom(6).hex()
    mine = write(tmp_path / "report.yaml", """
        name: report
        resources: {cpu: true}
        secrets: [SCHED_SHARED_TOKEN]
        run: echo "token $SCHED_SHARED_TOKEN"; echo "report for 2026-12-08"; exit 3
        """)
    other = write(tmp_path / "tally.yaml", "name: tally\nresources: {cpu: true}\nsecrets: [SCHED_SHARED_TOKEN]\n"
                                          "run: 'true'\n")
    run_orch("schedule", "add", "-f", mine, "--cron", "0 2 * * *", env={"SCHED_SHARED_TOKEN": secret}, check=0)
    run_orch("schedule", "add", "-f", other, "--cron", "0 3 * * *", env={"SCHED_SHARED_TOKEN": "2026"}, check=0)
    orch = reaper()
    t = schedule(orch, "report").due_at + MIN
    started = [d for d in one_pass(orch, t) if d["name"].startswith("report-")]
    assert [d["state"] for d in started] == ["running"], started
    job = until_ended(orch, started[0]["name"], t)
    assert job.state == "failed" and "report for 2026-12-08" in job.reason, job.reason
    log = (orch_home / "runs" / job.name / "train.log").read_text()
    assert "token ***" in log and secret not in log, log
    assert "report for 2026-12-08" in log, "another schedule's value masked this run's text: " + log
    assert local_billing(orch_home) == set()
