"""The command kind: a task file's ``run:``, or ``orch run NAME -- CMD``.

- **launch**: the workdir up, the newest intact copy of the checkpoint folder restored into it
  (``ORCH_CHECKPOINT_DIR``), the node's environment (``nodes.node_env``), the secrets read from
  this process's environment, then ``command_entry.py`` detached (``playbooks/command``);
- **read**: the run's ``status.json`` through ``runs.digest``, with the command's exit code
  and the phase (setup or run) it ended in: a non-zero exit is the command's own, never relaunched;
- **checkpoint**: every ``checkpoint_minutes``, the folder copied aside on the instance only when
  nothing in it changed during the copy (a file being written would be torn), then pulled home
  verified (``playbooks.pull``: checksums, never outside the destination);
- **outputs**: the declared paths under the workdir, pulled home with the same rules.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.ledger import claims
from orchestrator.tasks import task
from orchestrator.errors import OrchError, UsageError
from orchestrator.jobs.kinds.base import JobKind, Launched
from orchestrator.jobs.record import (allowed_secrets, checkpoint_dir, copies, log_tail, node_log, note_once,
                                      tail_lines, weights_dir)
from orchestrator.nodes import Run, is_plain_ip, mpi_hostfile, run_env
from orchestrator.text import clean, row_json
from orchestrator.text import why as _why

MAX_FILE = 1 << 40
PULL_WAIT_S = 120.0


# -- its spec, as the ledger's jobs.spec keeps it: names, never a secret's value -------------------
@dataclass
class CommandSpec:
    run: str
    setup: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)  # names only: values are read at each launch
    workdir: str | None = None  # the local folder, absolute
    outputs: list[str] = field(default_factory=list)  # normalised, relative to the workdir
    checkpoint: str | None = None  # normalised, relative to the workdir
    checkpoint_minutes: float = 10.0
    keep_checkpoints: int = 1  # the newest N copies of the checkpoint folder kept after success
    preempt_signal: str = "TERM"  # what the command's process group gets on a spot interruption notice
    nodes: int = 1
    workdir_max_mb: float = task.DEFAULT_WORKDIR_MB
    excludes: list[str] = field(default_factory=list)  # filled in by workdir.pack
    workdir_bytes: int | None = None
    workdir_tar: str | None = None  # orch's cache: packed again when cleaned


def check_stored(cmd: CommandSpec, cache: Path) -> CommandSpec:
    """A command's spec as the ledger gives it back, held to what making it checked (a shared
    ledger is input too: whoever can write it must not make a reaper send or write a file it
    chooses): each field of its type, names and values a command may have, the outputs and the
    checkpoint folder inside the workdir, the workdir an absolute folder, and its packed copy a
    name ``workdir.pack`` gives, taken from ``cache`` alone. UsageError names the first field wrong."""
    def refuse(what: str):
        raise UsageError(f"the job's stored command is refused: {what}")

    def text(value, key, empty=False) -> bool:
        if not isinstance(value, str) or "\0" in value or (not empty and not value.strip()):
            refuse(f"{key} is not a text it could have been made with")
        return True

    def number(value, key, low, high, kind=(int, float)) -> None:
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            refuse(f"{key} {value!r} is not a number from {low} to {high}")

    text(cmd.run, "run")
    if cmd.setup is not None:
        text(cmd.setup, "setup", empty=True)
    if not isinstance(cmd.env, dict) or not isinstance(cmd.secrets, list):
        refuse("env or secrets is not a mapping or a list")
    for key, value in cmd.env.items():
        if not task.ENV_NAME.fullmatch(str(key)) or key.startswith(task.RESERVED_ENV):
            refuse(f"env {key!r} is not a variable a command may set")
        text(value, f"env {key}", empty=True)
    for name in cmd.secrets:
        if not isinstance(name, str) or not task.ENV_NAME.fullmatch(name) or name.startswith(task.RESERVED_ENV):
            refuse(f"secret {name!r} is not a variable name")
    if not isinstance(cmd.outputs, list) or not isinstance(cmd.excludes, list):
        refuse("outputs is not a list")
    for out in cmd.outputs:
        if not isinstance(out, str) or task.under_workdir(out, "output", "the job's stored command") != out \
                or out in task.RESERVED_OUTPUTS:
            refuse(f"output {out!r} is not a path inside the workdir")
    if cmd.checkpoint is not None and (not isinstance(cmd.checkpoint, str)
                                       or task.under_workdir(cmd.checkpoint, "checkpoint folder",
                                                             "the job's stored command") != cmd.checkpoint):
        refuse(f"checkpoint {cmd.checkpoint!r} is not a folder inside the workdir")
    number(cmd.checkpoint_minutes, "checkpoint_minutes", 1e-9, 100_000)
    number(cmd.keep_checkpoints, "keep_checkpoints", 0, 1000, int)
    if cmd.preempt_signal not in task.PREEMPT_SIGNALS:
        refuse(f"preempt_signal {str(cmd.preempt_signal)[:20]!r} is not one of {', '.join(task.PREEMPT_SIGNALS)}")
    number(cmd.nodes, "nodes", 1, 64, int)
    number(cmd.workdir_max_mb, "workdir_max_mb", 1e-9, 100_000)
    if cmd.workdir_bytes is not None:
        number(cmd.workdir_bytes, "workdir_bytes", 0, 1 << 50, int)
    if cmd.workdir is None:
        if cmd.workdir_tar is not None:
            refuse("a packed workdir without a workdir")
        return cmd
    text(cmd.workdir, "workdir")
    if not os.path.isabs(cmd.workdir) or os.path.normpath(cmd.workdir) != cmd.workdir:
        refuse(f"workdir {cmd.workdir!r} is not the absolute folder the job was made with")
    from orchestrator.tasks import workdir

    workdir.guard(Path(cmd.workdir), "the job's stored command")  # never your home, $ORCH_HOME, your keys
    # The packed copy is named by its content when the job is made (``workdir.pack``) and taken
    # from orch's cache alone: whatever folder the row names for it is not read.
    if not isinstance(cmd.workdir_tar, str) or not workdir.TAR.fullmatch(Path(cmd.workdir_tar).name):
        refuse("its packed workdir is not one orch made (workdir-HASH.tar in its cache)")
    cmd.workdir_tar = str(Path(cache) / Path(cmd.workdir_tar).name)
    return cmd


def prepare(cmd: CommandSpec, home: Path, say) -> CommandSpec:
    """The workdir packed into orch's cache (again, when the cache was cleaned since)."""
    from orchestrator.tasks import workdir

    return workdir.ready(cmd, Path(home) / "cache", say)  # the job's own content, or refused


