"""Fabric tasks for a command job (a task file's ``run:``): its workdir up, its checkpoint folder
restored, the command started detached, its files listed and snapshotted for a pull.

On the instance a task lives in ``$W/orch/task`` (the workdir, the command's working directory)
and its run in ``$W/orch/runs/rN`` (``status.json``, ``train.log``, the scripts), beside a
LibreYOLO run's: whatever reads a run (``orch status``, the watchdog, the reaper) reads a command.
"""

from __future__ import annotations

import json
import os
import shlex
import tarfile
import tempfile
from pathlib import Path

from fabric import task

from orchestrator.ssh import remote
from orchestrator.errors import OrchError
from playbooks import host

TASK_DIR = "task"


def task_dir(c) -> str:
    return f"{host.workdir(c)}/{TASK_DIR}"


def _put_tar(c, local_tar: Path, dest: str) -> int:
    """Upload a plain tar and unpack it under ``dest`` (``tree.py unpack``); returns the file count."""
    remote_tar = f"{host.workdir(c)}/bin/upload-{os.getpid()}.tar"
    c.sftp().put(str(local_tar), remote_tar)
    try:
        got = host.script(c, "tree.py", "unpack", remote_tar, dest)
    finally:
        remote.run(c, f"rm -f {shlex.quote(remote_tar)}", check=False)
    count = got.get("files")
    if not isinstance(count, int):
        raise OrchError("the instance did not unpack the upload")
    return count


@task
def upload_workdir(c, local_tar: Path | None) -> str:
    """A fresh workdir on the instance (the packed one, or an empty folder); returns its path."""
    dest = task_dir(c)
    remote.run(c, f"rm -rf {shlex.quote(dest)} && mkdir -p {shlex.quote(dest)}")
    if local_tar is not None:
        _put_tar(c, local_tar, dest)
    return dest


@task
def restore(c, local_folder: Path, dest: str) -> int:
    """The job's copy of a checkpoint folder, in place of ``dest`` on the instance; returns the file count."""
    q = shlex.quote
    remote.run(c, f"rm -rf {q(dest)} && mkdir -p {q(dest)}")
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "ckpt.tar"
        with tarfile.open(tar_path, "w") as tar:
            for path in sorted(Path(local_folder).rglob("*")):
                rel = path.relative_to(local_folder).as_posix()
                # the pull's own bookkeeping stays home
                if path.is_file() and not path.is_symlink() and not rel.startswith(".orch-pull") \
                        and not path.name.endswith(".part"):
                    tar.add(path, arcname=rel, recursive=False)
        return _put_tar(c, tar_path, dest)


@task
def private_ip(c, fallback: str) -> str:
    """The instance's own first address (what a rendezvous of its group listens on)."""
    from orchestrator.nodes import plain_ip

    out = remote.run(c, "hostname -I 2>/dev/null || true", check=False).split()
    for word in out:
        try:
            return plain_ip(word)  # what the instance printed: a plain IP literal, never a scope id
        except ValueError:
            continue
    return fallback


@task
def start(c, run_dir: str, cwd: str, setup: str | None, run: str, env: dict[str, str],
          secrets: dict[str, str], preempt_signal: str = "TERM") -> int:
    """Write the scripts and the spec into the run folder, and start ``command_entry.py`` detached,
    output to the run's train.log (``$W/orch/train.log`` points there, for `orch logs`). The
    secrets travel in ``host.detach``'s 0600 file, sourced and removed: never on a command line,
    never in the spec. Returns the pid."""
    q = shlex.quote
    work = host.workdir(c)
    entry = host.upload(c, "command_entry.py")
    remote.run(c, f"mkdir -p {q(run_dir)}")
    spec = {"run_dir": run_dir, "cwd": cwd, "env": env, "run": remote.put_text(c, run, f"{run_dir}/run.sh", 0o644),
            "preempt_signal": preempt_signal}
    spec["setup"] = remote.put_text(c, setup, f"{run_dir}/setup.sh", 0o644) if setup else None
    spec_path = remote.put_text(c, json.dumps(spec), f"{run_dir}/command.json", 0o644)
    log = f"{run_dir}/train.log"
    remote.run(c, f": > {q(log)} && ln -sfn {q(log)} {q(work + '/train.log')}")
    return host.detach(c, [host.python(c), entry, spec_path], log, cwd=cwd, env=secrets)


@task
def listing(c, root: str, rels: list[str]) -> dict:
    return host.script(c, "tree.py", "list", root, *rels)


@task
def snapshot(c, root: str, rel: str, dest: str) -> dict:
    return host.script(c, "tree.py", "snapshot", root, rel, dest)


@task
def log_since(c, log: str, offset: int, limit: int = 1 << 20) -> tuple[str, int]:
    """What a run's log gained since byte ``offset`` (at most ``limit`` bytes), and the offset after
    it: `orch exec` prints a command's output as it comes."""
    q = shlex.quote
    offset, limit = int(offset), int(limit)
    out = remote.run(c, f"s=$(stat -c %s {q(log)} 2>/dev/null || echo 0); n=$((s - {offset})); "
                        f"[ $n -lt 0 ] && n=0; [ $n -gt {limit} ] && n={limit}; echo $n; "
                        f"[ $n -gt 0 ] && tail -c +{offset + 1} {q(log)} | head -c $n", check=False)
    count, _, text = out.partition("\n")
    try:
        return text, offset + int(count.strip())
    except ValueError:
        return "", offset
