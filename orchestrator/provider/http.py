"""One verdict on a provider's HTTP answer, and one way to retry the calls that are safe to repeat.

Every provider keeps its own words for an error; whether it is worth another try is decided
here, the same everywhere: 401/403 are the key's fault (never retried), 429 and 5xx are worth
another try after the server's ``Retry-After`` (RFC 9110 §10.2.3: seconds or an HTTP date) when
it asks for no more than ``cap``, else after an exponential backoff with jitter; a 429 that asks
for longer than ``cap`` (a daily quota) is given up at once, and anything else is a refusal.
Retries go through tenacity, bounded in attempts.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Callable, TypeVar

from orchestrator.errors import ProviderError

T = TypeVar("T")

AUTH, RETRY, LATER, FAIL = "auth", "retry", "later", "fail"


class Transient(ProviderError):
    """A failure worth another try for a call that is safe to repeat (429, 5xx, a dropped
    connection): ``wait`` seconds first, or the backoff schedule when it is negative."""

    def __init__(self, message: str, wait: float = -1.0, code: str | None = None, status: int | None = None,
                 answer: dict | None = None):
        super().__init__(message)
        self.wait, self.code, self.status, self.answer = wait, code, status, answer or {}


@dataclass(frozen=True)
class Verdict:
    action: str  # AUTH, RETRY, LATER (a 429 asking for longer than the cap) or FAIL
    wait: float = -1.0  # for RETRY: the server's Retry-After in seconds, or -1 for the backoff


def retry_after(value) -> float:
    """Seconds from a Retry-After value (delay-seconds or an HTTP date); -1 when absent or unreadable."""
    if value is None:
        return -1.0
    text = str(value).strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return -1.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max((when - datetime.now(timezone.utc)).total_seconds(), 0.0)


def verdict(status: int, retry_after_header=None, cap: float = 60.0) -> Verdict:
    if status in (401, 403):
        return Verdict(AUTH)
    if status == 429:
        wait = retry_after(retry_after_header)
        return Verdict(LATER, wait) if wait > cap else Verdict(RETRY, wait)
    if status >= 500:
        return Verdict(RETRY)
    return Verdict(FAIL)


def backoff(failures: int, base: float = 0.5, cap: float = 20.0) -> float:
    """The wait after the ``failures``-th failure in a row: doubling from ``base``, a quarter of
    jitter (concurrent callers do not retry in step), at most ``cap``."""
    return min(base * 2 ** (max(failures, 1) - 1) * (1 + random.random() / 4), cap)


def call(fn: Callable[[], T], *, attempts: int = 5, base: float = 0.5, cap: float = 20.0,
         retryable: Callable[[BaseException], bool] = lambda e: isinstance(e, Transient),
         sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, tried up to ``attempts`` times while it raises what ``retryable`` accepts (a
    ``Transient``); each wait is the error's own (a Retry-After, at most ``cap``) or the backoff.
    The last error is raised as it is."""
    import tenacity

    def wait(state: tenacity.RetryCallState) -> float:
        asked = getattr(state.outcome.exception(), "wait", -1.0)
        return min(asked, cap) if asked >= 0 else backoff(state.attempt_number, base, cap)

    return tenacity.Retrying(stop=tenacity.stop_after_attempt(max(attempts, 1)), wait=wait, sleep=sleep,
                             retry=tenacity.retry_if_exception(retryable), reraise=True)(fn)
