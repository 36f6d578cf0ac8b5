"""The Typer app and what every command module shares: opening orch, saying things, printing JSON.

Imports no command module (each of those imports this one). Heavy modules (SQLAlchemy, Fabric,
provider SDKs) load inside commands, never here: ``orch --help`` stays fast.
"""

from __future__ import annotations

import json
import sys

import typer

app = typer.Typer(help="Rent GPUs, train on them, bring the weights home, never leave a machine billing.",
                  no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None, add_completion=True,
                  context_settings={"help_option_names": ["-h", "--help"]})


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def out(text: str) -> None:
    """One line for the user on stdout, printed as it is: no Rich markup is read in it (text from an
    instance or a provider may hold brackets), no terminal escapes pass (see ``text.clean``)."""
    print(text, flush=True)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def open_orch(actor: str = "cli", lazy: bool = False):
    """Orch for a command; ``lazy``: its ledger opens at first use (``Orch.open``)."""
    from orchestrator.instances.lifecycle import Orch

    return Orch.open(actor=actor, say=say, lazy=lazy)


def emit_json(data) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def one_line(text: str) -> str:
    """An error as one line: a newline or a control character from the user's input is shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())


# Commands whose NAME argument names something the ledger holds (`up` names a new instance), and
# what: live instances, jobs, schedules, volumes.
INSTANCE_COMMANDS = frozenset({"status", "ssh", "stop", "start", "down", "pull", "logs", "monitor", "trial", "cost",
                               "protect", "unprotect", "exec"})
NAMED = {**{(c,): "instances" for c in INSTANCE_COMMANDS},
         **{("jobs", c): "jobs" for c in ("show", "logs", "cancel", "rm")},
         **{("schedule", c): "schedules" for c in ("rm", "pause", "resume", "run")},
         ("volume", "rm"): "volumes"}


def names(what: str, incomplete: str) -> list[str]:
    """Names of ``what`` (live instances, jobs, schedules, volumes) that start with ``incomplete``,
    for shell completion, through ``ledger_sql`` (a SQLite ledger with the standard library: a
    Tab must answer at once); nothing when they cannot be read."""
    try:
        from orchestrator.ledger import ledger_sql

        found = sorted({row["name"] for row in ledger_sql.live(("name",))}) if what == "instances" else \
            ledger_sql.names(what)
    except Exception:  # noqa: BLE001 - a completion never prints an error into the user's prompt
        return []
    return [n for n in found if n.startswith(incomplete)]


def complete_names(command, path: tuple[str, ...] = ()) -> None:
    """Give each command's NAME argument (``NAMED``) the ledger's names as completions."""
    for name, sub in getattr(command, "commands", {}).items():
        what = NAMED.get((*path, name))
        if what is not None:
            for param in sub.params:
                if param.name in ("name", "names") and param.param_type_name == "argument":
                    # click's hook for a parameter's completions (what Typer's autocompletion= sets)
                    param._custom_shell_complete = lambda ctx, param, incomplete, what=what: names(what, incomplete)
        complete_names(sub, (*path, name))


def instance_named(orch, name: str, node: int | None = None):
    """The live instance a command names; a group's name stands for its node ``node`` (default
    its head, rank 0)."""
    from orchestrator.instances import groups

    return groups.resolve(orch, name, node)
