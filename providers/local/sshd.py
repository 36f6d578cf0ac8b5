"""One local instance: a real OpenSSH sshd in a folder of its own, and the processes it runs.

Commands run the way sshd runs them on a rented box: through the account's login shell from the
password database (``$SHELL -c``; bash on this kind of machine, as on every cloud image), so the
playbooks meet the same shell here as there. A ForceCommand wrapper only moves each session (sftp
included) into the instance's home first: sshd would start it in the account's own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

from orchestrator.errors import OrchError


def address(instance_id: str) -> str:
    """A loopback address of the instance's own, where the OS routes all of 127/8 (Linux)."""
    if not sys.platform.startswith("linux"):
        return "127.0.0.1"
    n = zlib.crc32(instance_id.encode()) % (254 * 254)
    return f"127.77.{n // 254 + 1}.{n % 254 + 1}"


# -- one instance: a real OpenSSH sshd in a folder of its own --------------------------------------
# Layout of an instance's folder: ``host_key`` (ed25519), ``authorized_keys``, ``sshd_config``,
# ``sshd.pid``, ``home/`` (the disk). Every session gets ``ORCH_INSTANCE_ID`` in its environment,
# which is how ``kill_instance`` finds the processes (setsid'd training included) that outlive sshd.
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server")

# sshd starts every session in the account's home, which here is the controller's own: the wrapper
# moves each session (sftp included) into the instance's home, then runs what was asked the way
# sshd itself would, through the login shell sshd put in $SHELL (from the password database).
SESSION = """#!/bin/sh
cd "$HOME" || exit 1
[ -z "$SSH_ORIGINAL_COMMAND" ] && exec "${SHELL:-/bin/sh}" -l
exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"
"""


def sshd_binary() -> str:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("sshd")
    if found:
        return found
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


def _conf(value: str) -> str:
    """A value for sshd_config: double-quoted, so a path with a space stays one argument."""
    if any(c in value for c in '"\n\r\\'):
        raise OrchError(f"cannot put {value!r} in an sshd config (a quote, backslash or newline)")
    return f'"{value}"'


def write_config(root: Path, host: str, port: int, instance_id: str, env: dict[str, str] | None = None) -> Path:
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    (root / "authorized_keys").touch(mode=0o600, exist_ok=True)
    setenv = {"HOME": str(home), "ORCH_INSTANCE_ID": instance_id, **(env or {})}
    pairs = " ".join(_conf(f"{k}={v}") for k, v in setenv.items())
    sftp = next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), None)
    session = root / "session.sh"
    session.write_text(SESSION)
    session.chmod(0o755)
    force = f"ForceCommand {_conf(str(session))}\nSubsystem sftp {_conf(sftp)}\n" if sftp else \
        "Subsystem sftp internal-sftp\n"
    config = root / "sshd_config"
    config.write_text(
        f"Port {int(port)}\n"
        f"ListenAddress {host}\n"
        f"HostKey {_conf(str(root / 'host_key'))}\n"
        f"AuthorizedKeysFile {_conf(str(root / 'authorized_keys'))}\n"
        f"PidFile {_conf(str(root / 'sshd.pid'))}\n"
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


def start_sshd(root: Path, host: str, port: int, instance_id: str, env: dict[str, str] | None = None,
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
    """Processes whose environment carries this instance id (sessions, detached jobs)."""
    needle = f"ORCH_INSTANCE_ID={instance_id}".encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        env = _environ(int(entry))
        if needle in env and needle in env.split(b"\0"):  # the split (a whole entry) only where it may match
            pids.append(int(entry))
    return pids


def sshd_pid(root: Path | str) -> int | None:
    try:
        with open(os.path.join(root, "sshd.pid")) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    # A recycled pid must not be killed: check it is our sshd with our config.
    return pid if os.path.join(root, "sshd_config").encode() in cmdline else None


def running(root: Path | str) -> bool:
    return sshd_pid(root) is not None


def kill_instance(root: Path, instance_id: str, timeout: float = 5.0) -> None:
    """End every process of the instance, then its sshd; SIGTERM first, SIGKILL after ``timeout``.
    sshd goes last because ``running()`` (this provider's status) is sshd alive: as on a cloud, an
    instance is reported stopped only once nothing of it runs, and a start never meets a process
    of the stop before it still dying."""
    _end(lambda: set(instance_pids(instance_id)), timeout)
    pid = sshd_pid(root)
    if pid:  # with it, what a session it accepted meanwhile started
        _end(lambda: {pid} | set(instance_pids(instance_id)), timeout)
    (root / "sshd.pid").unlink(missing_ok=True)


def _end(victims, timeout: float) -> None:
    """SIGTERM what ``victims()`` names and wait up to ``timeout``; then SIGKILL until none is
    left (up to ``timeout`` again). Asked again each round: a child born meanwhile (a loop's
    ``sleep``, which inherits an ignored SIGTERM) is ended too."""
    found = {p for p in victims() if alive(p)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + timeout
        sent = set()
        while found and time.monotonic() < deadline:
            for p in found - sent if sig == signal.SIGTERM else found:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            sent |= found
            time.sleep(0.05)
            found = {p for p in found | victims() if alive(p)}
        if not found:
            return


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