def node_environment(cmd: CommandSpec, rank: int, ips: list[str], gpus: int, port: int | None,
                     checkpoint: str | None) -> dict[str, str]:
    """The user's env, then what orch tells every node (``nodes.node_env``: orch's names win)."""
    from orchestrator.nodes import node_env

    env = dict(cmd.env)
    env.update(node_env(rank, ips, gpus, master_port=port))
    if checkpoint:
        env["ORCH_CHECKPOINT_DIR"] = checkpoint
    return env


def secret_source(orch, job):
    """Where a job's secrets are read at a launch: a schedule's run, from what was stored for that
    schedule alone (``schedule_secrets``), never the environment of the reaper that relaunches it
    (the keys it rents with); any other job, this process's environment."""
    import os

    from orchestrator.schedules import schedule_secrets
    from orchestrator.jobs.handed import handed

    given = handed(job)  # its submission's (a schedule's run, at its first launch)
    if given is not None:
        return given
    stored = schedule_secrets.of_jobs(orch.ledger, orch.home, [job.id]) if job is not None else None
    return stored if stored is not None else os.environ


def launch(orch, nodes: list, cmd: CommandSpec, restore_from: Path | None, kept: frozenset = frozenset(),
           reuse_workdir: bool = False, job=None, allowed: frozenset = frozenset(), environ=None):
    """Start the command on every node of a ready group (one machine: a group of one), ranks in
    the nodes' order: the workdir up and the checkpoint folder restored on each (in parallel),
    a port free on the head, then every node started. A node in ``kept`` (a survivor of a lost
    peer) keeps its workdir as the command left it (downloads, caches) and skips ``setup``, which
    succeeded there; ``reuse_workdir`` (`orch exec` without a workdir) keeps every node's as it is.
    Every node also finds who the run is (``nodes.run_env``: ``job``'s id as SkyPilot's task id,
    the same at each relaunch; without a job, `orch exec`, one id per exec) and an MPI hostfile.
    Returns the head's run row (running); a node that could not start ends the
    others' commands before the error goes on. The secrets are read from ``environ`` (this
    process's by default), none of orch's own credentials but those in ``allowed``."""
    from orchestrator.provider import credentials
    from orchestrator import parallel as par
    from orchestrator.ssh import remote
    from orchestrator.tasks import task
    from orchestrator.volumes import volume_mounts
    from orchestrator.kill_points import kill_point
    from playbooks import command, host
    from playbooks import runs as run_tasks

    credentials.stored(cmd.secrets, allowed, "the job's command")  # a row from a shared ledger too
    secrets = task.secret_values(cmd.secrets, environ)  # refused before anything is written
    prepare(cmd, orch.home, orch.say)
    size, head = len(nodes), nodes[0]

    def stage(rank: int) -> dict:
        node = nodes[rank]
        with orch.connect(node) as c:
            work = host.workdir(c)
            cwd = command.task_dir(c) if node.id in kept or reuse_workdir else \
                command.upload_workdir(c, Path(cmd.workdir_tar) if cmd.workdir else None)
            if reuse_workdir:  # a machine no command ran on yet has none
                remote.run(c, f"mkdir -p {_q(cwd)}")
            ckpt = f"{cwd}/{cmd.checkpoint}" if cmd.checkpoint else None
            restored = None
            if ckpt and restore_from is not None:
                restored = command.restore(c, restore_from, ckpt)
            elif ckpt:
                remote.run(c, f"mkdir -p {_q(ckpt)}")
            ip = node.private_ip if size > 1 and is_plain_ip(node.private_ip) else \
                command.private_ip(c, node.ssh_host if is_plain_ip(node.ssh_host) else "127.0.0.1")
        return {"work": work, "cwd": cwd, "ckpt": ckpt, "ip": ip, "restored": restored}

    orch.say("      uploading the workdir" + (f" to {size} nodes" if size > 1 else "") if cmd.workdir
             else "      the workdir as the last command left it" if reuse_workdir else "      an empty workdir")
    staged = _all(nodes, par.each(stage, list(range(size)), size), "staging")
    if restore_from is not None and cmd.checkpoint:
        orch.say(f"      checkpoint folder restored: {staged[0]['restored']} file(s) from {restore_from}"
                 + (" on every node" if size > 1 else ""))
    ips = [s["ip"] for s in staged]
    with orch.connect(head) as c:
        port = run_tasks.free_port(c, ips[0]) if size > 1 else run_tasks.free_port(c, "127.0.0.1")
    gpus = 0 if head.cpu_only else (head.gpus or 1)
    runs: list = [None] * size
    who = _who(job, head, size)
    hosts = mpi_hostfile(ips, gpus)

    def start(rank: int) -> int:
        node, s = nodes[rank], staged[rank]
        env = node_environment(cmd, rank, ips, gpus, port, s["ckpt"])
        env.update(volume_mounts.env(orch, node, cmd.env, cmd.secrets))  # ORCH_VOLUMES, HF_HOME on the volume
        run = orch.ledger.add_run(instance_id=node.id, model="command", data=cmd.workdir or "-",
                                  data_bytes=cmd.workdir_bytes, epochs=0, gpu_name=node.gpu_name, state="starting")
        run_dir = f"{s['work']}/runs/r{run.id}"
        hostfile = f"{run_dir}/mpi/hostfile"
        env.update(run_env(replace(who, node=node.id), s["cwd"], cmd.workdir, hostfile))
        with orch.connect(node) as c:
            kill_point("before-train")
            remote.put_text(c, hosts, hostfile, 0o644)
            pid = command.start(c, run_dir, s["cwd"], None if node.id in kept else cmd.setup, cmd.run, env, secrets,
                                cmd.preempt_signal)
        runs[rank] = orch.ledger.update_run(run.id, run_dir=run_dir, pid=pid, state="running", ended_at=None,
                                            args=json.dumps({"kind": "command", "node_rank": rank, "secrets": cmd.secrets},
                                                           sort_keys=True))
        orch.ledger.note(node.id, f"command started: pid {pid}" + (f", node {rank} of {size}" if size > 1 else "")
                         + (" (checkpoint folder restored)" if restore_from else ""), orch.actor)
        return pid

    outcomes = par.each(start, list(range(size)), size)
    if any(e is not None for _, e in outcomes) and size > 1:
        from orchestrator.runs.runs import stop

        stop(orch, nodes)  # a half-started group would wait for its missing nodes for ever
    pids = _all(nodes, outcomes, "starting the command")
    run = runs[0]
    orch.say(f"      command started, pid {pids[0]}, run {run.run_dir}" if size == 1 else
             f"      command started on {size} nodes (pids {', '.join(map(str, pids))}); head {ips[0]}:{port}")
    return run


