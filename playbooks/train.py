"""Fabric tasks for a LibreYOLO training: stage the data, start it detached, its monitor. A run's
status, log, rendezvous port and end are every kind's (``runs``).

On the instance everything lives under the work dir (``playbooks.host.workdir``): on the volume
where the provider has one, so the data and the runs survive a stop.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from fabric import task

from orchestrator.ssh import remote
from orchestrator.errors import OrchError
from playbooks import host


@task
def ensure_hub_client(c) -> None:
    """huggingface_hub on the instance (LibreYOLO does not depend on it)."""
    py = shlex.quote(host.python(c))
    if remote.run(c, f"{py} -c 'import huggingface_hub' 2>/dev/null && echo ok", check=False).strip() != "ok":
        out = c.run(f"{py} -m pip --disable-pip-version-check -q install huggingface_hub", hide=True, warn=True,
                    in_stream=False)
        if not out.ok:
            raise OrchError(f"could not install huggingface_hub on the instance: {out.stderr.strip()[-200:]}")


@task
def stage_tar(c, local_tar: Path, name: str, log=print, limits: tuple[int, int] | None = None) -> str:
    """Upload a packed dataset over SFTP (resuming a partial upload) and extract it; returns data.yaml."""
    work = host.workdir(c)
    dest = f"{work}/data/{name}.tar"
    _upload(c, local_tar, dest, log)
    args = [dest, f"{work}/data"] + [str(n) for n in (limits or ())]
    return host.script(c, "extract.py", *args)["data_yaml"]


def _upload(c, local_tar: Path, dest: str, log, fresh: bool = False) -> bool:
    """``local_tar`` to ``dest`` over SFTP, resuming a partial upload (``fresh``: from the start);
    whether anything was sent."""
    size = local_tar.stat().st_size
    sftp = c.sftp()
    try:
        have = 0 if fresh else sftp.stat(dest).st_size
    except OSError:
        have = 0
    if have == size:
        return False
    log(f"uploading {size / 1e6:.1f} MB of data" + (f" (resuming at {have / 1e6:.1f} MB)" if 0 < have < size else ""))
    with open(local_tar, "rb") as src, sftp.open(dest, "ab" if 0 < have < size else "wb") as out:
        if 0 < have < size:
            src.seek(have)
        out.set_pipelined(True)
        while chunk := src.read(1 << 20):
            out.write(chunk)
    return True


@task
def staged_report(c, dest: str, sizes: dict[str, int], cap: int, data_yaml: str, out: str) -> dict:
    """What the staged dataset's folder ``dest`` holds now (``on_instance/staged.py report``): the
    instance's word, for the controller to check (``staged_data``); ``sizes``: the record's, so that
    only the files it lists are hashed there. Its ``data_yaml`` is pointed to ``out`` in the same
    run (used only where the folder is the record's)."""
    import secrets

    listed = remote.put_text(c, json.dumps(sizes), f"{host.workdir(c)}/bin/staged.{secrets.token_hex(4)}.json")
    return host.script(c, "staged.py", "report", dest, listed, str(int(cap)), data_yaml, out)  # removes ``listed``


@task
def restage(c, local_tar: Path, tar: str, dest: str, digest: str, log=print,
            limits: tuple[int, int] | None = None) -> bool:
    """The dataset's folder ``dest`` made again from its tar on the volume, uploaded first unless
    the one there has ``digest``; whether it was uploaded. The folder is left as the tar holds it
    (its data.yaml is pointed from a copy beside it: ``point_staged``)."""
    data_dir = tar.rsplit("/", 1)[0]
    old = dest + ".manifest.json"  # where an orch before the ledger's record kept one
    remote.run(c, f"mkdir -p {shlex.quote(data_dir)} && rm -rf {shlex.quote(dest)} {shlex.quote(old)}")
    sent = False if host.script(c, "staged.py", "tar", tar, digest).get("tar_ok") is True else \
        _upload(c, local_tar, tar, log, fresh=True)
    host.script(c, "staged.py", "unpack", tar, dest, digest if sent else "-", *[str(n) for n in (limits or ())])
    return sent


@task
def point_staged(c, dest: str, rel: str, out: str) -> str:
    """The staged dataset's data.yaml ``rel`` (inside ``dest``, or refused there) pointed at the
    folder as it is mounted now, written to ``out``; returns ``out``."""
    return host.script(c, "staged.py", "point", dest, rel, out)["data_yaml"]


@task
def stage_hf(c, repo_id: str, filename: str, env: dict[str, str], limits: tuple[int, int] | None = None) -> str:
    """Download a dataset tar from a Hugging Face dataset repo on the instance itself."""
    work = host.workdir(c)
    args = [repo_id, filename, f"{work}/data"] + [str(n) for n in (limits or ())]
    return host.script(c, "hf_download.py", *args, env={"HF_HOME": f"{work}/hf", **env})["data_yaml"]


@task
def start(c, spec: dict, env: dict[str, str], launcher: list[str] | None = None) -> int:
    """Start training detached (see ``host.detach``), output to train.log. Returns the pid.
    ``launcher``: Python arguments that run the entry under a launcher (``-m torch.distributed.run
    ...`` on each node of a group); the pid is then the launcher's, which ends its workers."""
    work = host.workdir(c)
    entry = host.upload(c, "train_entry.py")
    host.upload(c, "hub_push.py")
    host.upload(c, "preempt_save.py")  # train_entry imports both
    run_json = remote.put_text(c, json.dumps(spec), f"{work}/bin/run-{spec['name']}.json")
    remote.run(c, f": > {shlex.quote(work + '/train.log')}")  # this run's log, not the last one's
    return host.detach(c, [host.python(c), *(launcher or []), entry, run_json], f"{work}/train.log", cwd=work,
                       env={"HF_HOME": f"{work}/hf", **env})




@task
def start_monitor(c, run_dir: str, port: int = 8420, timeout: float = 90) -> int:
    """``libreyolo monitor`` on the instance (once); returns the port it listens on there.

    The port is read from what the monitor prints, not guessed: it moves to the next free one
    when a port is taken, and on the local provider the forward itself shares this machine's ports.
    """
    import re
    import time

    work = host.workdir(c)
    q = shlex.quote
    pid_file, port_file, log = q(f"{work}/monitor.pid"), q(f"{work}/monitor.port"), f"{work}/monitor.log"
    known = remote.run(c, f"kill -0 $(cat {pid_file} 2>/dev/null) 2>/dev/null && cat {port_file}", check=False).strip()
    if known.isdigit():
        return int(known)
    launcher = ("import sys; from libreyolo.cli import entrypoint; "
                "sys.argv = ['libreyolo'] + sys.argv[1:]; sys.exit(entrypoint())")
    remote.run(c, f"rm -f {port_file}; : > {q(log)}")
    pid = host.detach(c, [host.python(c), "-u", "-c", launcher, "monitor", run_dir, "--host", "127.0.0.1",
                          "--port", str(int(port)), "--no-browser"], log)
    remote.put_text(c, f"{pid}\n", f"{work}/monitor.pid", 0o644)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = remote.run(c, f"cat {q(log)}", check=False)
        m = re.search(r"running at http://[^:\s]+:(\d+)", text)
        if m:
            remote.put_text(c, f"{m.group(1)}\n", f"{work}/monitor.port", 0o644)
            return int(m.group(1))
        if remote.run(c, f"kill -0 {pid} 2>/dev/null || echo dead", check=False).strip():
            raise OrchError(f"libreyolo monitor exited on the instance: {text.strip()[-300:]}")
        time.sleep(1)
    raise OrchError(f"libreyolo monitor did not start within {timeout:.0f} s")
