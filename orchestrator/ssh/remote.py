"""SSH to an instance through Fabric, with its host key pinned.

The first contact records the host key the instance shows (or the one its provider vouched for,
as the local provider does); every later connection refuses any other key. The one exception is
``rekey``: right after a start that orch asked for and the provider confirmed, on a provider whose
images make new host keys at every start, the new key is accepted and reported to the caller.
"""

from __future__ import annotations

import base64
import functools
import shlex
import socket
from pathlib import Path
from typing import Callable

from orchestrator.errors import HostKeyMismatch, SSHError

# A user name as the ssh client and sshd take one: never an option (a leading '-').
USER = __import__("re").compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")


def _pkey(line: str):
    import paramiko

    kind, b64 = line.split()[:2]
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64))


def host_id(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def check_user(user: str) -> str:
    if not USER.fullmatch(user or ""):
        raise SSHError(f"{user!r} is not an SSH user name orch will use")
    return user


@functools.cache
def _runner():
    """Fabric's runner, but Ctrl-C during a command without a terminal ends the wait at once.
    Fabric re-raises it (it has no way to interrupt such a command: fabric/runners.py,
    ``Remote.send_interrupt``), then Invoke joins its output readers before Fabric closes the
    channel (invoke/runners.py, ``Runner._finish``, then ``run``'s ``stop``): the readers wait for
    the remote command to end, so `orch logs -f` never ended, and a reaper's look held Ctrl-C for
    as long as the instance took. Closing the channel first ends the readers (paramiko's
    ``Channel.close`` wakes them with end of file); the remote command is left as Fabric leaves it."""
    from fabric.runners import Remote

    class Interruptible(Remote):
        def send_interrupt(self, interrupt):
            if not self.using_pty:
                self.channel.close()
            super().send_interrupt(interrupt)

    return Interruptible


def connect(host: str, port: int, user: str, key: Path, host_key: str | None,
            on_new_key: Callable[[str], None] | None = None, timeout: float = 15.0, rekey: bool = False):
    """An open Fabric Connection. ``host_key`` None: trust on first use, reported to ``on_new_key``.
    ``rekey``: accept a key other than ``host_key`` too, and report it the same way."""
    import paramiko
    from fabric import Config, Connection

    check_user(user)
    _quiet_paramiko()
    cfg = Config(overrides={"run": {"in_stream": False, "hide": True, "warn": True},
                            "runners": {"remote": _runner()}, "load_ssh_configs": False})
    conn = Connection(host, user=user, port=port, config=cfg, connect_timeout=timeout, connect_kwargs={
        "key_filename": str(key), "look_for_keys": False, "allow_agent": False,
        "banner_timeout": timeout, "auth_timeout": timeout,
    })
    client = conn.client
    client._system_host_keys.clear()  # never the user's ~/.ssh/known_hosts: only the pinned key
    client.get_host_keys().clear()
    if host_key and not rekey:
        client.get_host_keys().add(host_id(host, port), host_key.split()[0], _pkey(host_key))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        class Pin(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, _client, _hostname, key):
                line = f"{key.get_name()} {key.get_base64()}"
                if on_new_key and line != " ".join((host_key or "").split()[:2]):
                    on_new_key(line)

        client.set_missing_host_key_policy(Pin())
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.connect_kwargs["sock"] = sock
        conn.open()
    except paramiko.BadHostKeyException:
        raise HostKeyMismatch(f"{host}:{port} presented a different host key than the one pinned at "
                              "first contact: refusing (possible interception)") from None
    except paramiko.SSHException as e:
        if "not found in known_hosts" in str(e):
            raise HostKeyMismatch(f"{host}:{port} presented an unknown host key: refusing") from None
        raise SSHError(f"SSH to {host}:{port} failed: {e}") from None
    except OSError as e:
        raise SSHError(f"cannot reach {host}:{port}: {e}") from None
    except EOFError:
        raise SSHError(f"SSH to {host}:{port} failed: the connection closed during the handshake") from None
    return conn


def _quiet_paramiko() -> None:
    """paramiko's transport thread logs its own tracebacks ("Error reading SSH protocol banner")
    when an endpoint is silent: orch reports the failure itself, in one line."""
    import logging

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


def home(conn) -> str:
    """The instance's $HOME (SFTP starts elsewhere on some hosts, so remote paths are absolute)."""
    cached = getattr(conn, "_orch_home", None)
    if cached is None:
        cached = run(conn, 'printf %s "$HOME"').strip()
        conn._orch_home = cached
    return cached


def put_text(conn, text: str, path: str, mode: int = 0o600) -> str:
    """Write a file on the instance over SFTP (never through a command line); returns its path."""
    if not path.startswith("/"):
        path = f"{home(conn)}/{path}"
    run(conn, f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}")

    def write():
        sftp = conn.sftp()
        with sftp.open(path, "w") as f:
            f.write(text.encode())
        sftp.chmod(path, mode)
    dropped_is_ssh_error(conn, write)
    return path


def dropped_is_ssh_error(conn, call):
    """``call()``, with a connection that ends under it (the instance destroyed by another orch
    process, its sshd killed, the network gone) reported as the SSHError every caller handles,
    in one line, instead of paramiko's own exception ("Server connection dropped")."""
    import paramiko

    try:
        return call()
    except (paramiko.SSHException, EOFError, OSError) as e:
        raise SSHError(f"the SSH connection to {conn.host}:{conn.port} ended during a command: "
                       f"{str(e).strip() or type(e).__name__}") from None


def run(conn, command: str, check: bool = True, timeout: float | None = None, env: dict | None = None) -> str:
    """Run a shell command; returns stdout. ``env`` values travel in a 0600 file over SFTP,
    never on a command line (``ps`` on the instance shows command lines to every user)."""
    if env:
        import secrets

        script = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        path = shlex.quote(put_text(conn, script, f".orch/env.{secrets.token_hex(4)}"))
        command = f". {path}; rm -f {path}; {command}"
    # Invoke feeds a non-tty stdin one byte per 10 ms: never send anything large that way.
    result = dropped_is_ssh_error(conn, lambda: conn.run(command, timeout=timeout, in_stream=False))
    if check and not result.ok:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise SSHError(f"remote command failed ({result.exited}): {' | '.join(tail)}")
    return result.stdout
