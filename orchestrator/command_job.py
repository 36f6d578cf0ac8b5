"""A job of the command kind (a task file's ``run:``, or ``orch run NAME -- CMD``) from the
controller's side: what ``jobs`` asks of it where a training would stage data and read epochs.

The job engine is the same (``orchestrator.jobs``: plan, attempts, loss -> relaunch, caps,
completion); this module holds what differs, and writes nothing to the ledger but the run row:

- **launch**: the workdir up, the newest intact copy of the checkpoint folder restored into it
  (``ORCH_CHECKPOINT_DIR``), the node's environment (``nodes.node_env``), the secrets read from
  this process's environment, then ``command_entry.py`` detached (``playbooks/command``);
- **read**: the run's ``status.json`` through ``training.digest`` (running, completed, failed,
  crashed), with the command's exit code and the phase (setup or run) it ended in;
- **checkpoint**: every ``checkpoint_minutes``, the folder copied aside on the instance only when
  nothing in it changed during the copy (a file being written would be torn), then pulled home
  verified (``playbooks.pull``: checksums, never outside the destination);
- **outputs**: the declared paths under the workdir, pulled home with the same rules.
"""

from __future__ import annotations

import json
import posixpath
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path

from orchestrator import claims
from orchestrator.task import CommandSpec
from orchestrator.text import clean

MAX_FILE = 1 << 40
PULL_WAIT_S = 120.0


def prepare(cmd: CommandSpec, home: Path, say) -> CommandSpec:
    """The workdir packed into orch's cache (again, when the cache was cleaned since)."""
    from orchestrator import workdir

    if cmd.workdir and not (cmd.workdir_tar and Path(cmd.workdir_tar).is_file()):
        total, count = workdir.measure(Path(cmd.workdir), cmd.workdir_max_mb, "workdir")
        tar, size = workdir.pack(Path(cmd.workdir), Path(home) / "cache")
        cmd.workdir_tar, cmd.workdir_bytes = str(tar), size
        say(f"      workdir: {count} file(s), {total / 1e6:.2f} MB from {cmd.workdir}")
    return cmd


def node_environment(cmd: CommandSpec, ip: str, gpus: int, checkpoint: str | None) -> dict[str, str]:
    from orchestrator.nodes import node_env

    env = dict(cmd.env)
    env.update(node_env(0, [ip], gpus))
    if checkpoint:
        env["ORCH_CHECKPOINT_DIR"] = checkpoint
    return env


def launch(orch, inst, cmd: CommandSpec, restore_from: Path | None):
    """Start the command on a ready instance; returns the ledger's run row (running)."""
    from orchestrator import task
    from orchestrator.lifecycle import kill_point
    from playbooks import command, host

    secrets = task.secret_values(cmd.secrets)  # refused before anything is written
    prepare(cmd, orch.home, orch.say)
    with orch.connect(inst) as c:
        work = host.workdir(c)
        orch.say("      uploading the workdir" if cmd.workdir else "      an empty workdir")
        cwd = command.upload_workdir(c, Path(cmd.workdir_tar) if cmd.workdir else None)
        ckpt = f"{cwd}/{cmd.checkpoint}" if cmd.checkpoint else None
        if ckpt and restore_from is not None:
            count = command.restore(c, restore_from, ckpt)
            orch.say(f"      checkpoint folder restored: {count} file(s) from {restore_from}")
        elif ckpt:
            from orchestrator import remote

            remote.run(c, f"mkdir -p {_q(ckpt)}")
        ip = command.private_ip(c, inst.ssh_host if _is_ip(inst.ssh_host) else "127.0.0.1")
        env = node_environment(cmd, ip, 0 if inst.cpu_only else (inst.gpus or 1), ckpt)
        run = orch.ledger.add_run(instance_id=inst.id, model="command", data=cmd.workdir or "-",
                                  data_bytes=cmd.workdir_bytes, epochs=0, gpu_name=inst.gpu_name, state="starting")
        run_dir = f"{work}/runs/r{run.id}"
        kill_point("before-train")
        pid = command.start(c, run_dir, cwd, cmd.setup, cmd.run, env, secrets)
    run = orch.ledger.update_run(run.id, run_dir=run_dir, pid=pid, state="running", ended_at=None,
                                 args=json.dumps({"kind": "command"}, sort_keys=True))
    orch.ledger.note(inst.id, f"command started: pid {pid}" + (" (checkpoint folder restored)" if restore_from else ""),
                     orch.actor)
    orch.say(f"      command started, pid {pid}, run {run_dir}")
    return run


def _is_ip(value) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(str(value))
        return True
    except ValueError:
        return False


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def exit_code(raw_status) -> int | None:
    code = raw_status.get("exit_code") if isinstance(raw_status, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) and -1 <= code <= 1024 else None


def read(orch, inst, run) -> dict:
    """The command's state as ``training.read`` gives a training's, with ``exit_code`` and ``phase``."""
    from orchestrator import training
    from playbooks import train

    with orch.connect(inst) as c:
        raw = train.status(c, run.run_dir, run.pid)
    view = training.digest(orch, run, raw)
    st = raw.get("status") if isinstance(raw, dict) else None
    view["exit_code"] = exit_code(st)
    phase = st.get("phase") if isinstance(st, dict) else None
    view["phase"] = phase if phase in ("setup", "run") else None
    if view["exit_code"] is not None:
        record_exit(orch, run, view["exit_code"], view["phase"])
    return view


def record_exit(orch, run, code: int, phase: str | None) -> None:
    """The exit code on the run row (its args), where `orch jobs show` finds it after the instance is gone."""
    args = {"kind": "command", "exit_code": code, "phase": phase}
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


def log_tail(path: Path, lines: int = 10) -> str:
    """The last lines of a pulled log, printable, for a failure's reason."""
    try:
        data = Path(path).read_bytes()[-(64 << 10):].decode(errors="replace")
    except OSError:
        return ""
    kept = [clean(line, 300) or "" for line in data.splitlines() if line.strip() and not line.startswith("[orch] ")]
    kept = kept[-lines:]
    return " | ".join(kept)


def describe(cmd: CommandSpec) -> str:
    first = re.sub(r"\s+", " ", cmd.run.strip().splitlines()[0] if cmd.run.strip() else "")
    return clean(first, 120) + (" ..." if len(cmd.run.strip().splitlines()) > 1 else "")
