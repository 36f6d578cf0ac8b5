"""``orch run`` (one command from a dataset to weights on disk) and ``orch jobs`` (list, show, cancel, logs).

``orch run`` takes every option of ``orch up`` (its signature is ``up``'s, so an option added there
reaches here too, checked by the same ``jobs.request.check_up_options``) and a job's own: ``--max-cost``,
``--max-hours`` (the whole job's deadline rather than one instance's), ``--retries``, ``--keep``,
and ``--provider`` repeatable (the providers to rank). What a job is and how it moves: ``orchestrator.jobs``.
"""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from orchestrator.cli import instances
from orchestrator.cli.app import app, console, emit_json, open_orch, out, say
from orchestrator.cli import task_run
from orchestrator.errors import UsageError
from orchestrator.text import clean
from orchestrator import parallel as par

jobs_app = typer.Typer(help="Jobs started by `orch run`: list (`orch jobs`), show, cancel, logs, rm.",
                       invoke_without_command=True)
app.add_typer(jobs_app, name="jobs")

# up's options that a job reads its own way (declared by `run` itself).
OWN = ("name", "provider", "max_hours", "wait", "as_json")


def run(
    ctx: typer.Context,
    name: Optional[str] = typer.Argument(None, help="The job's name (lowercase letters, digits, '-'; at most 36): "
                                                    "its instances are NAME-a1, NAME-a2, ..., its files "
                                                    "$ORCH_HOME/runs/NAME. Wins over a task file's name:."),
    command: Optional[List[str]] = typer.Argument(None, help="-- CMD ARGS...: run this command instead of a "
                                                             "training (a task without a file)."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="A task file (YAML): resources, setup, run or "
                                                                   "train, env, secrets, workdir, outputs, "
                                                                   "checkpoint. Flags override it."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the ranked offers; rent nothing."),
    env: Optional[List[str]] = typer.Option(None, "--env", help="NAME=VALUE for the command (repeatable)."),
    secret: Optional[List[str]] = typer.Option(None, "--secret", help="NAME of a variable of this environment the "
                                                                      "command gets (repeatable; never stored)."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="A local folder uploaded as the command's "
                                                                  "working directory (a task file's own workdir: "
                                                                  "is beside it)."),
    workdir_max_mb: Optional[float] = task_run.workdir_max_mb_option(),
    allow_secret: Optional[List[str]] = task_run.allow_secret_option(),
    provider: Optional[List[str]] = typer.Option(None, "--provider", "-p", help="Providers to rank (repeatable; "
                                                 "default: every configured one). A CPU job uses the first (or the "
                                                 "default provider)."),
    max_cost: Optional[float] = typer.Option(None, help="$ cap over every attempt together: a plan estimated above "
                                                        "it is refused, a running attempt that would cross it stopped."),
    max_hours: Optional[float] = typer.Option(None, help="Deadline for the whole job, in hours from now."),
    retries: int = typer.Option(3, help="Relaunches after a lost attempt (or a launch that failed)."),
    keep: bool = typer.Option(False, "--keep", help="On completion stop the instance instead of destroying it, "
                                                    "where the provider can."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job to its end (Ctrl-C leaves it running once its "
                                                    "work started; before, it cancels the job)."),
    replace: bool = typer.Option(False, "--replace", help="Reuse the name of an ended job: its row and its files "
                                                          "are removed once the new plan holds (never a running "
                                                          "job's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the job as JSON."),
    avoid_preempted: bool = typer.Option(False, "--avoid-preempted", help="Leave out the offers of a place that "
                                         "preempted within preempted_hours (default: rank them last)."),
    **options,
):
    """Train from a dataset to weights on disk, or run any command (`-f task.yaml`, `NAME -- CMD`):
    plan the offer cheapest per job, launch, pull milestones, recover from lost machines, pull
    everything, destroy. `orch up`'s options apply."""
    from orchestrator.jobs import request

    name, command = _after_dashes(name, command)
    flags = request.Flags(up=options, env=env or [], secret=secret or [], workdir=workdir, provider=provider or [],
                          max_cost=max_cost, max_hours=max_hours, retries=retries, keep=keep, replace=replace,
                          allow_secret=allow_secret or [], workdir_max_mb=workdir_max_mb,
                          avoid_preempted=avoid_preempted, given=task_run.typed(ctx))
    _submit(request.build(name, command, file, flags, dry_run, say=say), dry_run, wait, as_json)


def _after_dashes(name, command):
    """(NAME, CMD) as typed: ``orch run -f t.yaml -- echo`` gives Typer NAME "echo" (all after ``--``
    is positional), which is the command's first word, not the job's name."""
    args = sys.argv[1:]
    rest = args[args.index("--") + 1:] if "--" in args else []
    if "--" in args and not rest and not any(a == "-f" or a.startswith("--file") for a in args):
        # `orch run NAME --cpu --` with the command forgotten was taken for a training ('--data needs ...')
        raise UsageError("orch run: nothing after --: give the command to run (`orch run NAME -- CMD ARGS...`)")
    if name is not None and rest and rest == [name, *(command or [])]:
        return None, [name, *(command or [])]
    return name, command


def _submit(sub, dry_run: bool, wait: bool, as_json: bool) -> None:
    """The job submitted (``jobs.submit``: planned once, recorded, its first attempt launched on the
    offer recorded), then shown, or followed to its end with --wait."""
    from orchestrator import jobs
    from orchestrator.views import jobs as job_views

    orch = open_orch()
    try:
        if dry_run:
            from orchestrator.errors import NoCapacity

            try:
                got = jobs.submit(orch, sub, dry_run=True)
            except NoCapacity:
                if task_run.print_list_prices(sub):  # no provider could be asked: the shipped list prices
                    return
                raise
            task_run.print_plan(sub, got.choice)
            return
        got = jobs.submit(orch, sub, dry_run=dry_run)
        job = got.job
        if wait and job.state in jobs.ACTIVE:
            job = job_views.follow(orch, job)
    except KeyboardInterrupt:
        job = orch.ledger.job(sub.name)
        if job is None or dry_run:
            raise  # nothing recorded yet: nothing goes on
        if job.state in jobs.ACTIVE and not _started(orch, job):
            _cancel_unstarted(orch, job)
            sys.exit(130)
        say(f"\norch: its command has started, so the job goes on: `orch jobs show {sub.name}` follows it, "
            f"`orch jobs cancel {sub.name}` stops it")
        say(_watched(orch, sub.name))
        sys.exit(130)
    watched = _watched(orch, job.name) if job.state in jobs.ACTIVE else None  # nobody follows it from here
    _show(orch, job, as_json)
    if watched:
        say(watched)  # what does: the watcher (started first, so it looks while this prints) or the reaper
    if job.state in (jobs.FAILED, jobs.STOPPED):
        sys.exit(1)


def _started(orch, job) -> bool:
    """Whether an attempt of the job ever got its work started (a Ctrl-C after that leaves the job
    running; before it, nothing the user asked for runs yet)."""
    from orchestrator.jobs.states import ATTEMPT_DONE, ATTEMPT_RUNNING, LOST

    return any(a.state in (ATTEMPT_RUNNING, ATTEMPT_DONE, LOST) for a in orch.ledger.attempts(job.id))


def _cancel_unstarted(orch, job) -> None:
    """A Ctrl-C during the first bring-up: the job is cancelled and what was rented ends (its
    bring-up already destroyed what it made), so no watcher rents a second attempt for it. A
    second Ctrl-C while this runs is held: what it ends must not be left billing."""
    from orchestrator import jobs, parallel

    say(f"\norch: interrupted before job {job.name}'s command started: cancelling it")
    with parallel.ctrl_c_held():
        try:
            job = jobs.cancel(orch, job)
        except UsageError:  # it ended meanwhile
            job = orch.ledger.get_job(job.id)
    say(f"orch: job {job.name}: {job.state}; nothing of it is left rented"
        if job.state == jobs.CANCELLED else f"orch: job {job.name}: {job.state}")


def _signature() -> inspect.Signature:
    """run's own parameters, then every option of up that a job reads as up does."""
    own = inspect.signature(run, eval_str=True)
    up = inspect.signature(instances.up, eval_str=True)
    params = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD]
    params += [p for n, p in up.parameters.items() if n not in OWN]
    return inspect.Signature(params)


run.__signature__ = _signature()
run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
app.command("run")(run)


def _watched(orch, name: str) -> str:
    """What watches the job once `orch run` returns, in one line (``watcher.ensure``)."""
    from orchestrator.reaper import watcher

    return watcher.ensure(orch, name)


def _job(orch, name: str):
    from orchestrator import jobs

    jobs.check_job_name(name)
    job = orch.ledger.job(name)
    if job is None:
        raise UsageError(f"no job named {name!r} (see `orch jobs`)")
    return job


def _show(orch, job, as_json: bool) -> None:
    from orchestrator import jobs
    from orchestrator.views import jobs as job_views

    d = job_views.job_dict(orch, job)
    if as_json:
        emit_json(d)
        return
    kind = job_views.kind_of(job)
    out(f"job {d['name']}: {d['state']}" + (f" ({clean(d['reason'], 300)})" if d["reason"] else ""))
    if d.get("schedule"):
        out(f"  schedule {d['schedule']} started it (`orch schedule ls`)")
    for line in kind.show(d) if kind else ["  spec     unreadable (not a job this orch can run)"]:
        out(line)
    out(f"  plan     {clean(d['plan'].get('line'), 300)}")
    if (d.get("nodes") or 1) > 1:
        out(f"  nodes    {d['nodes']} per attempt, relaunched as one")
    for line in job_views.node_lines(d):  # each node of the current attempt, its own progress
        out(line)
    cap = f" of ${d['max_cost']:g}" if d["max_cost"] is not None else ""
    out(f"  cost     ${d['cost']:.4f}{cap}, {len(d['attempts'])} attempt(s), {d['retries']} relaunch(es) allowed")
    planned = d["plan"].get("offer")
    for a in d["attempts"]:
        price = f" ${a['price_hr']:.4f}/hr" if a["price_hr"] is not None else ""
        rented = ""
        if a.get("offer_key"):
            rented = f", offer {clean(a['offer_key'], 120)}" + (" (the plan's)" if a["offer_key"] == planned else "")
        out(f"  attempt {a['number']}  {a['instance']} on {a['provider']}{price}{rented}: {a['state']}"
            + (kind.start_note(a) if kind else "") + f", ${a['cost']:.4f}"
            + (f" ({clean(a['reason'], 200)})" if a["reason"] else ""))
    if d["phases"]:
        out("  phases   " + ", ".join(f"{k} {v:.1f} s" for k, v in d["phases"].items()))
    if d["weights"]:
        out(f"  {kind.results if kind else 'results':8} {d['weights']}")
    if d["state"] in jobs.ACTIVE:
        out(f"  follow   orch jobs show {d['name']} | orch jobs logs {d['name']} -f")
        out(f"  cancel   orch jobs cancel {d['name']}")


@jobs_app.callback()
def jobs_list(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="As JSON (name state "
                                                                                     "attempts cost weights ...).")):
    """Every job, from the ledger."""
    if ctx.invoked_subcommand is not None:
        return
    from orchestrator.views import jobs as job_views

    orch = open_orch()
    rows = [job_views.job_dict(orch, j) for j in orch.ledger.jobs()]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console().print("no jobs (`orch run NAME --data ...` starts one)")
        return
    from rich.markup import escape
    from rich.table import Table

    t = Table(box=None, pad_edge=False)
    for col in ("NAME", "STATE", "ATTEMPTS", "EPOCH", "COST", "WEIGHTS / WHY"):
        # a name is what the user copies into the next command: whole, the other columns fold
        t.add_column(col, overflow="fold", no_wrap=col == "NAME")
    from orchestrator.jobs.kinds import KINDS

    for d in rows:
        progress = KINDS[d["kind"]].progress(d) if d["kind"] in KINDS else "-"
        name = d["name"] + (f"\n(schedule {d['schedule']})" if d.get("schedule") else "")
        t.add_row(name, d["state"], str(len(d["attempts"])), progress,
                  f"${d['cost']:.4f}", escape(d["weights"] or clean(d["reason"], 200) or "-"))
    console().print(t)


