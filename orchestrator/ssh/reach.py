"""Reaching an instance over SSH: wait until one of its routes answers, bounded, and find the
route that answers now (``lifecycle`` waits after a create or a start, and reroutes a connection
whose recorded route went quiet; ``reconcile`` records the route of what it adopts)."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from typing import Callable

from orchestrator.errors import SSHError
from orchestrator.provider import Endpoint, Progress, Remote, Status
from orchestrator import parallel as par

# How often a wait asks the provider at most, however short its own polling setting is.
MIN_INTERVAL = 0.05


def tcp_open(endpoint: Endpoint, timeout: float | None = None) -> bool:
    """Whether an SSH server answers there: its banner, not just an open port."""
    timeout = endpoint.grace if timeout is None else timeout
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH")
    except OSError:
        return False


def reachable(remote: Remote, progress: Progress | None = None) -> Remote | None:
    """The instance with ``endpoint`` set to a route that answers now, else None: its routes are
    tried in the provider's order, each for its own grace (Vast.ai: a direct port, then its proxy)."""
    if remote.status != Status.RUNNING:
        return None
    for i, route in enumerate(remote.routes):
        if tcp_open(route):
            if i and progress and route.fallback_note:
                progress(route.fallback_note)
            return replace(remote, endpoint=route)
    return None


def wait_ssh(provider, provider_id: str, timeout: float, progress: Progress | None = None,
             interval: float = 2.0, halted: Callable[[], str | None] | None = None) -> Remote:
    """Poll until the instance runs and one of its routes answers SSH, within ``timeout`` seconds.
    An instance that can no longer get there (gone, broken, stopped, or one its provider says
    will never answer) fails at once, and so does a wait that ``halted`` calls off (says why)."""
    interval = max(min(interval, provider.poll_seconds), MIN_INTERVAL)
    t0 = time.monotonic()
    last = None
    while True:
        remote = provider.get(provider_id)
        if remote.status in (Status.GONE, Status.BROKEN, Status.STOPPED):
            what = f"{remote.status.value}" + (f" ({remote.detail})" if remote.detail else "")
            raise SSHError(f"{provider.name} instance {provider_id} is {what} while waiting for SSH")
        never = provider.never_answers(remote, time.monotonic() - t0)
        if never:
            raise SSHError(never)
        answering = reachable(remote, progress)
        if answering is not None:
            return answering
        note = f"waiting for SSH ({remote.detail or remote.status.value})"
        if progress and note != last:
            progress(note)
            last = note
        if time.monotonic() - t0 >= timeout:
            raise SSHError(f"SSH on {provider.name} instance {provider_id} did not answer within {timeout:.0f} s")
        slept = time.monotonic() + interval
        while time.monotonic() < slept:
            why = halted() if halted else None
            if why:
                raise SSHError(why)
            par.nap(min(0.1, interval))