def _who(job, head, size: int):
    """Who the run is (``nodes.Run``): the job's id and name; without a job (`orch exec`), one new
    id for this exec and the machine's name."""
    import secrets as random

    cluster = (head.group_name or head.name) if size > 1 else head.name
    if job is not None:
        return Run(job.id, job.name, head.id, cluster, head.provider)
    return Run(f"exec-{random.token_hex(6)}", cluster, head.id, cluster, head.provider)


def _all(nodes: list, outcomes: list, what: str) -> list:
    """``parallel.each``'s results, or the lowest rank's failure raised as the group's."""
    from orchestrator.runs.runs import raise_first

    raise_first(nodes, outcomes, what)
    return [r for r, _ in outcomes]


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def exit_code(raw_status) -> int | None:
    code = raw_status.get("exit_code") if isinstance(raw_status, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) and -1 <= code <= 1024 else None


def read(orch, inst, run) -> dict:
    """The command's state as ``runs.read`` gives a training's, with ``exit_code`` and ``phase``.
    On a group, every node's command counts: the job completes when each exited 0, and fails on the
    first node (lowest rank) that exited otherwise, named with its rank and its log's last lines."""
    from orchestrator.runs import runs
    from playbooks import runs as run_tasks

    with orch.connect(inst) as c:
        raw = run_tasks.status(c, run.run_dir, run.pid)
    view = runs.digest(orch, run, raw)
    _exit_of(orch, run, raw, view)
    if view["exit_code"] not in (0, None):
        return view
    others = _other_nodes(orch, inst)  # one machine has none
    if view["exit_code"] == 0 and others["running"]:
        view["state"] = "running"  # the head is done; the job waits for every node
    if others["failed"] is not None:
        rank, code, phase, tail = others["failed"]
        view.update(state="failed", exit_code=code, phase=phase, node_rank=rank, node_tail=tail)
    return view


