"""Fabric tasks for any run on an instance, whatever its kind: its status read, its log's tail, a
free port for a group's rendezvous, and its end. What starts a run is its kind's (``train``,
``command``); what it made comes home through ``pull``.

A run's log is ``train.log`` in the work dir (``host.workdir``) for every kind: a command's run
links it there (``command.start``), so `orch logs` and a failed node's tail read one place.
"""

from __future__ import annotations

import shlex

from fabric import task

from orchestrator.ssh import remote
from orchestrator.errors import OrchError
from playbooks import host


@task
def status(c, run_dir: str, pid: int | None) -> dict:
    """The run's ``status.json`` in ``run_dir`` and whether ``pid`` lives (``run_status.py``): the
    instance's word, which ``orchestrator.runs.runs.digest`` checks field by field."""
    return host.script(c, "run_status.py", run_dir, str(pid or ""))


@task
def tail_log(c, lines: int = 50) -> str:
    """The last ``lines`` of the run's log (untrusted text: the caller makes it printable)."""
    return remote.run(c, f"tail -n {int(lines)} {shlex.quote(host.workdir(c) + '/train.log')} 2>/dev/null", check=False)


@task
def free_port(c, address: str) -> int:
    """A TCP port free on the instance at ``address`` now (where a rendezvous will listen)."""
    code = ("import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])")
    out = remote.run(c, f"{shlex.quote(host.python(c))} -c {shlex.quote(code)} {shlex.quote(address)}").strip()
    port = out.splitlines()[-1] if out else ""
    if not port.isdigit() or not 1024 <= int(port) <= 65535:
        raise OrchError(f"the instance named no free port at {address} (it printed {out[-40:]!r})")
    return int(port)


@task
def stop(c, pid: int | None, timeout: float = 20) -> None:
    """End a run: its process, its session (``setsid`` gave it one) and its children (torchrun
    starts each worker in a session of its own): TERM, then KILL after ``timeout`` seconds."""
    if not pid:
        return
    p = int(pid)
    kids = f"$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$4 == {p} {{print $1}}')"  # no pkill needed
    remote.run(c, f"k={kids}; kill -TERM -- -{p} 2>/dev/null; kill -TERM {p} $k 2>/dev/null; "
                  f"for i in $(seq {int(timeout * 5)}); do kill -0 {p} $k 2>/dev/null || exit 0; sleep 0.2; done; "
                  f"kill -KILL -- -{p} 2>/dev/null; kill -KILL {p} $k 2>/dev/null; true", check=False)
