"""``orch exec NAME -- CMD`` and ``orch exec NAME -f task.yaml``: a command on a machine of yours
that is up (SkyPilot's ``sky exec``), with no new rental.

It is the command kind's own launch (``CommandKind.start``: the same environment on every
node, the secrets from this environment, ``command_entry.py`` detached) on the ``ready`` instance
or group NAME, recorded as that instance's run: ``orch logs NAME`` and ``orch status NAME`` show
it. What the machine already has is reused: without a workdir the command runs in the one the
last command left; ``setup:`` runs only with ``--setup`` (once per machine: one that already ran
there is not run again). It waits by default, printing the output, brings the log (and a task's
outputs, and each ``--output PATH``) home to ``$ORCH_HOME/runs/NAME``, verified, and exits with the
command's code; ``--detach`` returns once it started. The machine stays up when the command ends: its own idle policy applies.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from orchestrator.cli.app import app, instance_named, open_orch, out, say
from orchestrator.cli import task_run
from orchestrator.errors import OrchError, UsageError
from orchestrator import parallel as par

POLL_S = 1.0
# What a task file may say that `orch exec` does not use: it rents nothing and relaunches nothing.
NOT_USED = ("resources", "nodes", "checkpoint", "checkpoint_minutes", "keep_checkpoints", "max_cost", "max_hours",
            "retries", "keep", "idle_minutes", "on_idle", "volumes", "schedule")


@app.command("exec")
def exec_(
    name: str = typer.Argument(..., help="A ready instance (or group) of yours: `orch status` lists them."),
    command: Optional[List[str]] = typer.Argument(None, help="-- CMD ARGS...: the command to run."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="A task file (orch's, SkyPilot's or dstack's): "
                                                                   "its run, env, secrets, workdir, outputs."),
    setup: bool = typer.Option(False, "--setup", help="Run the task's setup: first (once per machine)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return once it started (`orch logs NAME -f` "
                                                             "follows it)."),
    env: Optional[List[str]] = typer.Option(None, "--env", help="NAME=VALUE for the command (repeatable)."),
    secret: Optional[List[str]] = typer.Option(None, "--secret", help="NAME of a variable of this environment the "
                                                                      "command gets (repeatable; never stored)."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="A local folder uploaded as the command's "
                                                                  "working directory (in place of the last one)."),
    workdir_max_mb: Optional[float] = task_run.workdir_max_mb_option(),
    allow_secret: Optional[List[str]] = task_run.allow_secret_option(),
    output: Optional[List[str]] = typer.Option(None, "--output", "-o", help="A file or folder (relative to the "
                                               "working directory) brought home verified when the command ends "
                                               "(repeatable; added to a task's outputs)."),
):
    """Run a command on a machine of yours that is up: no new rental, its setup reused; the output
    printed and the command's exit code returned (--detach: it goes on alone)."""
    from orchestrator.instances.lifecycle import check_name

    check_name(name)  # before anything is opened: a refusal creates no ledger
    if output and detach:
        raise UsageError("--output brings files home when the command ends, which --detach does not wait for: "
                         "one or the other")
    cmd = _command_spec(file, command, env or [], secret or [], workdir, setup, allow_secret or [], workdir_max_mb,
                        output or [])
    orch = open_orch()
    nodes, run = start(orch, name, cmd, frozenset(allow_secret or []))
    head = nodes[0]
    if detach:
        out(f"{name}: run r{run.id} started ({run.run_dir}); `orch logs {name} -f` follows it, its last line says "
            "its exit code; the machine stays up")
        return
    try:
        view = follow(orch, head, run, cmd)
    except KeyboardInterrupt:
        say(f"\norch: the command goes on on {name}: `orch logs {name} -f` follows it")
        sys.exit(130)
    code = view.get("exit_code")
    where, found = _bring_home(orch, head, run, cmd)
    what = f"its log and {', '.join(found)} are" if found else "its log is"  # where --output's files went
    say(f"orch: {name}: run r{run.id} {view['state']}" + (f", exit code {code}" if code is not None else "")
        + (f" in {view['phase']}" if view.get("phase") and code else "") + f"; {what} in {where}; the machine "
        "stays up")
    sys.exit(code if isinstance(code, int) and 0 <= code <= 255 else (0 if view["state"] == "completed" else 1))


