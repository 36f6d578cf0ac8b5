"""Fake cloud hosts: real containers on this machine, built the way a cloud builds them.

The fake clouds (runpod_api.py, vast_api.py, lambda_api.py, the AWS tests) hand out these hosts.
Nothing here comes from orch: a wrong idea in orch must not become the fake's idea too. What a
host is, and where each behaviour comes from:

- **A container.** PID and mount namespaces of its own (``unshare``, as root), an overlay root
  whose lower layer is this machine's ``/`` (the image) and whose upper layer is the container
  disk, a volume bind-mounted at the provider's mount path. A stop kills PID 1, and the kernel
  every other process with it, nohup'd and setsid'd ones included, as ``docker stop`` does.
- **Commands run the way sshd runs them**: no wrapper, no ForceCommand. sshd starts root's login
  shell from ``/etc/passwd`` (bash, as on every Ubuntu image: RunPod's and Vast.ai's PyTorch
  images, Lambda Stack, the AWS Deep Learning AMIs) with ``-c COMMAND``, in root's home.
- **The provider's environment lives in the container**, that is in PID 1's environment. sshd
  does not hand it to sessions: an SSH session sees it only where the image writes it to a file
  that the shell reads (RunPod's start.sh writes ``/etc/rp_environment`` and has ``~/.bashrc``
  source it; Ubuntu's ``~/.bashrc`` returns early for non-interactive shells, so a command run
  over SSH does not see it). Vast.ai does not export it to SSH sessions at all.
- **Images**: ``python3`` is the image's Python. A "pytorch" image's ``python3`` is a Python with
  torch and LibreYOLO (this test run's own interpreter); a plain image's is the system Python.
  Anything installed into either lands on the container disk, as on a real host.

Hosts need root (namespaces, mounts) and Linux with overlayfs, as the CI machine has.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPPER_ROOT = Path("/dev/shm/orch-fake-hosts")  # overlay's upper layer must be on another filesystem than /

# Ubuntu 22.04's /root/.bashrc begins like this: a non-interactive shell (a command over SSH)
# returns before anything an image appends at the end.
UBUNTU_BASHRC = """# ~/.bashrc: executed by bash(1) for non-login shells.
# If not running interactively, don't do anything
[ -z "$PS1" ] && return
HISTCONTROL=ignoredups:ignorespace
"""
UBUNTU_PROFILE = """# ~/.profile: executed by Bourne-compatible login shells.
if [ "$BASH" ]; then
  if [ -f ~/.bashrc ]; then
    . ~/.bashrc
  fi
fi
mesg n 2> /dev/null || true
"""

SSHD_CONFIG = """# The image's sshd_config (Ubuntu's defaults where they matter; keys only).
Port {port}
ListenAddress {address}
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
AcceptEnv LANG LC_*
ClientAliveInterval 15
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def sshd_available() -> bool:
    return os.access("/usr/sbin/sshd", os.X_OK) and os.geteuid() == 0 and shutil.which("unshare") is not None


