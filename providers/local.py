"""The embedded default: each instance is a real OpenSSH sshd on a loopback address of its own.

An instance lives in ``$ORCH_HOME/local/<label>/``: its host key, its sshd config and its
``home/``, which is the instance's disk. Stop ends sshd and every process of the instance and
keeps ``home/``; start brings sshd back on the same home and host key; destroy removes it all.
GPUs are what ``nvidia-smi`` reports on this machine (none: CPU-only instances).

Commands run the way sshd runs them on a rented box: through the account's login shell from the
password database (``$SHELL -c``; bash on this kind of machine, as on every cloud image), so the
playbooks meet the same shell here as there. A ForceCommand wrapper only moves each session (sftp
included) into the instance's home first: sshd would start it in the account's own.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zlib
from functools import cached_property
from pathlib import Path

from orchestrator.errors import OrchError, ProviderError, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import Capabilities, Endpoint, Offer, Provider, Remote, Request, Status, parse_label


def local_gpus() -> list[str]:
    """GPU names on this machine, from nvidia-smi (empty where there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def local_vram_gb() -> float:
    smi = shutil.which("nvidia-smi")
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout if smi else ""
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0.0


class LocalProvider(Provider):
    name = "local"
    embedded = True
    login = getpass.getuser()
    numeric_settings = {"price_per_hour": 0, "stopped_price_per_hour": 0}

    @cached_property
    def gpus(self) -> list[str]:
        return local_gpus()

    @cached_property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        # Built once: it is frozen, and a reaper pass asks for it once per instance. groups: every
        # instance listens on a loopback address of its own, and 127/8 reaches all of them on every
        # port, the way a cloud's private network reaches a group's members.
        return Capabilities(stop=True, spot=False, cpu_only=True, gpu=bool(self.gpus), self_stop=True,
                            self_destroy=True, groups=True)

    @cached_property
    def root(self) -> Path:
        return Path(self.home) / "local"

    def _dir(self, provider_id: str) -> Path:
        return self.root / provider_id

    @cached_property
    def _root(self) -> str:  # strings, not pathlib, where a reaper pass asks for every local instance
        return str(self.root)

    def _meta(self, provider_id: str) -> dict | None:
        try:
            with open(f"{self._root}/{provider_id}/meta.json", "rb") as f:  # bytes: no text layer per file
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def _save(self, provider_id: str, meta: dict) -> None:
        path = self._dir(provider_id) / "meta.json"
        if not path.parent.is_dir():
            raise ProviderError(f"local instance {provider_id} does not exist (any more)")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path)

    # -- verbs -------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        super().validate(request)
        if not request.cpu and request.gpus > len(self.gpus):
            raise UsageError(f"the local provider has {len(self.gpus)} GPU(s) on this machine "
                             f"(nvidia-smi), {request.gpus} asked: use --cpu")

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        parsed = parse_label(label)
        if not parsed:
            raise ProviderError(f"not an orch label: {label!r}")
        provider_id = label
        root = self._dir(provider_id)
        root.mkdir(parents=True, exist_ok=True)
        (root / "authorized_keys").write_text(public_key.strip() + "\n")
        os.chmod(root / "authorized_keys", 0o600)
        host = _address(parsed[0])
        env = self._instance_env(request)
        meta = {"label": label, "host": host, "port": free_port(host), "state": "running",
                "instance_id": parsed[0], "env": env, "gpus": 0 if request.cpu else request.gpus}
        self._save(provider_id, meta)
        self._boot(provider_id, meta)
        return self.get(provider_id)

    def get(self, provider_id: str) -> Remote:
        meta = self._meta(provider_id)
        if meta is None:
            return Remote(provider_id=provider_id, label=provider_id, status=Status.GONE)
        # A folder its meta calls stopped has no sshd (stop writes "stopped" after the kill, start
        # writes "running" before the boot): no pid file to open, which a listing of a large
        # stopped fleet would do once per instance (bench/fleet.py).
        alive = meta.get("state") != "stopped" and running(f"{self._root}/{provider_id}")
        return Remote(
            provider_id=provider_id, label=meta["label"], status=Status.RUNNING if alive else Status.STOPPED,
            endpoint=Endpoint(meta["host"], meta["port"], self.ssh_user) if alive else None,
            price_hr=float(self.settings.get("price_per_hour", 0.0)),
            stopped_price_hr=float(self.settings.get("stopped_price_per_hour", 0.0)),
            gpu_name=self.gpus[0] if meta.get("gpus") and self.gpus else None, gpus=meta.get("gpus", 0),
            private_ip=meta["host"], raw=meta,
        )

    def list(self) -> list[Remote]:
        try:
            names = sorted(os.listdir(self.root)) if self.root.exists() else []
        except OSError as e:
            raise ProviderError(f"cannot list local instances in {self.root}: {e}") from None
        return [r for r in (self.get(n) for n in names if parse_label(n)) if r.status != Status.GONE]

    def stop(self, provider_id: str) -> None:
        meta = self._need(provider_id)
        kill_instance(self._dir(provider_id), meta["instance_id"])
        meta["state"] = "stopped"
        self._save(provider_id, meta)

    def start(self, provider_id: str) -> Remote:
        meta = self._need(provider_id)
        if not running(self._dir(provider_id)):
            if not port_free(meta["host"], meta["port"]):
                meta["port"] = free_port(meta["host"])
            meta["state"] = "running"
            self._save(provider_id, meta)
            self._boot(provider_id, meta)
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        root = self._dir(provider_id)
        for _ in range(20):  # a self-stop racing this destroy may write meta.json back meanwhile
            meta = self._meta(provider_id)
            if meta is not None:
                kill_instance(root, meta["instance_id"])
            shutil.rmtree(root, ignore_errors=True)
            if not root.exists():
                return
            time.sleep(0.1)
        raise ProviderError(f"could not remove {root}")

    def offers(self, request: Request) -> list[Offer] | None:
        """This machine's own GPUs, at the price config.toml gives them (default free); None
        without GPUs: the local provider is then no source of GPU offers."""
        if not self.gpus:
            return None
        if request.gpus > len(self.gpus):
            return []
        return [Offer(provider=self.name, offer_id="local", gpu_name=self.gpus[0], gpus=request.gpus,
                      vram_gb=local_vram_gb(), price_hr=float(self.settings.get("price_per_hour", 0.0)),
                      location="this machine", stopped_hr=float(self.settings.get("stopped_price_per_hour", 0.0)))]

    # -- what only the local provider can do -------------------------------------------
    def vouched_host_key(self, provider_id: str) -> str | None:
        """The local provider made the host key itself, so it can vouch for it."""
        return host_key(self._dir(provider_id))

    def self_stop_command(self, provider_id: str, destroy: bool) -> str:
        """A local instance is a folder on this machine: it stops itself the way the provider does."""
        verb = "destroy" if destroy else "stop"
        code = ("from pathlib import Path\nfrom providers.local import LocalProvider\n"
                f"LocalProvider(None, Path({str(self.home)!r})).{verb}({provider_id!r})\n")
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"

    def _need(self, provider_id: str) -> dict:
        meta = self._meta(provider_id)
        if meta is None:
            raise ProviderError(f"local instance {provider_id} does not exist")
        return meta

    def _boot(self, provider_id: str, meta: dict) -> None:
        try:
            start_sshd(self._dir(provider_id), meta["host"], meta["port"], meta["instance_id"], meta["env"])
        except (RuntimeError, OSError) as e:
            raise ProviderError(f"local instance {provider_id}: {e}") from None

    def _instance_env(self, request: Request) -> dict[str, str]:
        # The instance may reuse the controller's own Python (and its torch and LibreYOLO) rather
        # than download gigabytes again; provisioning checks it works like any other Python.
        bindir = str(Path(sys.executable).parent)
        env = {"ORCH_PYTHON": sys.executable, "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
               "ORCH_PROVIDER": "local"}
        if request.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env


def _address(instance_id: str) -> str:
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
        if entry.isdigit() and int(entry) != me and needle in _environ(int(entry)).split(b"\0"):
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


@hookimpl
def register_providers(register):
    register(LocalProvider)