@jobs_app.command("show")
def jobs_show(name: str, as_json: bool = typer.Option(False, "--json", help="As JSON.")):
    """One job, after one look (which advances it: recovering a lost attempt, finishing a completed one)."""
    from orchestrator import jobs

    jobs.check_job_name(name)  # before anything is opened: a refusal creates no ledger
    orch = open_orch()
    job = _job(orch, name)
    before = job.updated_at
    job = jobs.advance(orch, job)
    if job.state in jobs.ACTIVE and job.updated_at == before and not as_json:
        say(f"orch: {name} was not looked at now: another orch process is advancing it")
    _show(orch, job, as_json)


@jobs_app.command("cancel")
def jobs_cancel(name: str):
    """Stop the job: pull what can be pulled, destroy its instance."""
    from orchestrator import jobs

    jobs.check_job_name(name)  # before anything is opened: a refusal creates no ledger
    orch = open_orch()
    job = jobs.cancel(orch, _job(orch, name))
    out(f"job {job.name}: {job.state}")


@jobs_app.command("rm")
def jobs_rm(name: str, yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask (needed without a terminal).")):
    """Remove an ended job: its row in the ledger and its files at home (weights, outputs, checkpoint
    copies); its name is free again. Refused while it runs (`orch jobs cancel` first)."""
    from orchestrator import jobs
    from orchestrator.jobs.record import files_of, forget

    jobs.check_job_name(name)  # before anything is opened: a refusal creates no ledger
    orch = open_orch()
    job = _job(orch, name)
    if job.state in jobs.ACTIVE:
        raise UsageError(f"job {name} is {job.state}: `orch jobs cancel {name}` first")
    held = files_of(orch.home, name)
    if not yes:
        what = f"job {name} ({job.state})" + (f" and {', '.join(map(str, held))}" if held else "")
        if not sys.stdin.isatty():
            raise UsageError(f"removing {what} loses its files: add --yes to remove without asking (no terminal to "
                             "ask on)")
        if not typer.confirm(f"remove {what}?", default=False, err=True):
            raise UsageError("nothing removed")
    rows, gone = forget(orch, name, jobs.ENDED)
    out(f"job {name} removed ({len(rows)} row(s)" + (f"; {', '.join(map(str, gone))} deleted" if gone else "") + ")")


@jobs_app.command("logs")
def jobs_logs(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines, "
                                                                                  "attempt after attempt, until the "
                                                                                  "job ends."),
              lines: int = typer.Option(50, "--lines", "-n", help="How many lines from the end."),
              node: int = typer.Option(None, "--node", help="A group job: node R's log (0, the head, by default).")):
    """The log of the job's current attempt (the pulled train.log once its instance is gone)."""
    from orchestrator import states
    from orchestrator.instances import groups
    from orchestrator.jobs.record import check_job_name, node_log, scrub, weights_dir

    check_job_name(name)  # before anything is opened: a refusal creates no ledger
    if not 1 <= lines <= 100_000:
        raise UsageError(f"--lines must be between 1 and 100000, not {lines}")
    if node is not None and not 0 <= node < groups.MAX_NODES:
        raise UsageError(f"--node must be a rank between 0 and {groups.MAX_NODES - 1}, not {node}")
    orch = open_orch()
    job = _job(orch, name)
    if node is not None and node >= (job.nodes or 1):
        raise UsageError(f"job {name} runs on {job.nodes or 1} node(s): ranks 0 to {(job.nodes or 1) - 1}, not {node}")
    if follow:
        from orchestrator import jobs

        if job.state in jobs.ACTIVE:
            _follow_log(orch, job, lines, node or 0)
            return
    inst = _node_now(orch, job, node or 0)
    if inst is not None and inst.state == states.READY:
        instances.logs(inst.name, follow=False, lines=lines)
        return
    pulled = node_log(weights_dir(orch.home, job.name), node or 0)
    if not pulled.is_file():
        raise UsageError(f"job {name} has no instance up and no pulled {pulled.name} in {pulled.parent}")
    text = Path(pulled).read_bytes()[-(2 << 20):].decode(errors="replace").splitlines()[-lines:]
    for line in text:
        out(scrub(job, clean(line, 100_000)) or "")  # hidden when it came home; a secret held now hidden too


