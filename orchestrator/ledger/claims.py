"""Which orch process is working on an instance right now.

A claim is a lock that dies with its process: ``flock`` on a file beside a SQLite ledger, a
session advisory lock on a PostgreSQL one (released by the server when the connection drops,
whichever machine held it). So a crashed ``orch up`` never leaves its instance "busy" forever,
and a live one is never mistaken for a crash. ``orch up``, ``stop``, ``start`` and ``down`` hold
the claim on the instance's name; ``reconcile`` and ``Orch.sync`` leave a claimed instance alone;
a second process that wants it is refused with ``Busy``. Claims are re-entrant within a process.
"""

from __future__ import annotations

import functools
import hashlib
import os
from contextlib import contextmanager
from typing import Iterator

from orchestrator.errors import Busy, IllegalTransition


# (ledger url, key) -> [lock, depth]: what this process holds.
_held: dict[tuple[str, str], list] = {}


def _key(name: str) -> str:
    return f"instance:{name}"


class _FileLock:
    def __init__(self, directory, key: str):
        self.directory = directory
        self.path = directory / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")
        self.fd: int | None = None

    def acquire(self) -> bool:
        import fcntl

        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def taken(self) -> bool:
        """Whether another holds it, changing nothing: a file nobody made is nobody's lock (a
        holder makes it before locking it), and a look writes no pid (``busy`` asks this of every
        instance in a reaper pass)."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing drops the flock
        return False

    def holder(self) -> str:
        try:
            pid = self.path.read_text().strip()
        except OSError:
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""


class _AdvisoryLock:
    """A PostgreSQL session lock on a connection kept checked out while it is held."""

    def __init__(self, engine, key: str):
        self.engine = engine
        self.id = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        self.conn = None

    def acquire(self) -> bool:
        from sqlalchemy import text

        conn = self.engine.connect()
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.id}).scalar()
        conn.commit()  # a session lock outlives the transaction; an idle one holds no snapshot
        if not got:
            conn.close()
            return False
        self.conn = conn
        return True

    def release(self) -> None:
        from sqlalchemy import text

        if self.conn is not None:
            try:
                self.conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.id})
                self.conn.commit()
            finally:
                self.conn.close()
                self.conn = None

    def taken(self) -> bool:
        """Whether another session holds it, changing nothing: read from ``pg_locks``, where a bigint
        advisory key shows its high half in ``classid``, its low half in ``objid`` and ``objsubid``
        1 (PostgreSQL's documentation, "pg_locks"). Trying the lock and letting it go, as a look
        did, held it for a round trip: an ``orch down`` arriving then was refused as busy."""
        from sqlalchemy import text

        key = self.id & 0xFFFFFFFFFFFFFFFF
        with self.engine.connect() as conn:
            return bool(conn.execute(text(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND classid = :hi AND objid = :lo AND pid <> pg_backend_pid() "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"),
                {"hi": key >> 32, "lo": key & 0xFFFFFFFF}).scalar())

    def holder(self) -> str:
        return ""


class _NoLock:
    """An in-memory ledger is one process's own: nothing to exclude."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def taken(self) -> bool:
        return False

    def holder(self) -> str:
        return ""


def _lock(ledger, key: str):
    if ledger.sqlite:
        return _FileLock(ledger.path.parent / "locks", key) if ledger.path is not None else _NoLock()
    if ledger.engine.dialect.name == "postgresql":
        return _AdvisoryLock(ledger.engine, key)
    return _NoLock()


@contextmanager
def try_hold(ledger, name: str) -> Iterator[bool]:
    """Hold the claim on ``name`` if nobody else does; yields whether it is held."""
    slot = (ledger.url, _key(name))
    if slot in _held:
        _held[slot][1] += 1
        try:
            yield True
        finally:
            _held[slot][1] -= 1
        return
    lock = _lock(ledger, _key(name))
    if not lock.acquire():
        yield False
        return
    _held[slot] = [lock, 1]
    try:
        yield True
    finally:
        _held.pop(slot)
        lock.release()


# A look at a file claim (``busy``) holds its flock for the microseconds between two system calls:
# a claimant that meets one tries again for this long before it says busy.
LOOK_GRACE_S = 1.0


@contextmanager
def hold(ledger, name: str, wait: float = 0.0) -> Iterator[None]:
    """Hold the claim on ``name``, waiting up to ``wait`` seconds (``LOOK_GRACE_S`` at least) for
    another process to let go of it; ``Busy`` when it does not."""
    import time

    deadline = time.monotonic() + max(wait, LOOK_GRACE_S)
    while True:
        with try_hold(ledger, name) as got:
            if got:
                yield
                return
        if time.monotonic() >= deadline:
            raise Busy(f"{name} is busy: another orch process{_lock(ledger, _key(name)).holder()} is "
                       "working on it; try again when it is done")
        time.sleep(0.2)


def busy(ledger, name: str) -> bool:
    """Whether another process holds the claim on ``name`` right now."""
    if (ledger.url, _key(name)) in _held:
        return False
    return _lock(ledger, _key(name)).taken()


def exclusive(method):
    """For an ``Orch`` method whose first argument is an instance name or an instance row: hold
    that instance's claim for the call, and act on the row as it is now, not as the caller saw it."""

    @functools.wraps(method)
    def wrapper(orch, target, *args, **kwargs):
        name = target if isinstance(target, str) else target.name
        with hold(orch.ledger, name):
            if not isinstance(target, str):
                now = orch.ledger.get(target.id)
                if now.state != target.state:
                    raise IllegalTransition(f"{name} is {now.state} now, no longer {target.state}: another "
                                            "orch process changed it first")
                target = now
            return method(orch, target, *args, **kwargs)

    return wrapper
