"""Bounded retries with exponential backoff, shared by every provider."""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def retry(fn: Callable[[], T], delay_for: Callable[[BaseException], float | None], *,
          attempts: int = 5, base: float = 0.5, cap: float = 20.0, sleep=time.sleep) -> T:
    """Call ``fn``; when it raises, ``delay_for(exc)`` says how long to wait (None: give up now).

    A negative delay means "use the backoff schedule"; a positive one (a Retry-After) is
    honoured up to ``cap``. After ``attempts`` calls the last error is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - delay_for decides what is retryable
            wait = delay_for(exc)
            if wait is None or attempt == attempts:
                raise
            if wait < 0:
                wait = base * 2 ** (attempt - 1) * (1 + random.random() / 4)
            sleep(min(wait, cap))
    raise AssertionError("unreachable")