def _command_spec(file, command, env: list[str], secret: list[str], workdir: str | None, setup: bool,
                  allow: list[str] = (), max_mb: float | None = None, output: list[str] = ()):
    """The command to run, checked as `orch run` checks a task's (every refusal one line, exit 2)."""
    import shlex

    from orchestrator.tasks import task
    from orchestrator.jobs import request

    if file is not None:
        t, lines = task.load(file)
        path, base = Path(file), Path(file).resolve().parent
    else:
        t, lines, path, base = task.Task(), None, None, Path.cwd()
    where = task.where(path, lines) if path else "orch exec"
    if t.train is not None:
        raise UsageError(f"{task.where(path, lines, 'train')}: orch exec runs a command (run:); a training on a "
                         "machine of yours: `orch up NAME --resume --data ...`")
    if command:
        if t.run is not None:
            raise UsageError(f"{where}: has its own run:; give the command there or after --, not both")
        t.run = shlex.join(command)
    if t.run is None:
        raise UsageError(f"{where}: nothing to run: -- CMD, or -f with a run: (commands:)")
    if setup and not t.setup:
        raise UsageError(f"{where}: --setup, but the task has no setup:")
    base = request.merge_flags(t, env, secret, workdir, base, path, lines, allow, max_mb, "orch exec")
    for o in output:  # checked as a task's outputs are: inside the working directory
        task.under_workdir(o, "output", "--output")
    if output:
        t.outputs = list(dict.fromkeys([*t.outputs, *output]))
    task.check(t, path, lines, command="orch exec")
    request._say_translation(path, lines, say)
    given = t.model_dump(exclude_unset=True)
    ignored = [key for key in NOT_USED if key in given]
    if ignored:
        say(f"orch exec: not used on a machine that is up: {', '.join(ignored)}")
    cmd = request.command_spec(t, path, lines, base)
    cmd.setup = t.setup if setup else None  # its setup reused: run again only when asked
    cmd.checkpoint = None  # nothing is relaunched: no checkpoint copy to take
    return cmd


def start(orch, name: str, cmd, allowed: frozenset = frozenset()):
    """The command started on NAME (every node of a group), under the instance's claim; (nodes, the
    head's run). Refused when NAME is not ready, belongs to a job, or still runs something."""
    from orchestrator import states
    from orchestrator.ledger import claims
    from orchestrator.instances import groups
    from orchestrator.jobs.kinds import CommandKind

    head = instance_named(orch, name)
    nodes = groups.members(orch.ledger, head)
    for node in nodes:
        if node.state != states.READY:
            raise UsageError(f"{node.name} is {node.state}: orch exec runs on a ready machine"
                             + (f" (`orch start {name}` first)" if node.state == states.STOPPED else ""))
    with claims.hold(orch.ledger, head.name, wait=60):
        _refuse_busy(orch, name, head, nodes)
        run = CommandKind(cmd).start(orch, nodes, allowed=allowed)
    return nodes, run


def _refuse_busy(orch, name: str, head, nodes) -> None:
    """A machine a job runs on is the job's (its engine reads its latest run); one whose last run
    still runs would have two commands and one record of them."""
    from orchestrator import jobs
    from orchestrator.runs import runs

    ids = {n.id for n in nodes}
    for job in orch.ledger.jobs(jobs.ACTIVE):
        attempts = orch.ledger.attempts(job.id)
        if attempts and attempts[-1].instance_id in ids:
            raise UsageError(f"{name} runs job {job.name} ({job.state}): `orch jobs show {job.name}`; orch exec runs "
                             "on a machine of yours that no job holds")
    run = orch.ledger.latest_run(head.id)
    if run is not None and run.run_dir:
        state = runs.read(orch, head, run)["state"]
        if state not in runs.ENDED:
            raise UsageError(f"{name} still runs r{run.id} ({state}): `orch logs {name} -f` follows it; orch exec "
                             "starts once it has ended")


def follow(orch, head, run, cmd) -> dict:
    """The command's output printed as it comes (its secrets hidden, terminal escapes dropped) until
    it ends; the command kind's last view of it (state, exit_code, phase)."""
    from orchestrator.cli.instances import _printable
    from orchestrator.jobs.kinds import CommandKind
    from orchestrator.tasks.task import held_secrets
    from playbooks import command

    hide, _ = held_secrets(cmd.secrets)
    kind = CommandKind(cmd)
    log, offset, part = f"{run.run_dir}/train.log", 0, ""
    while True:
        view = kind.read(orch, head, run)  # before the log: what the log holds once it ended is all of it
        with orch.connect(head) as c:
            while True:
                text, offset_after = command.log_since(c, log, offset)
                if offset_after == offset:
                    break
                offset = offset_after
                done, sep, part = (part + text).rpartition("\n")
                if sep:
                    sys.stdout.write(_printable(done, hide))
                    sys.stdout.flush()
        if view["state"] in ("completed", "failed", "crashed"):
            if part:
                sys.stdout.write(_printable(part, hide))
            return view
        par.nap(POLL_S)


def _bring_home(orch, head, run, cmd) -> tuple[Path, list[str]]:
    """The run's log and status (each node's), and the task's outputs, home (verified) to
    $ORCH_HOME/runs/NAME; (there, the outputs found)."""
    from orchestrator.runs import runs
    from orchestrator.jobs.kinds import CommandKind

    where = runs.pulled_dir(orch, head.group_name if (head.group_size or 1) > 1 else head.name)
    found: list[str] = []
    try:
        _, where = runs.pull(orch, head, run)
        missing = CommandKind(cmd).fetch(orch, head, where)  # a group's other nodes' logs, the outputs
        found = [o for o in cmd.outputs if o not in missing]
        if missing:
            say(f"orch: output(s) not found on {head.name}: {', '.join(missing)}")
    except OrchError as e:
        say(f"orch: warning: not everything came home from {head.name}: {e}")
    return where, found
