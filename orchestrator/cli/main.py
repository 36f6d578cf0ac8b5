"""The entry point of the ``orch`` command (the console script and ``python -m orchestrator``).

``orch status`` without a name, the command people run most (often in a loop), is answered by
``fleet`` with the standard library alone when it can be, and ``orch cost`` and ``orch reap
--dry-run`` (read-only reports over the whole fleet) without Typer; everything else goes to the Typer app,
with every command module imported here, and one error boundary: orch's own errors are one line
and their exit code, anything else a one-line "internal error".
"""

from __future__ import annotations

import os
import sys

FAST_FLAGS = {"--json", "--all", "-a"}


def _fast(args: list[str]):
    """The read-only reports over the whole fleet, answered without Typer (0.2 s of start-up, pydantic
    included) when they come with no option but these flags: they must keep up with ``orch status``
    on a fleet of 10,000. Anything else, ``--help`` included, goes to the Typer app."""
    flags = set(args[1:])
    if args[:1] == ["status"] and flags <= FAST_FLAGS:
        from orchestrator import fleet

        return lambda: fleet.show("--all" in flags or "-a" in flags, "--json" in flags)
    if args[:1] == ["cost"] and flags <= {"--json"}:
        def cost() -> None:
            from orchestrator import cost as costs
            from orchestrator.lifecycle import Orch

            costs.show(Orch.open(say=lambda m: print(m, file=sys.stderr), lazy=True).ledger, as_json="--json" in flags)

        return cost
    if args[:1] == ["reap"] and "--dry-run" in flags and flags <= {"--dry-run", "--json"}:
        from orchestrator import reaper

        return lambda: reaper.dry_run_fast("--json" in flags)
    return None


def main() -> None:
    args = sys.argv[1:]
    fast = _fast(args)
    if fast is not None:
        try:
            fast()
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
