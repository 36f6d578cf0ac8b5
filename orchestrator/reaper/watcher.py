"""The watcher: what advances the jobs of an ``ORCH_HOME`` while no terminal does and no reaper is
scheduled.

A job lives in the ledger and moves one step per look (``jobs.advance``). Without ``--wait`` and
without ``orch reaper install`` nothing looked until the user did: a lost machine went unnoticed
(and no checkpoint copy had been taken), a finished one kept billing. SkyPilot's jobs controller
and dstack's server watch for their users; orch has no server, so ``orch run`` starts this: one
detached process (``orch watch``: no terminal, stdin from /dev/null, its output appended to
``$ORCH_HOME/watcher.log``, a session of its own) that advances every active job of the ledger
(``jobs.advance_all``: checkpoint copies when due, a lost machine relaunched, a finished one pulled
and destroyed) every few seconds, sooner when a job's checkpoint copy falls due (``JobKind.due_in``),
and exits once no job is active. A scheduled reaper does the same on its own timer (``duty``): with
one installed, no watcher is started.

Every job gets it, whatever started it: ``orch run`` (``ensure``), a schedule's run (``scheduling``:
``orch schedule run`` and a reaper pass's due runs) and any pass by hand that leaves a job active
(``duty``, ``ensure_active``). These are the only places it is started.

One watcher per ledger: it holds the claim ``watcher:jobs`` (``claims``: a lock that dies with its
process) while it runs, and a second one exits at once. Each job is still advanced under its own
claim (``job:NAME``, a compare-and-set): the watcher, a reaper pass, ``orch jobs show`` and
``--wait`` never act on one job at the same time.

``ORCH_WATCHER=off`` starts none (a job then moves when someone looks); ``ORCH_WATCH_INTERVAL``
(seconds, default 5) or ``orch watch --interval S`` sets how often it looks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.ledger import claims
from orchestrator.errors import UsageError

CLAIM = "watcher:jobs"  # a colon: no instance name can take this claim
META = "watcher"  # the ledger's record of the running watcher: its pid and log
LOG = "watcher.log"
INTERVAL_S = 5.0
MIN_PAUSE_S = 1.0  # however small a cadence, a look (SSH to every machine) at most once a second


def enabled() -> bool:
    return os.environ.get("ORCH_WATCHER", "on").lower() not in ("0", "off", "no", "false")


def interval(value: str | None = None) -> float:
    """How often the watcher looks: ``value`` (``--interval``), else ``ORCH_WATCH_INTERVAL``, else 5 s."""
    raw = value if value is not None else os.environ.get("ORCH_WATCH_INTERVAL")
    if raw is None or raw == "":
        return INTERVAL_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0.2 <= seconds <= 3600:  # nan fails too
        raise UsageError(f"the watcher's interval is seconds from 0.2 to 3600, not {raw!r} "
                         "(ORCH_WATCH_INTERVAL, --interval)")
    return seconds


def log_path(home: Path) -> Path:
    return Path(home) / LOG


# -- who watches -----------------------------------------------------------------------------------
def watching(orch) -> str | None:
    """What advances this ledger's jobs with nobody looking, in words; None: nothing does."""
    from orchestrator.reaper import reaper_timer

    info = reaper_timer.installed(orch.ledger)
    if info:
        return (f"the scheduled reaper ({info.get('backend', '?')}, every {info.get('every', '?')} s; "
                "`orch reaper status`)")
    if claims.busy(orch.ledger, CLAIM):
        me = orch.ledger.get_json_meta(META) or {}
        return f"the watcher already running (pid {me.get('pid', '?')}, log {me.get('log', log_path(orch.home))})"
    return None


def ensure(orch, name: str) -> str:
    """One line saying what watches job ``name``, starting the watcher where nothing does."""
    now = watching(orch)
    if now:
        return f"orch: job {name} is watched by {now}"
    if not enabled():
        return (f"orch: nothing watches job {name} (ORCH_WATCHER=off): it moves when `orch jobs show {name}` looks; "
                "`orch reaper install` schedules the reaper")
    pid = spawn(orch.home)
    return (f"orch: job {name} is watched by a detached watcher (pid {pid}, log {log_path(orch.home)}): it copies "
            "checkpoints, relaunches a lost machine and ends the job, and exits when no job is active")