def _node_now(orch, job, node: int):
    """Node ``node`` (0: the head) of the job's current attempt, or None."""
    from orchestrator.instances import groups

    attempts = orch.ledger.attempts(job.id)
    inst = orch.ledger.get(attempts[-1].instance_id) if attempts and attempts[-1].instance_id else None
    if inst is not None and node:
        inst = next((n for n in groups.members(orch.ledger, inst) if n.node_rank == node), None)
    return inst


FOLLOW_S = 1.0  # how often `orch jobs logs -f` reads what the log gained
LOOK_S = 5.0  # how often it advances the job itself, when no watcher or reaper does


def _follow_log(orch, job, lines: int, node: int) -> None:
    """`orch jobs logs -f`: the log of the job's current attempt as it grows, the next attempt's
    after a relaunch, until the job ends; then what its pulled log holds past what was printed (the
    last lines, written after the last read). One SSH connection per attempt, read with SFTP."""
    from orchestrator import jobs, states
    from orchestrator.reaper import watcher
    from orchestrator.errors import OrchError
    from orchestrator.jobs.record import node_log, secret_names, weights_dir
    from orchestrator.tasks.task import held_secrets
    from playbooks import host

    hide, missing = held_secrets(secret_names(job))
    if missing:  # what the command printed may show them, and this process cannot hide them
        raise UsageError(f"job {job.name}'s log may show the secret {', '.join(missing)}, which this orch process "
                         "does not hold to hide: ask again where it is set")
    printer = _LogPrinter(hide)
    looked = time.monotonic()
    current = None  # (instance id, run id) being followed

    def look(job):
        """The job as the ledger has it now; advanced first when nothing else watches it."""
        nonlocal looked
        if time.monotonic() - looked >= LOOK_S:
            looked = time.monotonic()
            if watcher.watching(orch) is None:
                return jobs.advance(orch, orch.ledger.get_job(job.id))
        return orch.ledger.get_job(job.id)

    while job.state in jobs.ACTIVE:
        inst = _node_now(orch, job, node)
        run = orch.ledger.latest_run(inst.id) if inst is not None else None
        if inst is None or inst.state != states.READY or run is None:
            par.nap(FOLLOW_S)
            job = look(job)
            continue
        if current is not None and current != (inst.id, run.id):
            say(f"orch: job {job.name}: now {inst.name}'s log")
            printer.restart(whole=True)
        current = (inst.id, run.id)
        try:
            with orch.connect(inst) as c:
                path = host.workdir(c) + "/train.log"
                sftp = c.sftp()
                while job.state in jobs.ACTIVE:
                    if not printer.read(sftp, path, lines):
                        break  # the connection dropped: the next look says where the job goes
                    par.nap(FOLLOW_S)
                    job = look(job)
                    now = _node_now(orch, job, node)
                    latest = orch.ledger.latest_run(now.id) if now is not None else None
                    if now is None or (now.id, getattr(latest, "id", None)) != current or now.state != states.READY:
                        break  # relaunched, replaced, or its machine is going: follow where it goes
                else:
                    printer.read(sftp, path, lines)  # what it wrote before it ended, while it still answers
        except OrchError:
            par.nap(FOLLOW_S)  # lost, or not answering: the next look says where the job goes
            job = look(job)
    pulled = node_log(weights_dir(orch.home, job.name), node)
    printer.rest(pulled if current is None or current == _now_key(orch, job, node) else None, lines)