def _exit_of(orch, run, raw, view: dict) -> None:
    st = raw.get("status") if isinstance(raw, dict) else None
    view["exit_code"] = exit_code(st)
    phase = st.get("phase") if isinstance(st, dict) else None
    view["phase"] = phase if phase in ("setup", "run") else None
    if view["exit_code"] is not None:
        record_exit(orch, run, view["exit_code"], view["phase"])


def _other_nodes(orch, head) -> dict:
    """Every other node's command: whether any still runs, and the lowest rank that exited non-zero
    (rank, code, phase, its log's last lines). A node that cannot be read is left to the loss check
    (``jobs.group.lost_node``)."""
    from orchestrator import states
    from orchestrator.instances import groups
    from orchestrator.errors import SSHError
    from playbooks import runs as run_tasks

    running, failed = False, None
    for node in groups.members(orch.ledger, head):
        if node.id == head.id or node.state != states.READY:
            continue
        run = orch.ledger.latest_run(node.id)
        if run is None or not run.run_dir:
            running = True
            continue
        try:
            with orch.connect(node) as c:
                raw = run_tasks.status(c, run.run_dir, run.pid)
                view: dict = {}
                _exit_of(orch, run, raw, view)
                tail = run_tasks.tail_log(c, 40) if view["exit_code"] not in (0, None) else ""
        except SSHError:
            running = True
            continue
        if view["exit_code"] is None:
            running = True
        elif view["exit_code"] != 0 and failed is None:
            secrets = row_json(run.args, {}).get("secrets") or []  # its secrets hidden, or no line kept
            failed = (node.node_rank, view["exit_code"], view["phase"], tail_lines(tail, secrets))
    return {"running": running, "failed": failed}


def record_exit(orch, run, code: int, phase: str | None) -> None:
    """The exit code on the run row (its args), where `orch jobs show` finds it after the instance is gone."""
    args = {**row_json(run.args, {}), "kind": "command", "exit_code": code, "phase": phase}  # its secrets' names kept
    if run.args != json.dumps(args, sort_keys=True):
        orch.ledger.update_run(run.id, args=json.dumps(args, sort_keys=True))


