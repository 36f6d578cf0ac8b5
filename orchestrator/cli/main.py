"""The entry point of the ``orch`` command (the console script and ``python -m orchestrator``).

``orch status`` without a name, the command people run most (often in a loop), is answered by
``fleet`` with the standard library alone when it can be, ``orch cost`` and ``orch reap [--dry-run]``
(over the whole fleet: a scheduled pass must keep up with ``orch status``) without Typer, and ``orch ssh NAME [-- CMD]`` by
``ssh_exec`` (ssh exec'd from the ledger's row); everything else goes to the Typer app,
with every command module imported here, and one error boundary: orch's own errors are one line
and their exit code, anything else a one-line "internal error".
"""

from __future__ import annotations

import functools
import os
import sys

FAST_FLAGS = {"--json", "--all", "-a"}


def _fast(args: list[str]):
    """The commands over the whole fleet, answered without Typer (0.2 s of start-up, pydantic included)
    when they come with no option but these flags: they must keep up with ``orch status`` on a fleet
    of 10,000. Anything else, ``--help`` included, goes to the Typer app."""
    flags = set(args[1:])
    if args[:1] == ["status"] and flags <= FAST_FLAGS:
        from orchestrator.views import fleet

        return lambda: fleet.show("--all" in flags or "-a" in flags, "--json" in flags)
    if args[:1] == ["cost"] and flags <= {"--json"}:
        def cost() -> None:
            from orchestrator.money import budget
            from orchestrator.instances.lifecycle import Orch

            budget.show_cost(Orch.open(say=lambda m: print(m, file=sys.stderr), lazy=True).ledger, as_json="--json" in flags)

        return cost
    if args[:1] == ["reap"] and flags <= {"--dry-run", "--json"}:
        from orchestrator.reaper import duty

        def reap() -> None:
            duty.fast("--dry-run" in flags, "--json" in flags)

        # A real pass acts: it is never run twice, so its errors are said here, by the one boundary.
        return reap if "--dry-run" in flags else lambda: run(reap)
    if args[:1] == ["watch"]:  # the detached watcher `orch run` starts (``watcher``): not in --help
        from orchestrator.reaper import watcher

        return lambda: run(lambda: watcher.main(args[1:]))
    return None


def entry() -> None:
    """The ``orch`` process: ``main``, then the end of the process (``_end``). ``main`` alone is what
    runs orch inside another program (the tests' in-process calls): it returns or raises SystemExit."""
    try:
        main()
    except SystemExit as e:
        _end(e.code)
    _end(0)


def _end(code) -> None:
    """End the process as the interpreter would, less its last step. At exit Python joins the
    program's threads, runs its atexit handlers (the ledger's connections close there, SQLite
    checkpointing its WAL; a webhook still in flight is waited for), flushes stdout and stderr, and
    then tears down every module it imported: SQLAlchemy, paramiko, Typer, pydantic. That last step
    writes nothing anyone reads, and cost 0.1 s of CPU in each ``orch reap`` (0.55 s in all), more in
    a process forked from another. What SystemExit's code means is Python's: None is 0, an int is
    itself, anything else is printed on stderr and exits 1."""
    import atexit
    import threading

    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # Both private, and what Py_FinalizeEx itself calls first (CPython's Python/pylifecycle.c): the
    # join of non-daemon threads (with concurrent.futures' own exit hooks), then atexit's handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left (BrokenPipeError) or a closed stream
            code = code or 1  # the output was cut short, as ``_reader_left`` says
    os._exit(code)


def main() -> None:
    args = sys.argv[1:]
    fast = _fast(args)
    if fast is not None:
        try:
            fast()
            return
        except BrokenPipeError:
            _reader_left()
        except Exception:  # noqa: BLE001 - whatever it was, the full CLI says it properly (one line, its exit code)
            pass
    if args[:1] == ["ssh"]:
        from orchestrator.ssh import ssh_exec

        ssh_exec.fast(args)  # execs ssh, or returns when the full CLI must answer
    run()


@functools.cache
def click_command():
    """orch's click command, as Typer builds it from the app (10 ms of CPU, every command and option
    made anew): once per process. A process forked after it was built (tests/zygote.py) inherits it."""
    import typer

    from orchestrator.cli import instances, jobs, exec, schedule, offers, reaper, reconcile, check, data, export, db, demo, sshconfig, dashboard, volume, budget  # noqa: F401,I001  (their commands, in help order)
    from orchestrator.cli.app import app

    return typer.main.get_command(app)


def run(call=None) -> None:
    """The Typer app, or ``call`` (a fast path), inside orch's one error boundary."""
    from orchestrator.errors import OrchError

    try:
        if call is not None:
            return call()
        command = click_command()
        if os.environ.get("_ORCH_COMPLETE"):  # the shell asks for completions (Typer's scripts set this)
            from orchestrator.cli.app import complete_names

            complete_names(command)
        interrupted = _watch_ctrl_c()
        code = command.main(standalone_mode=False, prog_name="orch")  # named "orch": completion keys on it
        if interrupted and code == 130:  # (a command that ends on Ctrl-C by design, `orch monitor`, returns None)
            # Typer turns a KeyboardInterrupt into Exit(130) and, outside standalone mode, returns that
            # code instead of raising it: without this an interrupted `orch up` exited 0.
            raise KeyboardInterrupt
    except OrchError as e:
        from orchestrator.cli.app import one_line

        print(f"orch: error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("orch: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        _reader_left()
    except SystemExit:
        raise
    except Exception as e:  # usage errors and our bugs alike get one line
        import typer

        from orchestrator.cli.app import one_line

        if isinstance(e, typer.TyperException):  # Typer's own click: bad option values, unknown options
            print(f"orch: error: {one_line(e.format_message().replace(chr(10), ' '))}", file=sys.stderr)
            sys.exit(e.exit_code)
        if isinstance(e, typer.Abort):
            sys.exit(1)
        if os.environ.get("ORCH_DEBUG"):
            raise
        print(f"orch: internal error: {type(e).__name__}: {one_line(str(e))} (ORCH_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        sys.exit(1)


def _watch_ctrl_c() -> list:
    """Python's own Ctrl-C (a KeyboardInterrupt where the main thread is), remembered: a non-empty
    list once it happened, whoever caught it since."""
    import signal

    seen: list = []

    def interrupt(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt)
    from orchestrator import parallel

    parallel.keep_dropped_ctrl_c()  # one that lands in a finalizer reaches the next wait's nap
    return seen


def _reader_left() -> None:
    """``orch status --json | head``: the reader closed the pipe; nothing to say and nowhere to say it.
    stdout goes to /dev/null so the interpreter's last flush does not fail again (Python's docs on
    SIGPIPE), and the exit code says the output was cut short."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)