def _now_key(orch, job, node: int):
    inst = _node_now(orch, job, node)
    run = orch.ledger.latest_run(inst.id) if inst is not None else None
    return (inst.id, run.id) if inst is not None and run is not None else None


class _LogPrinter:
    """A log followed by offset: whole lines printed (printable, the job's secrets hidden), the
    first read its last ``lines`` lines only; a log that shrank (a new run wrote it afresh) is read
    from its start."""

    TAIL_BYTES = 1 << 20

    def __init__(self, hide):
        self.hide = hide
        self.restart(whole=False)

    def restart(self, whole: bool) -> None:
        """A new log: read whole (a relaunch's), or only its last lines (the first one)."""
        self.offset, self.part, self.first = None, b"", not whole

    def read(self, sftp, path: str, lines: int) -> bool:
        """What the log gained since the last read, printed; False when the connection failed."""
        try:
            size = sftp.stat(path).st_size
            if self.offset is None or size < self.offset:
                self.offset, self.part = max(size - self.TAIL_BYTES, 0) if self.first else 0, b""
            if size == self.offset:
                return True
            with sftp.open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read(min(size - self.offset, 8 << 20))
        except FileNotFoundError:
            return True  # not written yet
        except Exception:  # noqa: BLE001 - paramiko's and the socket's errors alike: the machine is going
            return False
        self.offset += len(data)
        self._print(data, lines if self.first else None)
        self.first = False
        return True

    def _print(self, data: bytes, last: int | None) -> None:
        from orchestrator.cli.instances import _printable

        done, sep, self.part = (self.part + data).rpartition(b"\n")
        if not sep:
            return  # no whole line yet
        text = done.decode(errors="replace")
        if last is not None:
            text = "\n".join(text.splitlines()[-last:])
        sys.stdout.write(_printable(text, self.hide))
        sys.stdout.flush()

    def rest(self, pulled: Path | None, lines: int) -> None:
        """After the job ended: what the pulled copy of the followed log holds past the last read
        (the same file, brought home whole; its last ``lines`` lines where none was read), and a
        last line left without its newline."""
        if pulled is not None and pulled.is_file():
            with open(pulled, "rb") as f:
                if self.offset is None:
                    f.seek(max(f.seek(0, 2) - self.TAIL_BYTES, 0))
                    self._print(f.read(), lines)
                else:
                    f.seek(self.offset)
                    self._print(f.read(8 << 20), None)
        if self.part:
            self._print(b"\n", None)
