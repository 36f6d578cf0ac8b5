"""``orch`` for the tests, forked from a process that has imported it once.

Every ``run_orch`` is still a process of its own: its own pid, argv, environment, working folder,
stdin/stdout/stderr, exit code and signals, and everything it starts is its own. What it does not
repeat is the import of orch and of what orch imports (SQLAlchemy's ORM, Typer, Fabric): 0.3-0.5 s
of CPU in each of the suite's ~1,000 orch processes, a fifth of the whole suite's CPU on a 2-core
machine. A server process per test process (``python -m tests.zygote SOCKET``) imports those
modules, nothing else (no SDK that reads its settings from the environment at import: those
import in the child, as in any orch process), and forks one child per command it is sent; the
child runs ``python -m orchestrator`` as the interpreter would, then exits with its code. The
server relays each child's exit status, since only a parent can wait for a process.

On by default; ``ORCH_TEST_FORK=0`` turns it off, and every ``orch`` is then a fresh interpreter
(``subprocess``), as the tests that send Ctrl-C start theirs in any case. With it on, the suite
took 828 s instead of about 950 s on this 2-core machine.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What orch commands import besides orch's own modules (``own_modules``), measured with -X importtime
# and by listing what the forked commands still imported themselves: the libraries orch imports at
# the top, and the provider SDKs with their HTTP stacks. An SDK is preloaded only where nothing it reads at import
# matters to orch: runpod reads its GraphQL URL and the API key orch passes it at each call
# (runpod/api/graphql.py), vastai its key at each call (vastai/_base.py), boto3 its settings when a
# session is made. runpod is imported through orch's own ``_sdk`` (no CPU probe subprocess).
PRELOAD = ("migrations", "fabric", "paramiko", "invoke", "typer", "rich.console", "yaml", "sqlmodel", "sqlalchemy.orm",
           "sqlalchemy.dialects.sqlite", "sqlalchemy.dialects.postgresql", "alembic.command", "alembic.config",
           "alembic.runtime.migration", "pydantic", "tenacity", "pluggy", "typer.main", "typer.core", "typer.rich_utils",
           "typer._adapters", "typer._click.decorators", "rich._emoji_codes",
           "requests", "urllib3", "http.client", "http.server", "email.message", "encodings.idna",
           "concurrent.futures", "vastai", "boto3", "aiohttp", "psutil", "dateutil.parser",
           "packaging.version", "tomlkit", "tqdm")


# -- the server -----------------------------------------------------------------------------------


# orch's own packages are preloaded whole: a command that reaches the providers' plugins imported
# every provider (the entry points load them all) and each one's modules itself, 10-20 ms of CPU per
# command. None of orch's modules reads the environment when imported. Not the CLI's __main__ (it
# would run), nor the scripts an instance runs (playbooks/on_instance: orch uploads them).
OWN = ("orchestrator", "providers", "playbooks")


def own_modules() -> list[str]:
    import pkgutil

    return [info.name for package in OWN for info in pkgutil.walk_packages([str(ROOT / package)], f"{package}.")
            if not info.name.endswith(".__main__") and not info.name.startswith("playbooks.on_instance")]


# Made once here and inherited by every child: the click command Typer builds from orch's app
# (10 ms of CPU in each command), SQLAlchemy's mappers of the ledger's tables, configured on a
# process's first query (8-18 ms in each command that reads the ledger), and a test's fresh ledger
# seeded (``tests.ledger_seed``).
WARM = ("orchestrator.cli.main:click_command", "sqlalchemy.orm:configure_mappers", "tests.ledger_seed:install")


def serve(path: str) -> None:
    import importlib

    for name in (*PRELOAD, *own_modules(), *WARM):
        module, _, call = name.partition(":")
        try:
            loaded = importlib.import_module(module)
            if call:
                getattr(loaded, call)()
        except Exception:  # noqa: BLE001 - whatever does not import here imports in the child, or fails there
            pass
    import gc

    gc.freeze()  # what was imported stays out of every child's collections (and its pages shared)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    waiting: dict[int, socket.socket] = {}
    asked: dict[int, dict] = {}
    parent = os.getppid()
    print("ready", flush=True)
    while True:
        if os.getppid() != parent:  # the test process is gone (killed by a timeout): so is its server
            os._exit(0)
        for key, _ in sel.select(timeout=2.0):
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    pid, request = _spawn(conn, (listener, sel), wake_r, wake_w)
                except Exception as e:  # noqa: BLE001 - this request fails, the server goes on
                    _send(conn, {"error": f"{type(e).__name__}: {e}"})
                    conn.close()
                    continue
                waiting[pid], asked[pid] = conn, request
                _send(conn, {"pid": pid})
            else:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            _reap(waiting, asked)


def _reap(waiting: dict, args: dict) -> None:
    while waiting:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
            conn.close()
        _account(args.pop(pid, None), usage)


def _account(request: dict | None, usage) -> None:
    """ORCH_TEST_FORK_LOG=FILE: one JSON line per command (its arguments, the test that ran it, the
    CPU seconds it and what it waited for used), to see where the suite's orch time goes."""
    path = os.environ.get("ORCH_TEST_FORK_LOG")
    if not path or request is None:
        return
    line = json.dumps({"args": request["args"][:3], "test": request["env"].get("PYTEST_CURRENT_TEST", ""),
                       "cpu": round(usage.ru_utime + usage.ru_stime, 3)})
    with open(path, "a") as f:
        f.write(line + "\n")


def _send(conn: socket.socket, msg: dict) -> None:
    try:
        conn.sendall((json.dumps(msg) + "\n").encode())
    except OSError:
        pass  # the test that asked is gone


