"""The embedded default: each instance is a real OpenSSH sshd on a loopback address.

An instance lives in ``$ORCH_HOME/local/<label>/``: its host key, its sshd config and its
``home/``, which is the instance's disk. Stop ends sshd and every process of the instance and
keeps ``home/``; start brings sshd back on the same home and host key; destroy removes it all.
GPUs are what ``nvidia-smi`` reports on this machine (none: CPU-only instances).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import zlib
from functools import cached_property
from pathlib import Path

from orchestrator import sshd
from orchestrator.errors import ProviderError, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import (GONE, RUNNING, STOPPED, Capabilities, Endpoint, Provider, Remote,
                                   Request, parse_label)


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


class LocalProvider(Provider):
    name = "local"
    ssh_user = getpass.getuser()
    numeric_settings = {"price_per_hour": 0, "stopped_price_per_hour": 0}

    @cached_property
    def gpus(self) -> list[str]:
        return local_gpus()

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return Capabilities(stop=True, spot=False, cpu_only=True, gpu=bool(self.gpus), self_stop=True,
                            self_destroy=True, volumes=False)

    @property
    def root(self) -> Path:
        return Path(self.home) / "local"

    def _dir(self, provider_id: str) -> Path:
        return self.root / provider_id

    def _meta(self, provider_id: str) -> dict | None:
        try:
            return json.loads((self._dir(provider_id) / "meta.json").read_text())
        except FileNotFoundError:
            return None

    def _save(self, provider_id: str, meta: dict) -> None:
        path = self._dir(provider_id) / "meta.json"
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
        meta = {"label": label, "host": host, "port": sshd.free_port(host), "state": "running",
                "instance_id": parsed[0], "env": env, "gpus": 0 if request.cpu else request.gpus}
        self._save(provider_id, meta)
        self._boot(provider_id, meta)
        return self.get(provider_id)

    def get(self, provider_id: str) -> Remote:
        meta = self._meta(provider_id)
        if meta is None:
            return Remote(provider_id=provider_id, label=provider_id, status=GONE)
        alive = sshd.running(self._dir(provider_id))
        status = RUNNING if alive else STOPPED
        return Remote(
            provider_id=provider_id, label=meta["label"], status=status,
            endpoint=Endpoint(meta["host"], meta["port"], self.ssh_user) if alive else None,
            price_hr=float(self.settings.get("price_per_hour", 0.0)),
            stopped_price_hr=float(self.settings.get("stopped_price_per_hour", 0.0)),
            gpu_name=self.gpus[0] if meta.get("gpus") and self.gpus else None, gpus=meta.get("gpus", 0),
            raw=meta,
        )

    def list(self) -> list[Remote]:
        try:
            names = sorted(os.listdir(self.root)) if self.root.exists() else []
        except OSError as e:
            raise ProviderError(f"cannot list local instances in {self.root}: {e}") from None
        return [r for r in (self.get(n) for n in names if parse_label(n)) if r.status != GONE]

    def stop(self, provider_id: str) -> None:
        meta = self._need(provider_id)
        sshd.kill_instance(self._dir(provider_id), meta["instance_id"])
        meta["state"] = "stopped"
        self._save(provider_id, meta)

    def start(self, provider_id: str) -> Remote:
        meta = self._need(provider_id)
        if not sshd.running(self._dir(provider_id)):
            if not sshd.port_free(meta["host"], meta["port"]):
                meta["port"] = sshd.free_port(meta["host"])
            meta["state"] = "running"
            self._save(provider_id, meta)
            self._boot(provider_id, meta)
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        root = self._dir(provider_id)
        meta = self._meta(provider_id)
        if meta is not None:
            sshd.kill_instance(root, meta["instance_id"])
        shutil.rmtree(root, ignore_errors=True)
        if root.exists():
            raise ProviderError(f"could not remove {root}")

    # -- helpers -----------------------------------------------------------------------
    def host_key(self, provider_id: str) -> str:
        """The local provider made the host key itself, so it can vouch for it."""
        return sshd.host_key(self._dir(provider_id))

    def _need(self, provider_id: str) -> dict:
        meta = self._meta(provider_id)
        if meta is None:
            raise ProviderError(f"local instance {provider_id} does not exist")
        return meta

    def _boot(self, provider_id: str, meta: dict) -> None:
        try:
            sshd.start(self._dir(provider_id), meta["host"], meta["port"], meta["instance_id"], meta["env"])
        except RuntimeError as e:
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


@hookimpl
def register_providers(register):
    register(LocalProvider)
