"""What a job keeps beside the engine (``jobs``): its folders at home, its history lines and its
phase timings in the ledger, the ledger's JSON columns read defensively. The engine, the job's
resume copies (``resume_copy``) and what ``orch jobs`` shows (``job_views``) all write and read
through these, so each has one definition.

Folders: ``$ORCH_HOME/runs/NAME`` (the job's weights: every attempt pulls there), and
``$ORCH_HOME/jobs/NAME/ckpt-E`` (the resume copy of epoch E, or copy E of a command's checkpoint
folder).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

HISTORY = 50  # history lines a job keeps


def now() -> datetime:
    return datetime.now(timezone.utc)


def utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def loads(text: str | None, default):
    try:
        value = json.loads(text) if text else default
    except (ValueError, RecursionError):
        return default
    return value if isinstance(value, type(default)) else default


def note(orch, job, text: str, say: bool = True):
    """One line of the job's history (the last HISTORY are kept), said to whoever is watching."""
    history = loads(job.history, [])
    history = (history + [{"at": now().isoformat(timespec="seconds"), "text": text}])[-HISTORY:]
    if say:
        orch.say(f"job {job.name}: {text}")
    return orch.ledger.update_job(job.id, history=json.dumps(history))


def add_phase(phases: dict, key: str, seconds: float | None) -> dict:
    if seconds is not None and seconds >= 0:
        phases[key] = round(phases.get(key, 0.0) + seconds, 3)
    return phases


def job_phase(orch, job, key: str, seconds: float | None):
    return orch.ledger.update_job(job.id, phases=json.dumps(add_phase(loads(job.phases, {}), key, seconds)))


def attempt_phase(orch, attempt, key: str, seconds: float | None):
    return orch.ledger.update_attempt(attempt.id, phases=json.dumps(add_phase(loads(attempt.phases, {}), key,
                                                                                seconds)))


def weights_dir(home: Path, name: str) -> Path:
    return Path(home) / "runs" / name


def job_dir(home: Path, name: str) -> Path:
    return Path(home) / "jobs" / name


def checkpoint_dir(home: Path, name: str, epoch: int) -> Path:
    return job_dir(home, name) / f"ckpt-{epoch}"
