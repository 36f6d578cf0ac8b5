"""Many slow, independent things at once, a bounded number at a time (the reaper's looks over SSH,
its provider asks by id): a pass over a hundred instances is not a hundred round trips in a row,
and a hung host holds one worker for its own timeout, not the pass.

Plain threads pulling from one shared queue, not an executor: no future per item, so a fleet of
10,000 pays microseconds for it, and nothing outlives the call.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Callable, Sequence

DEFAULT_BOUND = 8  # `reaper_parallel` in config.toml, `orch reap --parallel`
MAX_BOUND = 256


def each(fn: Callable[[Any], Any], items: Sequence, bound: int) -> list[tuple[Any, BaseException | None]]:
    """``fn(item)`` for every item, at most ``bound`` at a time; in the items' order, ``(result,
    None)`` or ``(None, the exception)``: one item's failure is its own, whatever it raised (a
    thread cannot raise to its caller: the caller judges what comes back).

    Ctrl-C is the caller's, never an item's: it reaches the calling thread only (where a signal's
    handler runs), and is raised there, whether the items run on it (one at a time) or on workers
    it waits for. Handed back as one item's failure, it ended that item alone: `orch reap --watch`
    looking at a single instance went on to its next pass, and Ctrl-C did nothing."""
    results: list[tuple[Any, BaseException | None]] = [(None, None)] * len(items)

    def call(k: int) -> None:
        try:
            results[k] = (fn(items[k]), None)
        except BaseException as e:  # noqa: BLE001 - handed back with its item
            if isinstance(e, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
                raise
            results[k] = (None, e)

    if bound <= 1 or len(items) <= 1:
        for k in range(len(items)):
            call(k)
        return results
    queue = iter(range(len(items)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                k = next(queue, None)
            if k is None:
                return
            call(k)

    # Each worker in a copy of the caller's context: what it holds for the job at hand (the values
    # ``task.hiding`` hides) holds on the workers too.
    workers = [threading.Thread(target=contextvars.copy_context().run, args=(worker,), name=f"orch-parallel-{n}",
                                daemon=True) for n in range(min(bound, len(items)))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl-C held back for the block (a loop that starts threads it will wait for), then raised as
    it would have been. A Ctrl-C between two ``Thread.start`` calls left a thread that never began,
    and a caller that waited ten minutes for it: `orch up --nodes 2` interrupted while its nodes' bring-
    ups started (1 in 16 tries on a loaded machine). Signals' handlers run on the main thread only;
    anywhere else the block runs as it is. It yields the Ctrl-Cs held so far (a list, empty until
    one comes): work the block waits for can look at it and call itself off (``jobs.group.replace``)."""
    import signal

    seen: list = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    before = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(frame))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, before)
        if seen and callable(before):
            before(signal.SIGINT, seen[0])  # the handler it was meant for (orch's CLI remembers Ctrl-C)
        elif seen and before == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


# A Ctrl-C Python dropped: a KeyboardInterrupt raised while a finalizer or a weakref callback runs
# (a garbage collection freeing SQLAlchemy's object states mid-poll, say) cannot propagate: Python
# prints "Exception ignored in ..." and goes on (the docs of sys.unraisablehook). `orch run --wait`
# then waited on after the keypress. The CLI keeps such Ctrl-Cs (``keep_dropped_ctrl_c``) and every
# waiting loop sleeps through ``nap``, which raises the one dropped since.
_dropped: list = []


def keep_dropped_ctrl_c() -> None:
    """From now on a KeyboardInterrupt Python could not raise is kept for the next ``nap`` (said
    nowhere: it is not lost); any other unraisable goes to the hook that was there. Once per process."""
    import sys

    before = sys.unraisablehook
    if getattr(before, "keeps_ctrl_c", False):
        return

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _dropped.append(unraisable.exc_type)
        else:
            before(unraisable)

    hook.keeps_ctrl_c = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def nap(seconds: float) -> None:
    """``time.sleep`` for a loop that waits on something, raising a Ctrl-C Python dropped since."""
    import time

    _raise_dropped()
    time.sleep(seconds)
    _raise_dropped()


def _raise_dropped() -> None:
    if _dropped:
        _dropped.clear()
        raise KeyboardInterrupt


def bound(flag: int | None = None) -> int:
    """How many at a time: the flag, else ``reaper_parallel`` in config.toml, else 8."""
    from orchestrator import config

    return int(flag if flag is not None else config.get("reaper_parallel", DEFAULT_BOUND))
