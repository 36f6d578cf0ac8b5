"""Secrets handed to a job's first launch by its submission (``Submission.secrets``: a schedule's
run gets the values stored for that schedule, never this process's environment): held here, by
the job's name, only while ``submit`` starts that attempt; the command kind reads them there
(``kinds.command.secret_source``). Never stored, never sent anywhere but to that launch. Its own
module, importing nothing: the kinds read it, and ``submit`` (which imports the engine and so the
kinds) fills it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

_HANDED: dict[str, dict[str, str]] = {}


@contextmanager
def handing(name: str, values: dict[str, str]) -> Iterator[None]:
    """``values`` handed to job ``name``'s launch while the block runs."""
    _HANDED[name] = dict(values)
    try:
        yield
    finally:
        _HANDED.pop(name, None)


def handed(job) -> dict[str, str] | None:
    """The secrets handed to ``job``'s launch by its submission, if any."""
    return _HANDED.get(job.name) if job is not None else None
