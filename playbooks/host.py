"""What every playbook needs on an instance: where orch works, which Python runs its scripts, how a
script from ``on_instance/`` is uploaded and its answer read, and how a process is started so that
it outlives the SSH session.

Everything orch runs on an instance is a real file in ``playbooks/on_instance/`` (standard library
only, unless it says otherwise), uploaded to ``$W/orch/bin/``, where the scripts find each other.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from pathlib import Path

from orchestrator.ssh import remote
from orchestrator.errors import OrchError, SSHError

ON_INSTANCE = Path(__file__).resolve().parent / "on_instance"
MARKER = "ORCH_RESULT "  # the one line of JSON each script answers with


def workdir(c) -> str:
    """``$W/orch``: ``$W`` is ``/workspace`` where the provider mounts a persistent volume there
    (RunPod: only it survives a stop), else ``$HOME``. Created on first use."""
    cached = getattr(c, "_orch_work", None)
    if cached is None:
        out = remote.run(c, 'if [ -d /workspace ] && [ -w /workspace ]; then W=/workspace; else W="$HOME"; fi; '
                            'mkdir -p "$W/orch/data" "$W/orch/runs" "$W/orch/bin"; printf %s "$W/orch"')
        cached = c._orch_work = out.strip()
    return cached


def python(c) -> str:
    """The instance's Python: the one provisioning chose (recorded in the work dir, which lives on
    the volume where there is one), else the first ``python3``/``python`` on the PATH, which is
    all the standard-library scripts need."""
    cached = getattr(c, "_orch_python", None)
    if cached:
        return cached
    rec = shlex.quote(f"{workdir(c)}/python")
    out = remote.run(c, f'p=$(cat {rec} 2>/dev/null); if [ -n "$p" ] && [ -x "$p" ]; then printf "%s\\n" "$p"; '
                        'else command -v python3 || command -v python; fi', check=False).strip()
    if not out:
        raise OrchError("no Python on the instance")
    c._orch_python = out.splitlines()[-1]
    return c._orch_python


def record_python(c, path: str) -> None:
    """Provisioning's choice, for every later command (and every later orch process)."""
    remote.put_text(c, path + "\n", f"{workdir(c)}/python", 0o644)
    c._orch_python = path


def upload(c, name: str) -> str:
    """``on_instance/NAME`` on the instance (once per connection); returns its path there."""
    done = c.__dict__.setdefault("_orch_uploaded", {})
    if name not in done:
        done[name] = remote.put_text(c, (ON_INSTANCE / name).read_text(),
                                     posixpath.join(workdir(c), "bin", name), 0o644)
    return done[name]


def script(c, name: str, *args: str, env: dict[str, str] | None = None, python_path: str | None = None) -> dict:
    """Run an ``on_instance`` script with the instance's Python; returns the JSON it answers with
    (its last ``ORCH_RESULT {...}`` line). Whatever else it prints is its own business."""
    path = upload(c, name)
    for dep in _DEPENDS.get(name, ()):
        upload(c, dep)
    cmd = " ".join(shlex.quote(a) for a in (python_path or python(c), path, *args))
    command = _with_env(c, cmd, env)
    result = remote.dropped_is_ssh_error(c, lambda: c.run(command, hide=True, warn=True, in_stream=False))
    if result.exited == -1 and MARKER not in result.stdout:
        # No exit status (paramiko's -1): the session ended under the script, its process killed
        # by a signal or its sshd gone (a node destroyed while orch read it). The connection was
        # lost, as dropped_is_ssh_error says of one that drops: no answer from a live instance.
        raise SSHError(f"the SSH session to {c.host}:{c.port} ended during {name} with no exit status")
    return answer(result.stdout, f"{name} ({(result.stderr or '').strip()[-300:] or 'no output'})")


def answer(out: str, what: str) -> dict:
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except (ValueError, RecursionError):
                break
            if isinstance(data, dict):
                return data
            break
    raise OrchError(f"the instance gave no answer from {what}")


def _with_env(c, command: str, env: dict[str, str] | None) -> str:
    if not env:
        return command
    import secrets

    lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    path = shlex.quote(remote.put_text(c, lines, f"{workdir(c)}/bin/env.{secrets.token_hex(4)}"))
    return f". {path}; rm -f {path}; {command}"


def detach(c, argv: list[str], log: str, cwd: str | None = None, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` on the instance so that it outlives this SSH session; returns its pid at once.

    One simple command, backgrounded, with its own redirections: that is what returns at once in
    every shell. A backgrounded list (``cd X && cmd > log &``) runs in a subshell whose stdout is
    still the session's, and bash keeps that subshell for as long as ``cmd`` lives, so the SSH
    channel never reaches EOF and the caller waits for ever (dash happens to exec the last command
    of such a subshell, which hides the bug). ``setsid`` gives the process a session of its own:
    no hangup reaches it when the SSH session ends. Commands run through the account's login
    shell (bash on every cloud image), so this must hold there, not only in /bin/sh.
    """
    q = shlex.quote
    line = (f"cd {q(cwd)} || exit 1; " if cwd else "")
    line += f"setsid {' '.join(q(a) for a in argv)} >> {q(log)} 2>&1 < /dev/null & echo $!"
    out = remote.run(c, _with_env(c, line, env)).strip().splitlines()
    try:
        return int(out[-1])
    except (IndexError, ValueError):
        raise OrchError(f"starting {argv[0]} on the instance printed no pid: {out[-3:]}") from None


# Scripts that import a sibling: both go up together.
_DEPENDS = {"hf_download.py": ("extract.py",), "train_entry.py": ("hub_push.py", "preempt_save.py"),
            "staged.py": ("extract.py", "tree.py"), "probe.py": ("verify_device.py",)}
