"""A real OpenSSH sshd in a folder of its own: the local provider's "machine" and the fakes' hosts.

Layout of ``root``: ``host_key`` (ed25519), ``authorized_keys``, ``sshd_config``, ``sshd.pid``,
``home/`` (the disk). Every session gets ``ORCH_INSTANCE_ID`` in its environment, which is how
``kill_instance`` finds the processes (nohup'd training included) that outlive sshd itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


def sshd_binary() -> str:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("sshd")
    if found:
        return found
    from orchestrator.errors import OrchError

    raise OrchError("OpenSSH server not found: install it (Debian/Ubuntu: apt-get install openssh-server)")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def host_key(root: Path) -> str:
    """'ssh-ed25519 AAAA...' of this host, generating it on first use."""
    key = root / "host_key"
    if not key.exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)], check=True)
    return " ".join((root / "host_key.pub").read_text().split()[:2])


SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server")

# sshd starts every session in the user's passwd home, which on the local provider is the
# controller's own: a wrapper moves each session (sftp included) into the instance's home.
SESSION = """#!/bin/sh
cd "$HOME" || exit 1
[ -z "$SSH_ORIGINAL_COMMAND" ] && exec "${SHELL:-/bin/sh}" -l
exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"
"""


def write_config(root: Path, host: str, port: int, instance_id: str, env: dict[str, str] | None = None) -> Path:
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    (root / "authorized_keys").touch(mode=0o600, exist_ok=True)
    setenv = {"HOME": str(home), "ORCH_INSTANCE_ID": instance_id, **(env or {})}
    pairs = " ".join(f'{k}="{v}"' for k, v in setenv.items())
    sftp = next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), None)
    session = root / "session.sh"
    session.write_text(SESSION)
    session.chmod(0o755)
    force = f"ForceCommand {session}\nSubsystem sftp {sftp}\n" if sftp else "Subsystem sftp internal-sftp\n"
    config = root / "sshd_config"
    config.write_text(
        f"Port {port}\n"
        f"ListenAddress {host}\n"
        f"HostKey {root / 'host_key'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
        f"PidFile {root / 'sshd.pid'}\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "AllowTcpForwarding yes\n"
        "ClientAliveInterval 15\n"
        f"SetEnv {pairs}\n"
        + force
    )
    return config


def start(root: Path, host: str, port: int, instance_id: str, env: dict[str, str] | None = None,
          timeout: float = 10.0) -> int:
    """Start sshd detached (it outlives orch); returns its pid once it accepts connections."""
    host_key(root)
    config = write_config(root, host, port, instance_id, env)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    log = open(root / "sshd.log", "ab")
    proc = subprocess.Popen(
        [sshd_binary(), "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
    )
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (root / "sshd.log").read_text(errors="replace")[-400:]
            raise RuntimeError(f"sshd exited with {proc.returncode}: {tail.strip()}")
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH"):
                    (root / "sshd.pid").write_text(f"{proc.pid}\n")
                    return proc.pid
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"sshd on {host}:{port} did not answer within {timeout} s")


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def instance_pids(instance_id: str) -> list[int]:
    """Processes whose environment carries this instance id (sessions, nohup'd jobs)."""
    needle = f"ORCH_INSTANCE_ID={instance_id}".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and needle in _environ(int(entry)).split(b"\0"):
            pids.append(int(entry))
    return pids


def sshd_pid(root: Path) -> int | None:
    try:
        pid = int((root / "sshd.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    # A recycled pid must not be killed: check it is our sshd with our config.
    return pid if str(root / "sshd_config").encode() in cmdline else None


def running(root: Path) -> bool:
    return sshd_pid(root) is not None


def kill_instance(root: Path, instance_id: str, timeout: float = 5.0) -> None:
    """End sshd and every process of the instance; SIGTERM first, SIGKILL after ``timeout``."""
    victims = set(instance_pids(instance_id))
    pid = sshd_pid(root)
    if pid:
        victims.add(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in victims:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            victims = {p for p in victims if _alive(p)}
            if not victims:
                break
            time.sleep(0.05)
        victims |= set(instance_pids(instance_id))
        if not victims:
            break
    (root / "sshd.pid").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
