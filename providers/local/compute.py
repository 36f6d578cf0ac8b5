"""The local provider's verbs over its instance folders (``sshd`` runs each one)."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from functools import cached_property
from pathlib import Path

from orchestrator.errors import ProviderError, UsageError
from orchestrator.provider import (Capabilities, Endpoint, Offer, Provider, Remote, RentsGroups, Request, SelfEnding,
                                   Status, Stoppable, parse_label)
from providers.local import python as instance_python
from providers.local.machine import local_gpus, local_vram_gb
from providers.local.sshd import (address, free_port, host_key, instance_pids, kill_instance, port_free, running,
                                  start_sshd)
from providers.local.volumes import LocalVolumes


class LocalProvider(Provider, Stoppable, SelfEnding, RentsGroups, LocalVolumes):
    name = "local"
    embedded = True
    login = getpass.getuser()
    numeric_settings = {"price_per_hour": 0, "stopped_price_per_hour": 0, "volume_price_gb_month": 0}
    other_settings = ("metadata_url",)

    @cached_property
    def gpus(self) -> list[str]:
        return local_gpus()

    @cached_property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        # Built once: it is frozen, and a reaper pass asks for it once per instance.
        # An instance is an sshd on this machine: it runs this machine's system, no image of anyone's.
        return Capabilities(spot=False, cpu_only=True, gpu=bool(self.gpus), image=False)

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
        wanted = request.gpus * max(request.nodes, 1)  # a group's nodes share this machine's GPUs
        if not request.cpu and wanted > len(self.gpus):
            asked = f"{request.nodes} nodes x {request.gpus}" if request.nodes > 1 else f"{request.gpus}"
            raise UsageError(f"the local provider has {len(self.gpus)} GPU(s) on this machine "
                             f"(nvidia-smi), {asked} asked: use --cpu")
        self.check_mounts(request)  # ``volumes``: each path inside the instance's home

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        parsed = parse_label(label)
        if not parsed:
            raise ProviderError(f"not an orch label: {label!r}")
        provider_id = label
        root = self._dir(provider_id)
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / "authorized_keys").write_text(public_key.strip() + "\n")
            os.chmod(root / "authorized_keys", 0o600)
            host = address(parsed[0])
            env = {**self._instance_env(request), **self._python_env(root / "home")}
            meta = {"label": label, "host": host, "port": free_port(host), "state": "running",
                    "instance_id": parsed[0], "env": env, "gpus": 0 if request.cpu else request.gpus}
            self._save(provider_id, meta)
            self.link_mounts(provider_id, root / "home", request.mounts)  # before anything runs there
            self._boot(provider_id, meta)
        except BaseException:
            # All or nothing, as a cloud's create is: a Ctrl-C or a failure half-way (a folder without
            # its meta.json, which no listing shows) leaves no folder and no sshd behind.
            self.destroy(provider_id)
            raise
        return self.get(provider_id)

    def get(self, provider_id: str) -> Remote:
        meta = self._meta(provider_id)
        if meta is None:
            return Remote(provider_id=provider_id, label=provider_id, status=Status.GONE,
                          ended_by=self._word(provider_id))
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
            private_ip=meta["host"], raw=meta, ended_by="" if alive else str(meta.get("ended_by") or "")[:500],
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
            meta.pop("ended_by", None)  # started again: a stop from now on is not that watchdog's
            self._save(provider_id, meta)
            self._boot(provider_id, meta)
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        """Gone once its folder is gone and nothing of it runs. A self-stop racing this destroy may
        write meta.json back, and a session its sshd accepted just before it died may start after
        the kill (a look of the reaper's, making its work dir again): each is ended, and the
        folder removed again, until neither comes back."""
        root = self._dir(provider_id)
        parsed = parse_label(provider_id)
        instance_id = parsed[0] if parsed else None
        for _ in range(20):
            meta = self._meta(provider_id)
            if meta is not None or instance_id:
                kill_instance(root, (meta or {}).get("instance_id") or instance_id)
            shutil.rmtree(root, ignore_errors=True)
            time.sleep(0.05)
            if not root.exists() and not (instance_id and instance_pids(instance_id)):
                return
        raise ProviderError(f"could not remove {root}")

    def notice_url(self, spot: bool) -> str | None:
        """A metadata service of your own (``[providers.local] metadata_url``), for trying what an
        EC2 spot notice does to a job on this machine; none by default."""
        url = self.settings.get("metadata_url")
        return str(url) if url else None

    def known_price_hr(self, request: Request) -> float | None:
        """The price config.toml gives this machine, CPU or not: known before anything is made."""
        return float(self.settings.get("price_per_hour", 0.0))

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

    # -- groups: every instance listens on a loopback address of its own, and 127/8 reaches all
    # of them on every port, the way a cloud's private network reaches a group's members ------
    def open_group(self, group: str, request: Request) -> None:
        """Nothing to share: loopback already admits every node to every other."""

    def close_group(self, group: str) -> None:
        """Nothing was made for the group."""

    # -- what only the local provider can do -------------------------------------------
    def vouched_host_key(self, provider_id: str) -> str | None:
        """The local provider made the host key itself, so it can vouch for it."""
        return host_key(self._dir(provider_id))

    def self_stop_command(self, provider_id: str, destroy: bool) -> str:
        """A local instance is a folder on this machine: it stops itself the way the provider does,
        leaving the reason its watchdog gave (``ORCH_WATCHDOG_REASON``) where ``get`` finds it, as
        a cloud keeps the reason of a stop made from inside (taken back if the stop fails)."""
        verb, pid = ("destroy" if destroy else "stop"), repr(provider_id)
        code = ("import os\nfrom pathlib import Path\nfrom providers.local import LocalProvider\n"
                f"p = LocalProvider(None, Path({str(self.home)!r}))\n"
                f"p.leave_word({pid}, os.environ.get('ORCH_WATCHDOG_REASON', ''), {destroy})\n"
                f"try:\n    p.{verb}({pid})\n"
                f"except BaseException:\n    p.leave_word({pid}, '', {destroy})\n    raise\n")
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"

    # The word an instance's own watchdog leaves as it stops it (in its meta.json, which a listing
    # reads anyway) or destroys it (beside the folders: a destroy removes the instance's own).
    WORDS = ".ended"

    def leave_word(self, provider_id: str, reason: str, destroy: bool) -> None:
        """``reason`` kept as the watchdog's word on this instance; "" takes it back."""
        if not parse_label(provider_id):
            return
        if not destroy:
            meta = self._meta(provider_id)
            if meta is not None:
                meta["ended_by"] = reason[:500]
                self._save(provider_id, meta)
            return
        word = self.root / self.WORDS / provider_id
        if reason:
            word.parent.mkdir(parents=True, exist_ok=True)
            word.write_text(reason[:500])
        else:
            word.unlink(missing_ok=True)

    def _word(self, provider_id: str) -> str:
        try:
            with open(f"{self._root}/{self.WORDS}/{provider_id}", "rb") as f:
                return f.read(500).decode(errors="replace")
        except OSError:
            return ""

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

    @staticmethod
    def _python_env(home: Path) -> dict[str, str]:
        # The instance reuses the controller's packages (its torch and LibreYOLO) rather than
        # download gigabytes again, through a Python of its own that installs into itself
        # (``python``); provisioning checks it works like any other Python.
        try:
            python = instance_python.make(home)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            raise ProviderError(f"local instance {home.parent.name}: {e}") from None
        bindir = str(Path(sys.executable).parent)  # the controller's console scripts (torchrun, accelerate)
        return {"ORCH_PYTHON": str(python), "PATH": f"{python.parent}:{bindir}:/usr/local/bin:/usr/bin:/bin"}

    def _instance_env(self, request: Request) -> dict[str, str]:
        env = {"ORCH_PROVIDER": "local"}
        if request.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif request.group:  # each node its own share of the GPUs: NCCL refuses one GPU seen by two ranks
            first = request.node_rank * request.gpus
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(first, first + request.gpus))
        return env
