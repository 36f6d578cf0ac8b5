"""What a job keeps beside the engine (``jobs``): its folders at home, its history lines and its
phase timings in the ledger, the ledger's JSON columns read defensively. The engine, the job's
resume copies (``resume_copy``) and what ``orch jobs`` shows (``job_views``) all write and read
through these, so each has one definition.

Folders: ``$ORCH_HOME/runs/NAME`` (the job's weights: every attempt pulls there), and
``$ORCH_HOME/jobs/NAME/ckpt-E`` (the resume copy of epoch E, or copy E of a command's checkpoint
folder). A job's name reaches a path only through these, each checking it as a new name is
checked: a name from a ledger someone else can write never leads out of ``$ORCH_HOME``.

Text from an instance that got a job's secrets (its log's lines, its errors) is stored and said
only through ``scrub`` (``text.redact`` with the values this process holds): history lines here,
the job's reason in ``engine.finish_job``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.text import row_json

HISTORY = 50  # history lines a job keeps
MAX_NAME = 36  # an attempt's instance is NAME-aK: 40 characters at most


def check_job_name(name: str) -> None:
    """A job's name, new or read back from the ledger: an instance's name (lowercase letters, digits
    and '-') short enough for its attempts' names."""
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    if len(name) > MAX_NAME:
        raise UsageError(f"a job name has at most {MAX_NAME} characters (its instances are NAME-a1, NAME-a2, ...), "
                         f"not {len(name)}")


def now() -> datetime:
    return datetime.now(timezone.utc)


def utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def names_in(part) -> list[str]:
    """The secret names a kind's stored part keeps under ``secrets`` (``JobKind.secrets``)."""
    names = part.get("secrets") if isinstance(part, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def secret_names(job) -> list[str]:
    """The names of the secrets the job's work gets (a training gets none), from its stored spec
    read as it is, unchecked (a refused spec's lines are hidden too): its kind's part is a mapping
    beside the request (``JobSpec.to_json``); every such mapping's names count, so a row with more
    of them hides more, never less."""
    stored = row_json(job.spec, {}) if job is not None else {}
    names = [n for key, part in stored.items() if key != "request" for n in names_in(part)]
    return list(dict.fromkeys(names))


def hiding(orch, job):
    """A block in which the job's text is hidden with the secrets stored for its schedule too, where
    it is a schedule's run (``task.hiding``): its own schedule's alone, never another's. This
    process's environment lacks them (a reaper pass, the watcher, `orch jobs show`)."""
    from orchestrator.schedules import schedule_secrets
    from orchestrator.tasks import task

    stored = schedule_secrets.of_jobs(orch.ledger, orch.home, [job.id]) if secret_names(job) else None
    return task.hiding(stored or {})


def scrub(job, text: str | None) -> str | None:
    """``text`` with every secret of the job that this process holds hidden (``text.redact``)."""
    from orchestrator.tasks.task import held_secrets
    from orchestrator.text import redact

    return redact(text, held_secrets(secret_names(job))[0])


def tail_lines(text: str, secrets: list[str], lines: int = 10) -> str:
    """The last lines of a log from an instance, printable, for a failure's reason, every secret in
    ``secrets`` (names) hidden. Where this process does not hold one of them (a scheduled reaper
    runs without the user's environment), no line is kept: one could show it."""
    from orchestrator.tasks.task import held_secrets
    from orchestrator.text import clean, redact

    values, missing = held_secrets(secrets)
    if missing:
        return f"(left out: this orch process does not hold {', '.join(missing)}, which they may show)"
    text = redact(str(text), values)
    kept = [redact(clean(line, 300), values) or "" for line in text.splitlines()
            if line.strip() and not line.startswith("[orch] ")]
    return " | ".join(kept[-lines:])


def node_log(dest: Path, rank: int) -> Path:
    """Where node ``rank``'s log lands at home (the head's is ``train.log``, as on one machine)."""
    return Path(dest) / ("train.log" if rank == 0 else f"train.node{rank}.log")


def log_tail(path: Path, secrets: list[str], lines: int = 10) -> str:
    """``tail_lines`` of a pulled log's last 64 KB."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(size - (64 << 10), 0))
            data = f.read().decode(errors="replace")
    except OSError:  # none came home: '' (or, where a secret is not held, why none did)
        return tail_lines("", secrets, lines)
    if size > 64 << 10:
        data = data.partition("\n")[2]  # the first line is cut: a secret's tail could be all there is of it
    return tail_lines(data, secrets, lines)


def note(orch, job, text: str, say: bool = True, once: str | None = None):
    """One line of the job's history (the last HISTORY are kept), said to whoever is watching; a
    secret of the job in it is hidden first (``scrub``). ``once``: ``note_once``'s mark."""
    from orchestrator.text import clean

    text = scrub(job, text)
    history = row_json(job.history, [])
    entry = {"at": now().isoformat(timespec="seconds"), "text": text}
    if once:
        entry["once"] = once
    history = (history + [entry])[-HISTORY:]
    if say:
        orch.say(f"job {clean(job.name, 64)}: {text}")
    return orch.ledger.update_job(job.id, history=json.dumps(history))


def note_once(orch, job, text: str, scope: str, say: bool = True):
    """``note``, unless the same line was already noted in ``scope`` (an attempt's instance name):
    a look every few seconds must not repeat "not found yet" until the history holds nothing else."""
    import hashlib

    job = orch.ledger.get_job(job.id)  # the history as it is now: a line noted since is kept
    mark = hashlib.sha256(f"{scope}\n{scrub(job, text)}".encode()).hexdigest()[:16]
    if any(isinstance(h, dict) and h.get("once") == mark for h in row_json(job.history, [])):
        return job
    return note(orch, job, text, say=say, once=mark)


def add_phase(phases: dict, key: str, seconds: float | None) -> dict:
    if seconds is not None and seconds >= 0:
        phases[key] = round(phases.get(key, 0.0) + seconds, 3)
    return phases


def job_phase(orch, job, key: str, seconds: float | None):
    return orch.ledger.update_job(job.id, phases=json.dumps(add_phase(row_json(job.phases, {}), key, seconds)))


def attempt_phase(orch, attempt, key: str, seconds: float | None):
    return orch.ledger.update_attempt(attempt.id, phases=json.dumps(add_phase(row_json(attempt.phases, {}), key,
                                                                                seconds)))


def weights_dir(home: Path, name: str) -> Path:
    check_job_name(name)
    return Path(home) / "runs" / name


def job_dir(home: Path, name: str) -> Path:
    check_job_name(name)
    return Path(home) / "jobs" / name


ALLOWED = "allowed-secrets.json"  # in jobs/NAME: orch's own credentials a person handed to that job


def allow_secrets(home: Path, job, names) -> None:
    """Record at home (never in the ledger, which others may write) that ``names``, orch's own
    credentials, were handed to ``job`` on the command line (``--allow-secret``): its relaunches
    may read them. Bound to the job's id: a later job of that name, or a row naming it, has none."""
    import os

    names = sorted(set(names))
    if not names:
        return
    path = job_dir(home, job.name) / ALLOWED
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{ALLOWED}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"job": job.id, "secrets": names}, f)
    os.replace(tmp, path)