def ensure_active(orch) -> str | None:
    """After anything that may have left a job active without a watcher (a reaper pass run by
    hand, a schedule's run, a job submitted while ``ORCH_WATCHER`` was off in another shell): the
    watcher started where a job is active and nothing watches; the line saying so, else None."""
    if not _active(orch) or watching(orch) or not enabled():
        return None
    pid = spawn(orch.home)
    return (f"orch: the active jobs are watched by a detached watcher (pid {pid}, log {log_path(orch.home)}): "
            "it exits when no job is active")


def spawn(home: Path) -> int:
    """``orch watch`` started detached: no terminal, a session of its own (a Ctrl-C or a closed
    terminal does not reach it), its output appended to the log. Its environment is this one's:
    the provider keys and the secrets a relaunch reads."""
    import subprocess

    log = log_path(home)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "watch"], stdin=subprocess.DEVNULL,
                                stdout=fd, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    return proc.pid


# -- watching -------------------------------------------------------------------------------------
def _active(orch) -> list[str]:
    from orchestrator.ledger import ledger_sql
    from orchestrator.jobs.states import ACTIVE

    return ledger_sql.jobs_in(ACTIVE, orch.ledger.url)  # plain SQL: a quiet look opens no models


def _pause(orch, every: float) -> float:
    """Until the next look: ``every``, or sooner when a job's checkpoint copy falls due before."""
    from orchestrator.jobs import ACTIVE, JobSpec

    pause = every
    for job in orch.ledger.jobs(ACTIVE):
        try:
            due = JobSpec.of(job).kind_of().due_in(job)
        except Exception:  # noqa: BLE001 - a row the engine refuses is the engine's to report
            continue
        if due is not None:
            pause = min(pause, due)
    return max(pause, MIN_PAUSE_S)


def watch(orch, every: float | None = None, say=print) -> str:
    """Advance every active job of the ledger until none is; why it stopped. Returns at once when
    another watcher holds the claim."""
    from orchestrator import jobs
    from orchestrator.jobs.states import ACTIVE

    every = every or interval()
    said: dict[str, str] = {}
    while True:
        with claims.try_hold(orch.ledger, CLAIM) as mine:
            if not mine:
                return "another watcher watches this ledger"
            orch.ledger.set_meta(META, json.dumps({"pid": os.getpid(), "log": str(log_path(orch.home)),
                                                   "since": datetime.now(timezone.utc).isoformat()}))
            while _active(orch):
                if not orch.home.is_dir():
                    return f"{orch.home} is gone"
                try:
                    for d in jobs.advance_all(orch):  # what each step did is said by the job's own notes
                        error = d["reason"].startswith("error:")
                        line = f"job {d['name']}: {d['state']}" + (f" ({d['reason']})" if error else "")
                        if said.get(d["name"]) != line and (error or d["state"] in ACTIVE):
                            said[d["name"]] = line
                            say(line)
                    if not _active(orch):
                        break  # the last one just ended: no wait for a look that has nothing to see
                    pause = _pause(orch, every)
                except Exception as e:  # noqa: BLE001 - a ledger busy for a moment: the next look tries again
                    from orchestrator.text import why

                    say(f"this look failed ({why(e)}); the next one in {every:g} s")
                    pause = every
                time.sleep(pause)
        # The claim is let go: a job submitted meanwhile (whose `orch run` saw this watcher) is
        # looked at again, under the claim, rather than left unwatched.
        if not _active(orch):
            return "no job is active"


def main(args: list[str]) -> None:
    """``orch watch [--interval SECONDS]``: what ``orch run`` starts detached (not in ``orch --help``)."""
    value = None
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--interval" and rest:
            value = rest.pop(0)
        elif arg.startswith("--interval="):
            value = arg.split("=", 1)[1]
        else:
            raise UsageError(f"orch watch takes only --interval SECONDS, not {arg!r}")
    every = interval(value)
    from orchestrator.instances.lifecycle import Orch

    def say(msg: str) -> None:
        print(f"{datetime.now().astimezone().isoformat(timespec='seconds')} {msg}", flush=True)

    orch = Orch.open(actor="watcher", say=say)
    say(f"watcher {os.getpid()}: looking at the jobs of {orch.home} every {every:g} s")
    say(f"watcher {os.getpid()}: exits: {watch(orch, every, say)}")
