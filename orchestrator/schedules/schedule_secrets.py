"""A schedule's secrets, kept at home for its own runs alone.

``orch schedule add`` stores the values of the task's secrets, from the shell that adds it, in
``$ORCH_HOME/schedule-secrets/NAME.json`` (0600, in a 0700 folder); each run of that schedule
(and each relaunch of one) reads them there and nowhere else: never the reaper's own environment
(``reaper.env``: the provider keys it rents with), never another schedule's file, never the ledger
(a schedule's row names its secrets; whoever can write a shared ledger must not be able to name a
value this machine holds). JSON keeps a value whole whatever it holds (a PEM key, a service
account's JSON over many lines).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

FOLDER = "schedule-secrets"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # a schedule's name as `orch schedule add` checks it


def path(home: Path, name: str) -> Path | None:
    """The file of schedule ``name``; None for a name no schedule can have (a ledger row is input)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    return Path(home) / FOLDER / f"{name}.json"


def read(home: Path, name: str) -> tuple[dict[str, str], str | None]:
    """(the values stored for schedule ``name``, a problem with its file): none stored is ({}, None);
    a file others can read, or one orch did not write, is not read."""
    where = path(home, name)
    if where is None or not where.is_file():
        return {}, None
    if where.stat().st_mode & 0o077:
        return {}, f"{where} is readable by others (chmod 600 it): not read"
    try:
        values = json.loads(where.read_text())
    except (OSError, ValueError, RecursionError) as e:
        return {}, f"{where} cannot be read ({type(e).__name__})"
    if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        return {}, f"{where} is not a mapping of names to values"
    return values, None


def write(home: Path, name: str, values: dict[str, str]) -> Path | None:
    """``values`` as schedule ``name``'s secrets (the file replaced whole, 0600); none: the file removed."""
    where = path(home, name)
    if where is None:
        raise ValueError(f"no schedule is named {name!r}")
    if not values:
        where.unlink(missing_ok=True)
        return None
    where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(where.parent, 0o700)
    tmp = where.with_name(f".{where.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(values, f, sort_keys=True)
    os.replace(tmp, where)
    return where


def of_jobs(ledger, home: Path, job_ids) -> dict[str, str] | None:
    """The secrets stored for the schedule whose run is one of ``job_ids`` (a job, or the jobs an
    instance served); None where none is a schedule's run."""
    from orchestrator.schedules import ledger_schedules

    name = next(iter(ledger_schedules.of_jobs(ledger, list(job_ids)).values()), None)
    return read(home, name)[0] if name else None


def remove(home: Path, name: str) -> None:
    where = path(home, name)
    if where is not None:
        where.unlink(missing_ok=True)