def allowed_secrets(home: Path, job) -> frozenset:
    """The credentials handed to ``job`` on the command line (``allow_secrets``); none by default."""
    try:
        found = json.loads((job_dir(home, job.name) / ALLOWED).read_text())
    except (OSError, ValueError, RecursionError, UsageError):
        return frozenset()
    if not isinstance(found, dict) or found.get("job") != job.id or not isinstance(found.get("secrets"), list):
        return frozenset()
    return frozenset(n for n in found["secrets"] if isinstance(n, str))


def files_of(home: Path, name: str) -> list[Path]:
    """The job's folders at home that hold something (its weights, its checkpoint copies)."""
    return [d for d in (weights_dir(home, name), job_dir(home, name)) if d.is_dir() and any(d.iterdir())]


def refuse_taken(home: Path, name: str, dry_run: bool, replace: bool, say) -> None:
    """A new job's name whose files are at home: refused (a run of it would pull over them), except
    with ``--replace`` (``forget`` clears them once the plan holds); a dry run says it and goes on
    (nothing is pulled)."""
    held = files_of(home, name) if not replace else []
    if not held:
        return
    why = (f"{held[0]} already holds job {name}'s files: `orch run ... --replace` replaces that job, "
           f"`orch jobs rm {name}` removes it, or name the job otherwise")
    if not dry_run:
        raise UsageError(why)
    say(f"warning: the launch would be refused: {why}")


def forget(orch, name: str, ended) -> tuple[list, list[Path]]:
    """Every ended job named ``name`` gone: its rows, then its folders at home (refused while one is
    still active); (the rows, the folders removed)."""
    import shutil

    check_job_name(name)
    rows = orch.ledger.remove_jobs(name, ended)
    held = files_of(orch.home, name)
    for d in held:
        shutil.rmtree(d)
    # Its attempts' links (runs/NAME-aK -> NAME, made at launch) would dangle, and show in runs/.
    for link in weights_dir(orch.home, name).parent.glob(f"{name}-a*"):
        if link.is_symlink() and os.readlink(link) == name:
            link.unlink()
    return rows, held


def checkpoint_dir(home: Path, name: str, epoch: int) -> Path:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise UsageError(f"a checkpoint copy is numbered, not {epoch!r}")
    return job_dir(home, name) / f"ckpt-{epoch}"


def copies(home: Path, name: str) -> list[int]:
    """The numbers of the job's checkpoint copies at home (jobs/NAME/ckpt-K), oldest first."""
    found = []
    for d in job_dir(home, name).glob("ckpt-*"):
        number = d.name[len("ckpt-"):]
        if number.isdigit() and d.is_dir():
            found.append(int(number))
    return sorted(found)
