"""Notifications: what happened to a machine while nobody watched, posted to a webhook.

config.toml::

    [notify]
    webhook_url = "https://hooks.slack.com/services/..."   # any endpoint taking Slack's {"text": ...}
    events = ["preempted", "watchdog", "reaper", "lost", "broken", "job", "schedule"]   # optional: the default is all

What each event is, from a ledger transition (``instance_event``, registered by ``plugins``):
``preempted`` (a spot market took it), ``watchdog`` (its own watchdog stopped or destroyed it),
``reaper`` (the reaper stopped or destroyed it), ``lost`` (gone without orch destroying it),
``broken`` (its container exited or its host dropped); ``job`` (a job finished or failed) comes
from ``job_ended``, which the job runner calls; ``schedule`` (a scheduled run skipped, and why)
from ``scheduling``; ``volume`` (a volume unattached past ``volume_idle_days``, still billing) from
``volumes.idle``, the reaper's look; ``budget`` (80 % of a ``[budget]`` period spent, or all of it
and the jobs stopped) from ``jobs.budget``, the watcher's and the reaper's look.

The URL is a secret (whoever has it posts to the channel): it is never printed, logged, put in an
error or written to the ledger. Each post runs in a thread with a short timeout, so a slow webhook
never holds a command up; at exit orch waits for posts still in flight at most ``TIMEOUT_S``. A
failed post is one line on stderr, never the command's failure.
"""

from __future__ import annotations

import json
import sys
import threading
from urllib.parse import urlsplit

from orchestrator import config, states
from orchestrator.hookspecs import hookimpl
from orchestrator.text import clean

EVENTS = config.NOTIFY_EVENTS
TIMEOUT_S = 5.0
_threads: list[threading.Thread] = []
_lock = threading.Lock()
_drain_registered = False


def kind_of(instance, event: dict) -> str | None:
    """Which notification a transition is, or None for one nobody needs to hear about."""
    to, actor = event.get("to"), event.get("actor")
    if event.get("from") == to:
        return None  # a note, not a change
    if to == states.PREEMPTED:
        return "preempted"
    if to in (states.STOPPED, states.DESTROYED) and actor in ("watchdog", "reaper"):
        return actor
    if to in (states.LOST, states.BROKEN):
        return to
    return None


_SAYS = {"preempted": "was preempted", "lost": "is lost", "broken": "is broken"}


def message(kind: str, instance, event: dict) -> str:
    what = _SAYS.get(kind) or f"was {event.get('to')} by the {kind}"
    price = f" (${instance.price_hr:.3f}/hr)" if getattr(instance, "price_hr", None) else ""
    reason = clean(event.get("reason"), 300) or ""
    return f"orch: {instance.name} on {instance.provider}{price} {what}" + (f": {reason}" if reason else "")


def settings() -> tuple[str | None, frozenset[str]]:
    section = config.get("notify", {}) or {}
    return section.get("webhook_url"), frozenset(section.get("events", EVENTS))


@hookimpl
def instance_event(instance, event):
    try:
        url, wanted = settings()
        kind = kind_of(instance, event)
        if url and kind in wanted:
            post(url, message(kind, instance, event))
    except Exception as e:  # noqa: BLE001 - a notification never breaks the command that caused it
        _warn(f"{type(e).__name__}")


def job_ended(name: str, state: str, detail: str = "") -> None:
    """For the job runner, once a job reaches its end (completed, failed or cancelled)."""
    try:
        url, wanted = settings()
        if url and "job" in wanted:
            text = f"orch: job {clean(name, 64)} {clean(state, 16)}"
            post(url, text + (f": {clean(detail, 300)}" if detail else ""))
    except Exception as e:  # noqa: BLE001
        _warn(f"{type(e).__name__}")


def event(kind: str, text: str) -> None:
    """``text`` posted as event ``kind`` where the webhook is set and wants it; never raises."""
    try:
        url, wanted = settings()
        if url and kind in wanted:
            post(url, text)
    except Exception as e:  # noqa: BLE001 - a notification never breaks what caused it
        _warn(f"{type(e).__name__}")


def post(url: str, text: str) -> threading.Thread:
    """Post ``{"text": text}`` in the background; returns the thread (tests join it)."""
    global _drain_registered
    thread = threading.Thread(target=_send, args=(url, _slack_escape(text)), name="orch-notify", daemon=True)
    with _lock:
        _threads.append(thread)
        if not _drain_registered:
            import atexit

            atexit.register(drain)
            _drain_registered = True
    thread.start()
    return thread


def drain(timeout: float = TIMEOUT_S) -> None:
    """Wait for posts still in flight, ``timeout`` seconds at most in all (at exit). A webhook that
    never answers would otherwise lose them in silence as the process ends: said once, for all."""
    import time

    deadline = time.monotonic() + timeout
    with _lock:
        pending = list(_threads)
    for thread in pending:
        thread.join(max(deadline - time.monotonic(), 0))
    with _lock:
        unanswered = sum(1 for t in _threads if t.is_alive())
        _threads.clear()  # their own timeout, if it ever comes, says nothing more
    if unanswered:
        _warn(f"{unanswered} post(s) unanswered after {timeout:g} s, dropped")


def _slack_escape(text: str) -> str:
    """Slack reads <...> as links and mentions (<!channel>): text from a provider or an instance
    must not ping a channel. Its own escapes, the three it documents."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _send(url: str, text: str) -> None:
    import urllib.error
    import urllib.request

    body = json.dumps({"text": text}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "orch"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read(4096)
    except urllib.error.HTTPError as e:
        _say(f"HTTP {e.code}")
    except urllib.error.URLError as e:
        _say(_scrub(str(e.reason), url))
    except (OSError, ValueError) as e:  # a timeout, a reset, a URL urllib cannot use
        _say(_scrub(str(e) or type(e).__name__, url))
    finally:
        with _lock:
            if threading.current_thread() in _threads:
                _threads.remove(threading.current_thread())


def _scrub(text: str, url: str) -> str:
    """An error's text without the URL or any part of its path or query (where the secret is)."""
    parts = urlsplit(url)
    for secret in sorted({url, parts.path, parts.query, *parts.path.split("/")} - {"", "/"}, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "…")
    return clean(text, 200) or "failed"


def _say(why: str) -> None:
    """A post's own failure, unless ``drain`` has already given up on it (and said so)."""
    with _lock:
        mine = threading.current_thread() in _threads
    if mine:
        _warn(why)


def _warn(why: str) -> None:
    print(f"orch: warning: a notification to the webhook in config.toml was not delivered ({why})",
          file=sys.stderr, flush=True)
