"""The command kind: a task file's ``run:``, or ``orch run NAME -- CMD``.

- **launch**: the workdir up, the newest intact copy of the checkpoint folder restored into it
  (``ORCH_CHECKPOINT_DIR``), the node's environment (``nodes.node_env``), the secrets read from
  this process's environment, then ``command_entry.py`` detached (``playbooks/command``);
- **read**: the run's ``status.json`` through ``training.digest``, with the command's exit code
  and the phase (setup or run) it ended in: a non-zero exit is the command's own, never relaunched;
- **checkpoint**: every ``checkpoint_minutes``, the folder copied aside on the instance only when
  nothing in it changed during the copy (a file being written would be torn), then pulled home
  verified (``playbooks.pull``: checksums, never outside the destination);
- **outputs**: the declared paths under the workdir, pulled home with the same rules.
"""

from __future__ import annotations

import json
import posixpath
import shutil
from datetime import datetime, timezone
from pathlib import Path

from orchestrator import claims
from orchestrator.errors import OrchError
from orchestrator.jobs.kinds.base import JobKind, Launched
from orchestrator.jobs.record import checkpoint_dir, loads, note, weights_dir
from orchestrator.task import CommandSpec
from orchestrator.text import clean
from orchestrator.text import why as _why

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
    from orchestrator.kill_points import kill_point
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


class CommandKind(JobKind):
    key = "command"
    spec_type = CommandSpec
    noun = "command"
    doing = "running"
    provisioned = False

    def prepare(self, orch, js, disk_given: bool):
        prepare(self.spec, orch.home, orch.say)
        return js

    def blocked(self) -> str | None:
        import os

        missing = [n for n in self.spec.secrets if not os.environ.get(n)]
        if not missing:
            return None
        return f"waiting for an orch process with {', '.join(missing)} in its environment"

    # -- an attempt ----------------------------------------------------------------------------
    def launch(self, orch, job, nodes: list, copy: int | None) -> Launched:
        src = checkpoint_dir(orch.home, job.name, copy) if copy else None
        start = copy if src is not None and src.is_dir() else None
        run = launch(orch, nodes[0], self.spec, src if start else None)
        return Launched(run, start, f"checkpoint folder restored from copy {start}" if start is not None else "started")

    def read(self, orch, inst, run) -> dict:
        return read(orch, inst, run)

    def watch(self, orch, job, inst, run, view: dict) -> None:
        """Its log and status home; every checkpoint_minutes, the checkpoint folder and the outputs so far."""
        from orchestrator import training

        try:
            training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), view=view, only_milestones=True)
        except OrchError as e:
            note(orch, job, f"log not pulled this time: {_why(e)}", say=False)
        cmd = self.spec
        if not cmd.checkpoint or not due(loads(job.phases, {}).get("checkpoint_at"), cmd.checkpoint_minutes):
            return
        try:
            _, problem = self._take(orch, job, inst)
            self._outputs(orch, job, inst, weights_dir(orch.home, job.name), strict=False)
        except OrchError as e:
            problem = _why(e)
        if problem:
            note(orch, orch.ledger.get_job(job.id), f"no checkpoint copy this time: {problem}", say=False)

    def take_checkpoint(self, orch, job, inst, run) -> tuple[str | None, str | None]:
        from orchestrator import training

        training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), only_milestones=True)
        number, problem = self._take(orch, job, inst)
        return (f"took the checkpoint folder (copy {number}) from {inst.name}" if number else None), problem

    def _take(self, orch, job, inst) -> tuple[int | None, str | None]:
        """The checkpoint folder home as copy K+1 (jobs/NAME/ckpt-K+1, the older copy dropped once it
        is in); (K+1, None), or (None, why not)."""
        cmd = self.spec
        if not cmd.checkpoint:
            return None, None
        old = orch.ledger.get_job(job.id).checkpoint_epoch
        number = (old or 0) + 1
        ok, problem = snapshot(orch, inst, cmd, checkpoint_dir(orch.home, job.name, number))
        if not ok:  # the next look tries again (a folder being written, or none yet)
            return None, problem
        phases = loads(orch.ledger.get_job(job.id).phases, {})
        phases["checkpoint_at"] = datetime.now(timezone.utc).isoformat()  # a string: phases() sums numbers only
        orch.ledger.update_job(job.id, phases=json.dumps(phases), checkpoint_epoch=number)
        if old:
            shutil.rmtree(checkpoint_dir(orch.home, job.name, old), ignore_errors=True)
        return number, None

    def _outputs(self, orch, job, inst, dest: Path, strict: bool = True) -> list[str]:
        got, missing = pull_outputs(orch, inst, self.spec, dest, strict=strict)
        if missing:
            note(orch, job, f"output(s) not found on {inst.name}: {', '.join(clean(m, 100) for m in missing)}")
        return got

    def bring_home(self, orch, job, inst, run, dest: Path, view: dict | None = None, strict: bool = True) -> list[str]:
        from orchestrator import training

        got, _ = training.pull(orch, inst, run, dest=dest, view=view)
        return got + self._outputs(orch, job, inst, dest, strict=strict)

    def final(self, view: dict) -> str | None:
        if view.get("state") != "failed":
            return None
        code, phase = view.get("exit_code"), view.get("phase") or "run"
        return f"{phase} exited {code if code is not None else '?'}"

    def failure_detail(self, dest: Path) -> str:
        tail = log_tail(dest / "train.log")
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
        return {"command": text, "run_state": run.state if run else None, "exit_code": code, "exit_phase": phase,
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


    def plan_lines(self, name: str) -> list[str]:
        cmd, out = self.spec, []
        for key, script in (("setup", cmd.setup), ("run", cmd.run)):
            for i, line in enumerate((script or "").strip().splitlines()[:20]):
                out.append(f"  {key if i == 0 else '':8} {clean(line, 200)}")
        if cmd.workdir:
            from orchestrator import workdir

            total, count = workdir.measure(Path(cmd.workdir), cmd.workdir_max_mb, "workdir")
            out.append(f"  workdir  {cmd.workdir}: {count} file(s), {total / 1e6:.2f} MB (cap {cmd.workdir_max_mb:g} MB)")
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
