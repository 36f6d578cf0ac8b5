"""The entry point of the ``orch`` command (the console script and ``python -m orchestrator``).

``orch status`` without a name, the command people run most (often in a loop), is answered by
``fleet`` with the standard library alone when it can be; everything else goes to the Typer app,
with every command module imported here, and one error boundary: orch's own errors are one line
and their exit code, anything else a one-line "internal error".
"""

from __future__ import annotations

import os
import sys

FAST_FLAGS = {"--json", "--all", "-a"}


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["status"] and set(args[1:]) <= FAST_FLAGS:
        from orchestrator import fleet

        try:
            fleet.show("--all" in args or "-a" in args, "--json" in args)
            return
        except Exception:  # noqa: BLE001 - whatever it was, the full CLI says it properly (one line, its exit code)
            pass
    run()


def run() -> None:
    import typer

    from orchestrator.cli import instances, jobs, offers, reaper, reconcile, check, data, export, db, demo, sshconfig, dashboard  # noqa: F401,I001  (their commands, in help order)
    from orchestrator.cli.app import app, one_line
    from orchestrator.errors import OrchError

    try:
        command = typer.main.get_command(app)
        if os.environ.get("_ORCH_COMPLETE"):  # the shell asks for completions (Typer's scripts set this)
            from orchestrator.cli.app import complete_instance_names

            complete_instance_names(command)
        command.main(standalone_mode=False, prog_name="orch")  # named, not "python -m orchestrator": completion keys on it
    except OrchError as e:
        print(f"orch: error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("orch: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # usage errors and our bugs alike get one line
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
