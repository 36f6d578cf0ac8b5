"""The instance lifecycle: up, stop, start, down, refresh — the same for every provider.

Every step is written to the ledger before the provider is asked to do it (intent first), so a
crash at any point leaves a row that ``reconcile`` can match with what the provider has.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator import claims, config, states
from orchestrator.errors import (OrchError, ProviderError, SSHError, StartRefused, UsageError)
from orchestrator.ledger import Instance, Ledger, database_url
from orchestrator.provider import GONE, RUNNING, STOPPED, Provider, Remote, Request

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
MAX_DISK_GB = 20_000
MAX_GPUS = 16


def kill_point(name: str) -> None:
    """Test hook: ``ORCH_TEST_KILL_AT=<name>`` SIGKILLs this process here, as a crash would."""
    if os.environ.get("ORCH_TEST_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def check_request(name: str, request: Request) -> None:
    if not NAME.match(name):
        raise UsageError(f"invalid name {name!r}: use 1-40 lowercase letters, digits and '-', starting "
                         "with a letter or digit")
    if not 1 <= request.disk_gb <= MAX_DISK_GB:
        raise UsageError(f"--disk must be between 1 and {MAX_DISK_GB} GB, not {request.disk_gb}")
    if not 1 <= request.gpus <= MAX_GPUS:
        raise UsageError(f"--gpus must be between 1 and {MAX_GPUS}, not {request.gpus}")
    if request.bid is not None and not 0 < request.bid < 1000:
        raise UsageError(f"--bid must be a price in $/hr per GPU between 0 and 1000, not {request.bid}")
    if request.cpu and request.gpu:
        raise UsageError("--cpu and --gpu exclude each other")


@dataclass
class Orch:
    """What every command needs: the ledger, orch's home, who is acting, where to report."""

    ledger: Ledger
    home: Path
    actor: str = "cli"
    say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)

    @classmethod
    def open(cls, actor: str = "cli", say: Callable[[str], None] | None = None) -> "Orch":
        home = config.home()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        url = database_url(home) if "ORCH_DATABASE_URL" in os.environ else (
            config.get("database_url") or database_url(home))
        orch = cls(Ledger(url), home, actor)
        if say:
            orch.say = say
        return orch

    # -- providers ---------------------------------------------------------------------
    def provider(self, name: str) -> Provider:
        from orchestrator import plugins

        cache = self.__dict__.setdefault("_providers", {})
        if name not in cache:
            settings = config.provider_settings(name)
            if config.get("spot_margin") is not None:
                settings.setdefault("spot_margin", config.get("spot_margin"))
            cache[name] = plugins.provider_class(name)(settings, self.home)
        return cache[name]

    def instance(self, name: str) -> Instance:
        inst = self.ledger.by_name(name)
        if inst is None:
            raise UsageError(f"no live instance named {name!r} (see `orch status`)")
        return inst

    def move(self, inst: Instance, to: str, reason: str = "", **fields) -> Instance:
        return self.ledger.transition(inst.id, to, reason=reason, actor=self.actor, **fields)

    # -- up ----------------------------------------------------------------------------
    @claims.exclusive
    def up(self, name: str, provider_name: str, request: Request, ssh_timeout: float | None = None,
           policy: str | None = None, after_verify: Callable[[Instance], None] | None = None) -> Instance:
        check_request(name, request)
        provider = self.provider(provider_name)
        provider.validate(request)
        from orchestrator.reconcile import leftover

        inst = leftover(self, name, provider_name, request)  # what an interrupted `orch up` left
        if inst is not None:
            self.say(f"[1/4] resuming {inst.label} ({inst.provider_id}), left {inst.state} by an interrupted `orch up`")
        else:
            _, public_key = config.ssh_key()
            inst = self.ledger.create_instance(
                actor=self.actor, name=name, provider=provider_name, label="", gpu=request.gpu,
                gpus=0 if request.cpu else request.gpus, cpu_only=request.cpu, disk_gb=request.disk_gb,
                image=request.image, spot=request.spot, bid=request.bid, policy=policy)
            self.say(f"[1/4] renting on {provider_name} as {inst.label}")
            kill_point("before-create")
            remote = self._create(provider, inst, request, public_key)
            kill_point("create-returned")
            price, stopped = provider.prices(remote)
            inst = self.move(inst, states.PROVISIONING, f"created {remote.provider_id}",
                             provider_id=remote.provider_id, price_hr=price, stopped_price_hr=stopped,
                             gpu_name=remote.gpu_name)
            kill_point("after-create")
        try:
            timeout = ssh_timeout or float(config.get("ssh_timeout_minutes", 20)) * 60
            self.say(f"[2/4] waiting for SSH (up to {timeout / 60:.0f} min)")
            kill_point("ssh-wait")
            remote = provider.wait_ssh(inst.provider_id, timeout, progress=lambda m: self.say(f"      {m}"))
            inst = self._endpoint(inst, provider, remote)
            kill_point("ssh-ready")
            self.say("[3/4] provisioning (torch for the device, then LibreYOLO)")
            with self.connect(inst) as c:
                from playbooks.provision import provision, verify

                facts = provision(c, gpu=not request.cpu, log=lambda m: self.say(f"      {m}"))
                kill_point("provisioned")
                self.say("[4/4] verifying: a 2000x2000 matmul on the device")
                proof = verify(c, gpu=not request.cpu)
            device = f"{proof['device']} (torch {facts['torch']}, matmul sum {proof['result']:.1f})"
            inst = self.move(inst, states.READY, f"verified on {proof['device']}", device=device[:255])
            if after_verify:
                after_verify(inst)
            from orchestrator import reaper

            reaper.arm(self, inst)  # the on-instance watchdog; a failure is reported, never fails up
        except BaseException as e:
            why = _why(e)
            self.say(f"failed: {why}; destroying {inst.label} so it does not keep billing")
            self._destroy(provider, self.ledger.get(inst.id), f"up failed: {why}")
            if isinstance(e, (KeyboardInterrupt, OrchError)):
                raise
            raise OrchError(f"up failed: {why}") from e
        return inst

    def _create(self, provider: Provider, inst: Instance, request: Request, public_key: str) -> Remote:
        try:
            return provider.create(request, inst.label, public_key)
        except BaseException as e:
            # The provider may have created it before failing: look before giving up.
            try:
                found = provider.find(inst.label)
            except ProviderError as lookup:
                self.ledger.note(inst.id, f"create failed ({_why(e)}) and the lookup failed too "
                                          f"({_why(lookup)}): reconcile will settle it", self.actor)
                raise ProviderError(f"creating {inst.label} failed and {provider.name} could not say whether it "
                                    f"was made anyway ({_why(lookup)}): run `orch reconcile` once it answers "
                                    "again") from e
            if found is not None:
                self.say(f"      the create errored ({_why(e)}) but {found.provider_id} exists: using it")
                return found
            self.move(inst, states.FAILED, f"create failed: {_why(e)}")
            raise

    def _endpoint(self, inst: Instance, provider: Provider, remote: Remote) -> Instance:
        ep = remote.endpoint
        fields = dict(ssh_host=ep.host, ssh_port=ep.port, ssh_user=ep.user)
        vouched = getattr(provider, "host_key", None)
        if vouched and not inst.host_key:
            fields["host_key"] = vouched(remote.provider_id)
        return self.ledger.update(inst.id, **fields)

    def connect(self, inst: Instance):
        """An SSH connection to the instance; pins the host key at first contact."""
        from orchestrator import remote

        if not inst.ssh_host:
            raise SSHError(f"{inst.name} has no SSH endpoint yet ({inst.state})")
        key, _ = config.ssh_key()

        def pin(line: str) -> None:
            self.ledger.update(inst.id, host_key=line)
            inst.host_key = line

        return remote.connect(inst.ssh_host, inst.ssh_port, inst.ssh_user or "root", key, inst.host_key, pin)

    # -- stop / start / down -----------------------------------------------------------
    @claims.exclusive
    def stop(self, inst: Instance, reason: str = "stopped by the user") -> Instance:
        provider = self.provider(inst.provider)
        if not provider.capabilities.stop:
            raise UsageError(f"stop is not supported by {inst.provider}: use `orch down {inst.name}`")
        if inst.state == states.STOPPED:
            return inst
        inst = self.move(inst, states.STOPPING, reason,
                         expect=(states.READY, states.PROVISIONING, states.PREEMPTED))
        try:
            provider.stop(inst.provider_id)
        except BaseException as e:
            self.move(inst, states.READY, f"stop failed: {_why(e)}")
            raise
        return self.move(inst, states.STOPPED, reason)

    @claims.exclusive
    def start(self, inst: Instance, reason: str = "started by the user") -> Instance:
        provider = self.provider(inst.provider)
        if inst.state == states.READY:
            return inst
        inst = self.move(inst, states.STARTING, reason, expect=(states.STOPPED, states.PREEMPTED))
        try:
            remote = provider.start(inst.provider_id)
            timeout = float(config.get("ssh_timeout_minutes", 20)) * 60
            remote = provider.wait_ssh(remote.provider_id, timeout, progress=lambda m: self.say(f"      {m}"))
        except StartRefused as e:
            self.move(inst, states.STOPPED, f"start refused: {_why(e)}")
            raise
        except BaseException as e:
            self.move(inst, states.STOPPED, f"start failed: {_why(e)}")
            raise
        inst = self._endpoint(inst, provider, remote)
        with self.connect(inst) as c:  # proves the pinned host key still matches
            from orchestrator import remote as r

            r.run(c, "true")
        price, stopped = provider.prices(remote)
        inst = self.move(inst, states.READY, reason, price_hr=price or inst.price_hr,
                         stopped_price_hr=stopped or inst.stopped_price_hr)
        from orchestrator import reaper

        reaper.rearm(self, inst)  # a stop ended the watchdog with everything else on the instance
        return inst

    @claims.exclusive
    def down(self, inst: Instance, reason: str = "destroyed by the user") -> Instance:
        return self._destroy(self.provider(inst.provider), inst, reason)

    def _destroy(self, provider: Provider, inst: Instance, reason: str) -> Instance:
        if inst.state == states.DESTROYED:
            return inst
        if inst.state != states.DESTROYING:
            inst = self.move(inst, states.DESTROYING, reason)
        if inst.provider_id is None:
            found = provider.find(inst.label)
            if found is not None:
                inst = self.ledger.update(inst.id, provider_id=found.provider_id)
        if inst.provider_id is not None:
            provider.destroy(inst.provider_id)
        return self.move(inst, states.DESTROYED, reason)

    # -- refresh -----------------------------------------------------------------------
    def sync(self, inst: Instance, remote: Remote | None) -> Instance:
        """Bring one ledger row in line with what its provider shows (None: not listed)."""
        if claims.busy(self.ledger, inst.name):
            return inst  # another orch process is moving it: what the provider shows is its business
        if remote is None or remote.status == GONE:
            if inst.state == states.DESTROYING:
                return self.move(inst, states.DESTROYED, "confirmed gone at the provider")
            if inst.state in states.LIVE and inst.state != states.REQUESTED:
                return self.move(inst, states.LOST, "gone at the provider without orch destroying it")
            return inst
        if remote.status == STOPPED and inst.state == states.READY:
            if inst.spot:
                return self.move(inst, states.PREEMPTED, "spot instance stopped by the provider (preempted)")
            return self.move(inst, states.STOPPED, "stopped at the provider (from inside or its console)")
        if remote.status == RUNNING and remote.endpoint and inst.state == states.READY:
            ep = remote.endpoint
            if (ep.host, ep.port) != (inst.ssh_host, inst.ssh_port):
                return self.ledger.update(inst.id, ssh_host=ep.host, ssh_port=ep.port)
        return inst

    def refresh(self, inst: Instance) -> Instance:
        if inst.provider_id is None or inst.state not in states.LIVE:
            return inst
        return self.sync(inst, self.provider(inst.provider).get(inst.provider_id))


def _why(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


__all__ = ["Orch", "check_request", "kill_point", "Request"]