def loopback_address(seed: str) -> str:
    """An address of the host's own on loopback (Linux routes all of 127/8)."""
    n = zlib.crc32(seed.encode()) % (250 * 250)
    return f"127.{200 + n // 62500 % 50}.{n // 250 % 250 + 1}.{n % 250 + 1}"


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def banner(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH")
    except OSError:
        return False


# What a process pinned to one CPU weighs there: a training keeps its CPU busy, an orch command
# mostly waits on SSH; anything else pinned (the kernel's per-CPU threads, idle sshds) is left out.
# An orch process: started as `python -m orchestrator`, or forked by the suite's fork server (tests/zygote.py),
# whose command line its children keep.
LOAD = ((b"train_entry.py", 3), (b"-m\x00orchestrator", 1), (b"-m\x00tests.zygote", 1))


def quietest_cpu() -> int | None:
    """The CPU of this machine with the least work pinned to it right now (None: one CPU, or no
    affinity on this platform). The test machine is shared by every worker of the suite: each host
    gets one CPU of it, as a small cloud container has one vCPU, so that torch sizes its OpenMP pool
    to one CPU instead of spinning threads for every CPU of a machine that is already full."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    taken = dict.fromkeys(cpus, 0)
    for pid, cmd in command_lines():
        weight = next((w for needle, w in LOAD if needle in cmd), 0)
        try:
            mine = os.sched_getaffinity(pid) if weight else ()
        except OSError:
            continue  # it has ended
        if len(mine) == 1:
            cpu = next(iter(mine))
            taken[cpu] = taken.get(cpu, 0) + weight
    return min(cpus, key=lambda c: (taken.get(c, 0), c))


def command_lines():
    """(pid, raw command line: arguments NUL-separated) of every process on this machine that has
    one (kernel threads have none), read from /proc without starting a `ps`."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    raw = f.read()
            except OSError:
                continue  # gone between the listing and the read
            if raw:
                yield int(entry.name), raw


# Where container_init mounts an empty tmpfs over this machine's folders: the image shows none of them.
HIDDEN = ("/tmp", "/run", "/dev/shm")


def image_python_root(python: str | None) -> str | None:
    """The folder the image's Python lives in (a virtual environment's, else the interpreter's
    prefix), when a container would hide it: a checkout and its .venv under /tmp."""
    if not python:
        return None
    exe = Path(python).absolute()
    venv = exe.parent.parent
    root = venv if (venv / "pyvenv.cfg").is_file() else Path(os.path.realpath(exe)).parent.parent
    hidden = any(str(p) == h or str(p).startswith(h + "/") for p in (root, Path(os.path.realpath(root)))
                 for h in HIDDEN)
    return str(root) if hidden else None


def image_files(python: str | None, bashrc_tail: str = "") -> dict[str, dict]:
    """The files an Ubuntu image has where orch will look: root's dotfiles and ``python3``."""
    files = {"/root/.bashrc": {"text": UBUNTU_BASHRC + bashrc_tail}, "/root/.profile": {"text": UBUNTU_PROFILE}}
    if python:
        wrapper = f'#!/bin/sh\nexec {python} "$@"\n'
        for name in ("python3", "python"):
            files[f"/usr/local/bin/{name}"] = {"text": wrapper, "mode": "755"}
    return files


def _passwd_with_shell(shell: str) -> str:
    lines = []
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "root" and len(fields) == 7:
            fields[6] = shell
        lines.append(":".join(fields))
    return "\n".join(lines) + "\n"


class Host:
    """One machine of a fake cloud. ``boot()`` starts it (and is what a start does), ``halt()``
    stops it, ``destroy()`` removes everything. Thread-safe."""

    def __init__(self, state: Path, *, address: str | None = None, env: dict[str, str] | None = None,
                 mount_path: str | None = None, keep_container_disk: bool = False,
                 new_host_keys_each_boot: bool = False, python: str | None = sys.executable,
                 bashrc_tail: str = "", env_file: str | None = None, login_shell: str = "/bin/bash",
                 volume: Path | None = None):
        self.state = Path(state)
        self._volume = volume  # a folder that outlives the host (a network volume), else its own
        self.id = secrets.token_hex(6)
        self.address = address or loopback_address(self.id)
        self.port = 0
        self.env = dict(env or {})
        self.mount_path = mount_path
        self.keep_container_disk = keep_container_disk
        self.new_host_keys_each_boot = new_host_keys_each_boot
        self.files = image_files(python, bashrc_tail)
        self.keep = [p for p in (image_python_root(python),) if p]  # shown inside the container as they are
        if login_shell != "/bin/bash":  # an image whose root logs in to another shell (zsh, dash)
            self.files["/etc/passwd"] = {"text": _passwd_with_shell(login_shell)}
        self.env_file = env_file
        self.proc: subprocess.Popen | None = None
        self.boots = 0
        self._lock = threading.RLock()

    # -- where things are ----------------------------------------------------------------
    @property
    def upper(self) -> Path:
        return UPPER_ROOT / self.id

    @property
    def volume(self) -> Path:
        return self._volume or self.state / "volume"

    def path(self, inside: str) -> Path:
        """A path inside the running container, as seen from this machine."""
        if not self.running():
            raise RuntimeError("the host is not running")
        return Path(f"/proc/{self._init_pid()}/root") / inside.lstrip("/")

    # -- lifecycle -----------------------------------------------------------------------
    def boot(self, port: int | None = None, timeout: float = 15.0) -> None:
        """Start the container (again): a fresh container disk unless it is kept, sshd up."""
        with self._lock:
            if self.running():
                return
            if not self.keep_container_disk:
                shutil.rmtree(self.upper, ignore_errors=True)
            self.state.mkdir(parents=True, exist_ok=True)
            (self.state / "rootfs").mkdir(exist_ok=True)
            if self.mount_path:
                self.volume.mkdir(exist_ok=True)
            self.port = port or free_port(self.address)
            files = dict(self.files)
            files["/etc/ssh/sshd_config"] = {"text": SSHD_CONFIG.format(port=self.port, address=self.address)}
            cfg = {"rootfs": str(self.state / "rootfs"), "upper": str(self.upper / "upper"),
                   "work": str(self.upper / "work"), "volume": str(self.volume) if self.mount_path else None,
                   "mount_path": self.mount_path, "files": files, "env_file": self.env_file,
                   "new_host_keys_each_boot": self.new_host_keys_each_boot, "keep": self.keep}
            (self.state / "boot.json").write_text(json.dumps(cfg))
            env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                   **self.env}
            log = open(self.state / "boot.log", "ab")
            # The container's processes are started from whatever thread asked: no pdeathsig (it
            # fires when that thread ends). Teardown is by halt()/destroy() and the fakes' exits.
            cpu = quietest_cpu()  # a container with a cpuset of one CPU (`docker run --cpuset-cpus`)
            pin = ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []
            self.proc = subprocess.Popen(
                [*pin, "unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "--",
                 "/usr/bin/python3", str(HERE / "container_init.py"), str(self.state / "boot.json")],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            log.close()
            self.boots += 1
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    tail = (self.state / "boot.log").read_text(errors="replace")[-600:]
                    raise RuntimeError(f"fake host {self.address} did not boot: {tail.strip()}")
                if banner(self.address, self.port, 0.3):
                    return
                time.sleep(0.02)
            self.halt()
            raise RuntimeError(f"sshd on fake host {self.address}:{self.port} did not answer in {timeout} s")

    def halt(self) -> None:
        """Stop the container: every process ends; the container disk goes unless it is kept."""
        with self._lock:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.send_signal(signal.SIGKILL)  # --kill-child: PID 1, and with it everything
                self.proc.wait()
                self.proc = None
            if not self.keep_container_disk:
                shutil.rmtree(self.upper, ignore_errors=True)

    def destroy(self) -> None:
        self.halt()
        with self._lock:
            shutil.rmtree(self.upper, ignore_errors=True)
            shutil.rmtree(self.state, ignore_errors=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _init_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0])

    # -- what the provider does to a running host ----------------------------------------
    def host_key(self) -> str:
        """'ssh-ed25519 AAAA...' of the running host."""
        return " ".join(self.path("/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])

    def add_authorized_key(self, public_key: str) -> None:
        """What an API that attaches a key does (Vast.ai's ``attach_ssh``)."""
        ssh = self.path("/root/.ssh")
        ssh.mkdir(mode=0o700, exist_ok=True)
        keys = ssh / "authorized_keys"
        have = keys.read_text() if keys.exists() else ""
        if public_key.strip() not in have:
            keys.write_text(have + public_key.strip() + "\n")
            keys.chmod(0o600)

    def run(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A command inside the host, as its own root (for tests that look inside)."""
        pid = self._init_pid()
        return subprocess.run(["nsenter", "-t", str(pid), "-m", "-p", "-r", "-w", "/bin/bash", "-c", command],
                              capture_output=True, text=True, timeout=timeout)

    def processes(self) -> list[str]:
        """Command lines of every process in the host (a check that a stop ended them all)."""
        if not self.running():
            return []
        out = self.run("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]


class Relay:
    """A TCP port that forwards to another: Vast.ai's SSH proxy (``ssh_host``/``ssh_port``)."""

    def __init__(self, target: tuple[str, int], address: str = "127.0.0.1"):
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(64)
        self.address, self.port = self.sock.getsockname()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)  # the 5 s was for connecting: a quiet SSH session is not a dead one
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.sock.close()


class Silent:
    """A port that completes TCP handshakes and then says nothing, as a firewalled route does to
    an SSH client: no banner, ever. (A closed port would refuse at once, which is kinder than
    what a blocked direct route does.)"""

    def __init__(self, address: str = "127.0.0.1"):
        self.sock = socket.socket()
        self.sock.bind((address, 0))
        self.sock.listen(128)  # never accepted: the kernel completes the handshake, nobody speaks
        self.address, self.port = self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()


def cleanup_all() -> None:
    """Remove container disks a crashed test run left (their containers died with it or will)."""
    shutil.rmtree(UPPER_ROOT, ignore_errors=True)