def recorded_exit(run) -> tuple[int | None, str | None]:
    try:
        args = json.loads(run.args) if run is not None and run.args else {}
    except ValueError:
        return None, None
    if not isinstance(args, dict):
        return None, None
    phase = args.get("phase")
    return exit_code(args), phase if phase in ("setup", "run") else None


# -- files from the instance ------------------------------------------------------------------
def listed(entries, prefixes: list[str] | None = None):
    """RunFiles from an instance's listing, each a plain relative path (under one of ``prefixes``)."""
    from playbooks.pull import RunFile

    take = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            rel, size, mtime = entry
        except (TypeError, ValueError):
            continue
        if not (isinstance(rel, str) and 0 < len(rel) <= 4096 and isinstance(size, int) and not isinstance(size, bool)
                and 0 <= size <= MAX_FILE and isinstance(mtime, (int, float)) and not isinstance(mtime, bool)):
            continue
        if rel != posixpath.normpath(rel) or rel.startswith(("/", "../")) or rel == ".." or \
                any(not ch.isprintable() for ch in rel) or rel.split("/")[-1].startswith(".orch-pull"):
            continue
        if prefixes is not None and not any(rel == p or rel.startswith(p + "/") for p in prefixes):
            continue
        take.append(RunFile(rel, size, float(mtime)))
    return take


def pull_outputs(orch, inst, cmd: CommandSpec, dest: Path, strict: bool = True) -> tuple[list[str], list[str]]:
    """The outputs home into ``dest``, verified; (pulled now, declared outputs not found)."""
    from playbooks import command
    from playbooks import pull as pulling

    if not cmd.outputs:
        return [], []
    with claims.hold(orch.ledger, inst.name, wait=PULL_WAIT_S):
        with orch.connect(inst) as c:
            root = command.task_dir(c)
            info = command.listing(c, root, cmd.outputs)
            files = listed(info.get("files"), cmd.outputs)
            got = pulling.pull(c, root, files, Path(dest), log=lambda m: None, strict=strict)
    missing = [m for m in info.get("missing") or [] if m in cmd.outputs]
    return got, missing


def snapshot(orch, inst, cmd: CommandSpec, dest: Path) -> tuple[bool, str | None]:
    """The checkpoint folder copied aside on the instance, intact, and pulled home verified into
    ``dest`` (replaced whole); (True, None), or (False, why not)."""
    from playbooks import command
    from playbooks import pull as pulling

    with claims.try_hold(orch.ledger, inst.name) as mine:
        if not mine:
            return False, None  # another orch process works on the instance: the next look
        with orch.connect(inst) as c:
            from playbooks import host

            snap = f"{host.workdir(c)}/job-checkpoint"
            info = command.snapshot(c, command.task_dir(c), cmd.checkpoint, snap)
            if info.get("changed"):
                return False, f"{cmd.checkpoint} changed while it was copied: not kept, the next look copies again"
            files = listed(info.get("files"))
            if not files:
                return False, f"no checkpoint folder {cmd.checkpoint} (or an empty one) on {inst.name} yet"
            part = dest.with_name(dest.name + ".part")
            shutil.rmtree(part, ignore_errors=True)
            pulling.pull(c, snap, files, part, log=lambda m: None, strict=True)
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    return True, None


def due(last_iso: str | None, minutes: float, now: datetime | None = None) -> bool:
    if not last_iso:
        return True
    try:
        last = datetime.fromisoformat(last_iso)
    except (TypeError, ValueError):
        return True
    now = now or datetime.now(timezone.utc)
    return (now - last).total_seconds() >= minutes * 60


NODE_LOG_BYTES = 2 << 20  # of each other node's log: its end, where a failure shows