def _spawn(conn: socket.socket, server: tuple, wake_r: int, wake_w: int) -> tuple[int, dict]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError("the request was cut short")
        data += more
    request = json.loads(data)
    if len(fds) != 3:
        raise ValueError(f"{len(fds)} file descriptors, not 3")
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid, request
    # The child: from here on it is the orch process. It never returns into the server's loop: orch
    # ends its own process (``cli.main.entry``: threads joined, atexit handlers run, the ledger's
    # connections closed, streams flushed, then os._exit), as it does when started by the interpreter;
    # whatever escapes that (SystemExit or KeyboardInterrupt, neither an Exception, which the loop
    # would catch) unwinds to the top, where the interpreter ends the child as any program.
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at startup
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for held in (*server, conn):
            held.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        if request.get("cpu") is not None:  # before anything it starts, which inherits it
            try:
                os.sched_setaffinity(0, {request["cpu"]})
            except OSError:
                pass
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # New streams on the new fds 0-2 (the server's own point at its pipes).
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False, buffering=1)
        sys.argv = [str(ROOT / "orchestrator" / "__main__.py"), *request["args"]]
    except BaseException:  # noqa: BLE001 - a child that could not become orch ends here
        import traceback

        traceback.print_exc()
        os._exit(1)
    _run()
    raise SystemExit(0)


def _run() -> None:
    """``python -m orchestrator``: its SystemExit and KeyboardInterrupt go up to the top, as they
    would in the interpreter; any other exception is what the interpreter does with it (a
    traceback, exit 1), here, so that it never meets the server's loop."""
    import runpy

    try:
        runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        raise SystemExit(1) from None


# -- the client -----------------------------------------------------------------------------------


class Forked:
    """What the tests use of ``subprocess.Popen``, for an orch process the server forked."""

    def __init__(self, args, pid: int, conn: socket.socket, stdin, stdout, stderr, buf: bytes = b""):
        self.args, self.pid, self._conn = args, pid, conn
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode = None
        self._buf = buf  # what the server sent after the pid (``popen``)

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (socket.timeout, BlockingIOError):
                return None
            if not chunk:
                raise RuntimeError(f"the fork server lost orch process {self.pid}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        self.returncode = json.loads(line)["returncode"]
        self._conn.close()
        return self.returncode

    def poll(self):
        return self._status(0)

    def wait(self, timeout: float | None = None):
        if self._status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):
        end = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        out, err = [], []
        readers = [(f, acc) for f, acc in ((self.stdout, out), (self.stderr, err)) if f is not None]
        threads = [threading.Thread(target=lambda f=f, acc=acc: acc.append(f.read()), daemon=True)
                   for f, acc in readers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if end is None else max(0.0, end - time.monotonic()))
        for f, _ in readers:
            f.close()
        return (out[0] if out else None) if self.stdout is not None else None, \
               (err[0] if err else None) if self.stderr is not None else None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_server: dict = {}
_lock = threading.Lock()


def enabled() -> bool:
    """Whether this run forks its orch processes: on unless ``ORCH_TEST_FORK=0``."""
    return os.environ.get("ORCH_TEST_FORK", "1") != "0"


def _socket_path() -> str | None:
    """This process's fork server, started on first use; None where it cannot run."""
    if not enabled():
        return None
    with _lock:
        if _server.get("pid") == os.getpid():
            proc = _server["proc"]
            return _server["path"] if proc.poll() is None else None
        folder = tempfile.mkdtemp(prefix="orch-fork-")
        path = os.path.join(folder, "s")
        proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", path], cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, text=True)
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            proc.wait()
            return None
        _server.update(pid=os.getpid(), proc=proc, path=path)

        def stop():
            proc.kill()
            proc.wait()
        atexit.register(stop)
        return path


def popen(args: list[str], env: dict, cwd, stdin=None, stdout=None, stderr=None, text=True, cpu=None):
    """``subprocess.Popen([sys.executable, "-m", "orchestrator", *args], ...)`` forked from the
    server, on ``cpu``; None where the server is off or gone (the caller starts it itself).
    ``stdin``/``stdout``/``stderr``: ``subprocess.PIPE`` or None (this process's own), as Popen takes them."""
    path = _socket_path()
    if path is None:
        return None
    full = [sys.executable, "-m", "orchestrator", *args]
    ours, theirs = [], []
    for fd, pipe, mode in ((0, stdin, "w"), (1, stdout, "r"), (2, stderr, "r")):
        if pipe == subprocess.PIPE:
            r, w = os.pipe()
            mine, child = (w, r) if mode == "w" else (r, w)
            ours.append(open(mine, mode + ("" if text else "b"), closefd=True))
            theirs.append(child)
        else:
            ours.append(None)
            theirs.append(os.dup(fd))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        msg = json.dumps({"args": list(args), "env": dict(env), "cwd": str(cwd), "cpu": cpu}) + "\n"
        socket.send_fds(conn, [msg.encode()], theirs)
        reply = b""
        while b"\n" not in reply:
            chunk = conn.recv(4096)
            if not chunk:
                raise RuntimeError("the fork server closed the connection")
            reply += chunk
    finally:
        for fd in theirs:
            os.close(fd)
    # A command that ends at once has its exit status sent right behind its pid: one read can hold both.
    line, rest = reply.split(b"\n", 1)
    answer = json.loads(line)
    if "pid" not in answer:
        raise RuntimeError(f"the fork server could not start orch: {answer.get('error')}")
    return Forked(full, answer["pid"], conn, *ours, buf=rest)


if __name__ == "__main__":
    serve(sys.argv[1])
