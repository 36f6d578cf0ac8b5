"""Fabric tasks for a training run: stage the data, start LibreYOLO detached, read its state, pull.

On the instance everything lives under ``$W/orch`` where ``$W`` is ``/workspace`` when the
provider mounts a persistent volume there (RunPod: only it survives a stop), else ``$HOME``.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from pathlib import Path

from fabric import task

from orchestrator import remote
from orchestrator.errors import OrchError

HERE = Path(__file__).parent


def workdir(c) -> str:
    cached = getattr(c, "_orch_work", None)
    if cached is None:
        out = remote.run(c, 'if [ -d /workspace ] && [ -w /workspace ]; then W=/workspace; else W="$HOME"; fi; '
                            'mkdir -p "$W/orch/data" "$W/orch/runs" "$W/orch/bin"; printf %s "$W/orch"')
        cached = c._orch_work = out.strip()
    return cached


def python(c) -> str:
    return remote.run(c, 'cat "$HOME/.orch/python"').strip()


def _upload_script(c, name: str) -> str:
    return remote.put_text(c, (HERE / name).read_text(), posixpath.join(workdir(c), "bin", name), 0o644)


def _json_line(out: str, marker: str) -> dict:
    for line in reversed(out.splitlines()):
        if line.startswith(marker):
            return json.loads(line[len(marker):].strip())
    raise OrchError(f"no {marker.strip()} line in the instance's answer: {out.strip()[-300:]}")


def put_module(c, name: str, source: str) -> str:
    """A Python module beside train_entry.py; returns the folder to put on sys.path."""
    folder = posixpath.join(workdir(c), "bin")
    remote.put_text(c, source, posixpath.join(folder, name), 0o600)
    return folder


@task
def ensure_hub_client(c) -> None:
    """huggingface_hub on the instance (LibreYOLO does not depend on it)."""
    py = shlex.quote(python(c))
    if remote.run(c, f"{py} -c 'import huggingface_hub' 2>/dev/null && echo ok", check=False).strip() != "ok":
        out = c.run(f"{py} -m pip --disable-pip-version-check -q install huggingface_hub", hide=True, warn=True)
        if not out.ok:
            raise OrchError(f"could not install huggingface_hub on the instance: {out.stderr.strip()[-200:]}")


@task
def stage_tar(c, local_tar: Path, name: str, log=print) -> str:
    """Upload a packed dataset over SFTP (resuming a partial upload) and extract it; returns data.yaml."""
    work = workdir(c)
    dest = f"{work}/data/{name}.tar"
    size = local_tar.stat().st_size
    sftp = c.sftp()
    try:
        have = sftp.stat(dest).st_size
    except OSError:
        have = 0
    if have != size:
        log(f"uploading {size / 1e6:.1f} MB of data" + (f" (resuming at {have / 1e6:.1f} MB)" if 0 < have < size else ""))
        with open(local_tar, "rb") as src, sftp.open(dest, "ab" if 0 < have < size else "wb") as out:
            if 0 < have < size:
                src.seek(have)
            else:
                have = 0
            out.set_pipelined(True)
            while chunk := src.read(1 << 20):
                out.write(chunk)
    from orchestrator.dataset import remote_extract_script

    script = remote.put_text(c, remote_extract_script(dest, f"{work}/data"), f"{work}/bin/extract.py")
    return _yaml_from(remote.run(c, f"{shlex.quote(python(c))} {script}"))


def _yaml_from(out: str) -> str:
    for line in reversed(out.strip().splitlines()):
        try:
            return json.loads(line)["data_yaml"]
        except (ValueError, KeyError, TypeError):
            continue
    raise OrchError(f"extracting the data on the instance printed no data.yaml: {out.strip()[-300:]}")


@task
def stage_hf(c, repo_id: str, filename: str, env: dict[str, str]) -> str:
    """Download a dataset tar from a Hugging Face dataset repo on the instance itself."""
    from orchestrator.hub import remote_download_script

    work = workdir(c)
    script = remote.put_text(c, remote_download_script(repo_id, filename, f"{work}/data"), f"{work}/bin/hf_data.py")
    env = {"HF_HOME": f"{work}/hf", **env}
    return _yaml_from(remote.run(c, f"{shlex.quote(python(c))} {script}", env=env))


@task
def start(c, spec: dict, env: dict[str, str]) -> int:
    """Start training detached: setsid + nohup, output to train.log, stdin from /dev/null. Returns the pid."""
    work = workdir(c)
    entry = _upload_script(c, "train_entry.py")
    run_json = remote.put_text(c, json.dumps(spec), f"{work}/bin/run-{spec['name']}.json")
    log = f"{work}/train.log"
    cmd = (f"cd {shlex.quote(work)} && setsid nohup {shlex.quote(python(c))} {entry} {run_json} "
           f"> {log} 2>&1 < /dev/null & echo $!")
    out = remote.run(c, cmd, env={"HF_HOME": f"{work}/hf", **env})
    return int(out.strip().splitlines()[-1])


@task
def status(c, run_dir: str, pid: int | None) -> dict:
    script = _upload_script(c, "run_status.py")
    out = remote.run(c, f"{shlex.quote(python(c))} {script} {shlex.quote(run_dir)} {pid or ''}")
    return _json_line(out, "ORCH_RUN ")


@task
def pull(c, run_dir: str, files: list, dest: Path, log=print) -> list[str]:
    """Bring files home, skipping what is already there unchanged and resuming partial copies.

    ``files`` is run_status's list of [relative path, size, mtime]. A file is written to
    ``name.part`` and renamed once complete, so ``dest`` never holds half a checkpoint.
    """
    sftp = c.sftp()
    manifest_path = dest / ".orch-pull.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    got = []
    for rel, size, mtime in files:
        target = dest / rel
        if manifest.get(rel) == [size, mtime] and target.exists() and target.stat().st_size == size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        partial = manifest.get(rel + ".part") == [size, mtime] and part.exists() and part.stat().st_size < size
        offset = part.stat().st_size if partial else 0
        with sftp.open(f"{run_dir}/{rel}", "rb") as src, open(part, "ab" if partial else "wb") as out:
            manifest[rel + ".part"] = [size, mtime]
            manifest_path.write_text(json.dumps(manifest))
            src.seek(offset)
            src.prefetch(max(size - offset, 0))
            while chunk := src.read(1 << 20):
                out.write(chunk)
        part.replace(target)
        manifest.pop(rel + ".part", None)
        manifest[rel] = [size, mtime]
        manifest_path.write_text(json.dumps(manifest))
        got.append(rel)
    if got:
        log(f"pulled {', '.join(got)} to {dest}")
    return got


@task
def tail_log(c, lines: int = 50) -> str:
    return remote.run(c, f"tail -n {int(lines)} {shlex.quote(workdir(c) + '/train.log')} 2>/dev/null", check=False)


@task
def start_monitor(c, run_dir: str, port: int = 8420, timeout: float = 90) -> int:
    """``libreyolo monitor`` on the instance (once); returns the port it listens on there.

    The port is read from what the monitor prints, not guessed: it moves to the next free one
    when a port is taken, and on the local provider the forward itself shares this machine's ports.
    """
    import re
    import time

    work = workdir(c)
    py = shlex.quote(python(c))
    known = remote.run(c, f"kill -0 $(cat {work}/monitor.pid 2>/dev/null) 2>/dev/null && cat {work}/monitor.port",
                       check=False).strip()
    if known.isdigit():
        return int(known)
    launcher = ("import sys; from libreyolo.cli import entrypoint; "
                "sys.argv = ['libreyolo'] + sys.argv[1:]; sys.exit(entrypoint())")
    remote.run(c, f"rm -f {work}/monitor.port; setsid nohup {py} -u -c {shlex.quote(launcher)} monitor "
                  f"{shlex.quote(run_dir)} --host 127.0.0.1 --port {int(port)} --no-browser > {work}/monitor.log 2>&1 "
                  f"< /dev/null & echo $! > {work}/monitor.pid")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = remote.run(c, f"cat {work}/monitor.log", check=False)
        m = re.search(r"running at http://[^:\s]+:(\d+)", log)
        if m:
            remote.run(c, f"echo {m.group(1)} > {work}/monitor.port")
            return int(m.group(1))
        if remote.run(c, f"kill -0 $(cat {work}/monitor.pid) 2>/dev/null || echo dead", check=False).strip():
            raise OrchError(f"libreyolo monitor exited on the instance: {log.strip()[-300:]}")
        time.sleep(1)
    raise OrchError(f"libreyolo monitor did not start within {timeout:.0f} s")