def node_logs(orch, head, dest: Path, secret_names) -> list[str]:
    """Every other node's log (its last ``NODE_LOG_BYTES``) home beside the head's, for ``orch jobs
    logs NAME --node R`` once the group is gone; secret values hidden. A node that does not answer
    is skipped (its log goes with it)."""
    from orchestrator import states
    from orchestrator.instances import groups
    from orchestrator.ssh import remote
    from orchestrator.tasks.task import held_secrets
    from orchestrator.text import redact

    got = []
    values, missing = held_secrets(secret_names)
    if missing:  # a log may show a secret this process could not hide
        return got
    for node in groups.members(orch.ledger, head):  # one machine has no other node
        run = orch.ledger.latest_run(node.id)
        if node.id == head.id or node.state != states.READY or run is None or not run.run_dir:
            continue
        try:
            with orch.connect(node) as c:
                text = remote.run(c, f"tail -c {NODE_LOG_BYTES} {_q(run.run_dir + '/train.log')} 2>/dev/null",
                                  check=False)
        except OrchError:
            continue
        path = node_log(dest, node.node_rank or 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(redact(text, values) or "", errors="replace")
        got.append(path.name)
    return got


class CommandKind(JobKind):
    key = "command"
    spec_type = CommandSpec
    noun = "command"
    doing = "running"

    def prepare(self, orch, js, disk_given: bool):
        prepare(self.spec, orch.home, orch.say)
        return js

    def refused(self, orch, job) -> str | None:
        """A stored command naming one of orch's own credentials that no one handed to it on this
        machine (``--allow-secret``, recorded at home): a row written into a shared ledger never
        gets the keys of whoever relaunches it."""
        from orchestrator.provider import credentials
        from orchestrator.errors import UsageError

        try:
            credentials.stored(self.spec.secrets, allowed_secrets(orch.home, job), "its stored command")
        except UsageError as e:
            return _why(e)
        return None

    @classmethod
    def check_stored(cls, spec, cache: Path):
        check_stored(spec, cache)

    def secrets(self) -> list[str]:
        return list(self.spec.secrets)

    def copies_kept(self) -> int:
        return self.spec.keep_checkpoints if self.spec.checkpoint else 0

    def blocked(self, orch=None, job=None) -> str | None:
        import os

        environ = secret_source(orch, job) if orch is not None else os.environ
        missing = [n for n in self.spec.secrets if not environ.get(n)]
        if not missing:
            return None
        if environ is not os.environ:
            return f"secret {', '.join(missing)} is not stored for its schedule (`orch schedule add --replace`)"
        return f"waiting for an orch process with {', '.join(missing)} in its environment"

    # -- an attempt ----------------------------------------------------------------------------
    def launch(self, orch, job, nodes: list, copy: int | None, kept: frozenset = frozenset()) -> Launched:
        src = checkpoint_dir(orch.home, job.name, copy) if copy else None
        start = copy if src is not None and src.is_dir() else None
        run = launch(orch, nodes, self.spec, src if start else None, kept, job=job,
                     allowed=allowed_secrets(orch.home, job), environ=secret_source(orch, job))
        return Launched(run, start, f"checkpoint folder restored from copy {start}" if start is not None else "started")

    def read(self, orch, inst, run) -> dict:
        return read(orch, inst, run)

    def watch(self, orch, job, inst, run, view: dict) -> None:
        """Its log and status home; every checkpoint_minutes, the checkpoint folder and the outputs so far."""
        from orchestrator.runs import runs

        try:
            runs.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), view=view, only_milestones=True)
        except OrchError as e:
            note_once(orch, job, f"log not pulled this time: {_why(e)}", inst.name, say=False)
        cmd = self.spec
        if not cmd.checkpoint or not due(row_json(job.phases, {}).get("checkpoint_at"), cmd.checkpoint_minutes):
            return
        try:
            _, problem = self._take(orch, job, inst)
            self._outputs(orch, job, inst, weights_dir(orch.home, job.name), strict=False, warn=False)
        except OrchError as e:
            problem = _why(e)
        if problem:  # once per attempt: the next look tries again, and says nothing new
            note_once(orch, job, f"no checkpoint copy this time: {problem}", inst.name, say=False)

    def due_in(self, job) -> float | None:
        """Seconds until the checkpoint folder's next copy is due, so that whoever watches
        (``watcher``) looks then: after a look that took none (none there yet, or it changed while
        copied), one ``checkpoint_minutes`` later. None without a checkpoint folder."""
        if not self.spec.checkpoint:
            return None
        every = self.spec.checkpoint_minutes * 60
        try:
            last = datetime.fromisoformat(row_json(job.phases, {}).get("checkpoint_at") or "")
        except (TypeError, ValueError):
            return every
        left = every - (datetime.now(timezone.utc) - last).total_seconds()
        return left if left > 0 else every

    def take_checkpoint(self, orch, job, inst, run) -> tuple[str | None, str | None]:
        from orchestrator.runs import runs

        runs.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), only_milestones=True)
        number, problem = self._take(orch, job, inst)
        return (f"took the checkpoint folder (copy {number}) from {inst.name}" if number else None), problem

    def _take(self, orch, job, inst) -> tuple[int | None, str | None]:
        """The checkpoint folder home as copy K+1 (jobs/NAME/ckpt-K+1; once it is in, the copies
        older than the newest ``keep_checkpoints``, at least one, are dropped); (K+1, None), or
        (None, why not)."""
        cmd = self.spec
        if not cmd.checkpoint:
            return None, None
        old = orch.ledger.get_job(job.id).checkpoint_epoch
        number = (old or 0) + 1
        ok, problem = snapshot(orch, inst, cmd, checkpoint_dir(orch.home, job.name, number))
        if not ok:  # the next look tries again (a folder being written, or none yet)
            return None, problem
        phases = row_json(orch.ledger.get_job(job.id).phases, {})
        phases["checkpoint_at"] = datetime.now(timezone.utc).isoformat()  # a string: phases() sums numbers only
        orch.ledger.update_job(job.id, phases=json.dumps(phases), checkpoint_epoch=number)
        for k in copies(orch.home, job.name)[:-max(cmd.keep_checkpoints, 1)]:
            shutil.rmtree(checkpoint_dir(orch.home, job.name, k), ignore_errors=True)
        return number, None

    def _outputs(self, orch, job, inst, dest: Path, strict: bool = True, warn: bool = True) -> list[str]:
        """The outputs so far home; ``warn``: say those missing (at the end: while the command runs,
        an output written only at its end is not missing yet, and each copy said it was)."""
        got, missing = pull_outputs(orch, inst, self.spec, dest, strict=strict)
        if missing and warn:  # said once per attempt
            note_once(orch, job, f"output(s) not found on {inst.name}: {', '.join(clean(m, 100) for m in missing)}",
                      inst.name)
        return got

    def bring_home(self, orch, job, inst, run, dest: Path, view: dict | None = None, strict: bool = True) -> list[str]:
        from orchestrator.runs import runs

        got, _ = runs.pull(orch, inst, run, dest=dest, view=view)
        got += node_logs(orch, inst, dest, self.spec.secrets)
        if self.spec.checkpoint:  # the folder as the command left it: the copy kept after the job
            try:
                _, problem = self._take(orch, job, inst)
            except OrchError as e:
                problem = _why(e)
            if problem:
                note_once(orch, job, f"no last checkpoint copy: {problem}", inst.name, say=False)
        return got + self._outputs(orch, job, inst, dest, strict=strict)

    def final(self, view: dict) -> str | None:
        if view.get("state") != "failed":
            return None
        code, phase = view.get("exit_code"), view.get("phase") or "run"
        what = f"{phase} exited {code if code is not None else '?'}"
        if view.get("node_rank"):  # another node than the head: its rank, and its own log's last lines
            return f"node {view['node_rank']}: {what}" + (f"; its last lines: {view['node_tail']}"
                                                          if view.get("node_tail") else "")
        return what

    def failure_detail(self, dest: Path) -> str:
        tail = log_tail(dest / "train.log", self.spec.secrets)  # its secrets hidden, or no line kept
        return f"last lines: {tail}" if tail else ""

    def completed(self, job, how: str, dest: Path, ended: str) -> tuple[str, dict]:
        return f"exit code 0; {how}; outputs in {dest}; {ended}", {"weights": str(dest)}

    # -- what `orch jobs` shows of it ------------------------------------------------------------
    results = "outputs"

    def view(self, orch, job, run) -> dict:
        """Its command, its run's state, exit code and elapsed time."""
        from orchestrator.jobs.record import utc
        from orchestrator.jobs.states import ENDED

        code, phase = recorded_exit(run)
        elapsed = None
        if run is not None:
            end = utc(run.ended_at) or (utc(job.ended_at) if job.state in ENDED else datetime.now(timezone.utc))
            elapsed = max(round((end - utc(run.started_at)).total_seconds(), 1), 0.0)
        text = "\n".join(clean(line, 500) or "" for line in str(self.spec.run or "").splitlines()[:50])
        state = run.state if run else None
        if state in ("starting", "running") and code is None and job.state in ENDED:
            state = "ended with its machine"  # a failed group's head, ended for another node's failure
        return {"command": text, "run_state": state, "exit_code": code, "exit_phase": phase,
                "elapsed_s": elapsed, "outputs": list(self.spec.outputs), "checkpoint": self.spec.checkpoint}

    @staticmethod
    def show(d: dict) -> list[str]:
        lines = [line for line in (d.get("command") or "").splitlines() if line.strip()]
        out = [f"  command  {clean(lines[0] if lines else '', 200)}"
               + (f" (+{len(lines) - 1} line(s))" if len(lines) > 1 else "")]
        state = d.get("run_state") or "-"
        if d.get("exit_code") is not None:
            state += f", exit code {d['exit_code']}" + (f" in {d['exit_phase']}" if d.get("exit_phase") else "")
        if d.get("elapsed_s") is not None:
            state += f", {_duration(d['elapsed_s'])} elapsed"
        out.append(f"  run      {state}")
        if d.get("outputs"):
            out.append(f"  outputs  {', '.join(d['outputs'])}")
        if d.get("checkpoint"):
            copy = d.get("checkpoint_epoch")
            out.append(f"  checkpoint {d['checkpoint']}" + (f": copy {copy} at home" if copy and d["state"] != "completed"
                                                             else ""))
        return out

    @staticmethod
    def progress(d: dict) -> str:
        return f"exit {d['exit_code']}" if d.get("exit_code") is not None else (d.get("run_state") or "-")

    @staticmethod
    def wait_parts(d: dict) -> list[str]:
        parts = [f"command {d['run_state']}" + (f" (exit {d['exit_code']})" if d.get("exit_code") is not None else "")
                 + (f", {d['elapsed_s']:.0f} s" if d.get("elapsed_s") is not None else "")] if d.get("run_state") else []
        return parts + JobKind.wait_parts(d)

    def node_view(self, job, run) -> dict:
        return {"exit_code": recorded_exit(run)[0] if run is not None else None, "epoch": None}

    # -- outside a job (`orch exec`: the command on a machine of yours, nothing rented or relaunched)
    def start(self, orch, nodes: list, allowed: frozenset = frozenset()):
        """The command started on ready machines with no job (the workdir the last command left
        where it brings none); the head's run row."""
        return launch(orch, nodes, self.spec, None, reuse_workdir=self.spec.workdir is None, allowed=allowed)

    def fetch(self, orch, head, where: Path) -> list[str]:
        """Beside the head's pulled log: the other nodes' logs and the outputs, home (verified); the
        declared outputs not found."""
        node_logs(orch, head, where, self.spec.secrets)  # a group's other nodes: train.nodeR.log
        if not self.spec.outputs:
            return []
        return pull_outputs(orch, head, self.spec, where, strict=False)[1]


    def plan_lines(self, name: str) -> list[str]:
        cmd, out = self.spec, []
        for key, script in (("setup", cmd.setup), ("run", cmd.run)):
            for i, line in enumerate((script or "").strip().splitlines()[:20]):
                out.append(f"  {key if i == 0 else '':8} {clean(line, 200)}")
        if cmd.workdir:
            from orchestrator.tasks import workdir

            total, count = workdir.measure(Path(cmd.workdir), cmd.workdir_max_mb, "workdir")
            out.append(f"  workdir  {cmd.workdir}: {count} file(s), {total / 1e6:.2f} MB (cap {cmd.workdir_max_mb:g} MB)")
        else:
            out.append("  workdir  none: the command starts in an empty folder (workdir: in the file, repos: in a "
                       "dstack file, or --workdir DIR, to upload one)")
        if cmd.env:
            out.append(f"  env      {', '.join(sorted(cmd.env))}")
        if cmd.secrets:
            out.append(f"  secrets  {', '.join(cmd.secrets)} (read from this environment at launch, never stored)")
        if cmd.outputs:
            out.append(f"  outputs  {', '.join(cmd.outputs)} -> $ORCH_HOME/runs/{name}/")
        if cmd.checkpoint:
            out.append(f"  checkpoint {cmd.checkpoint}: copied home every {cmd.checkpoint_minutes:g} min, restored "
                       "before a relaunch ($ORCH_CHECKPOINT_DIR)")
        return out


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
