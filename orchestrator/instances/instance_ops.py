"""What every operation on one instance stands on: its provider, a state moved, an SSH connection,
a destroy with its intent written first.

The lifecycle's ``Orch`` is built on this class (it adds up, stop, start, refresh), and the modules
below the lifecycle (``reconcile``, ``sync``, ``watchdog``, ``volumes``, ``volume_mounts``,
``runs``, ``training``) are handed an ``Orch`` but call only what is defined here: so the layer map
holds at run time too, and reconcile's or sync's destroy is no call back up into the lifecycle.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from orchestrator import config, states
from orchestrator.ledger import claims
from orchestrator.ssh import reach
from orchestrator.errors import OrchError, ProviderError, SSHError
from orchestrator.provider import Provider
from orchestrator.text import why as _why

if TYPE_CHECKING:  # SQLAlchemy and SQLModel load with the ledger, when it is opened (0.3 s)
    from orchestrator.ledger.ledger import Instance, Ledger


@dataclass
class InstanceOps:
    """The ledger, orch's home, who is acting, where to report; and the operations on one instance
    that every layer above the checks may call."""

    ledger: Ledger
    home: Path
    actor: str = "cli"
    say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)

    # -- providers ---------------------------------------------------------------------
    def provider(self, name: str) -> Provider:
        from orchestrator.provider import plugins

        cache = self.__dict__.setdefault("_providers", {})
        if name not in cache:
            settings, cls = config.provider_settings(name), plugins.provider_class(name)
            if config.get("spot_margin") is not None and "spot_margin" in cls.known_settings():
                settings.setdefault("spot_margin", config.get("spot_margin"))  # where it bids at all
            cache[name] = cls(settings, self.home)
        return cache[name]

    def move(self, inst: Instance, to: str, reason: str = "", **fields) -> Instance:
        return self.ledger.transition(inst.id, to, reason=reason, actor=self.actor, **fields)

    def connect(self, inst: Instance, rekey: bool = False):
        """An SSH connection to the instance, its host key pinned at first contact. The recorded
        route is kept while it answers; when it does not, the provider's other routes are tried and
        the one that answers is recorded. ``rekey`` (only right after a start orch asked for, on a
        provider whose images make new host keys at every start): a new key is pinned and recorded."""
        from orchestrator.ssh import remote

        if not inst.ssh_host:
            raise SSHError(f"{inst.name} has no SSH endpoint yet ({inst.state})")
        key, _ = config.ssh_key()

        def pin(line: str) -> None:
            if inst.host_key and line != inst.host_key:
                self.ledger.note(inst.id, f"host key changed at the start orch asked for: pinned {_fingerprint(line)} "
                                          f"(was {_fingerprint(inst.host_key)})", self.actor)
            self.ledger.update(inst.id, host_key=line)
            inst.host_key = line

        def open_(i: Instance):
            return remote.connect(i.ssh_host, i.ssh_port, i.ssh_user or "root", key, i.host_key, pin, rekey=rekey)

        try:
            return open_(inst)
        except SSHError:
            moved = self._reroute(inst)
            if moved is None:
                raise
            inst.ssh_host, inst.ssh_port, inst.ssh_user = moved.ssh_host, moved.ssh_port, moved.ssh_user
            return open_(inst)

    def _reroute(self, inst: Instance) -> Instance | None:
        """Another route to the instance that answers now (the provider's), recorded; None if none."""
        if inst.provider_id is None:
            return None
        try:
            provider = self.provider(inst.provider)
            found = reach.reachable(provider.get(inst.provider_id))
        except OrchError:
            return None
        if found is None or (found.endpoint.host, found.endpoint.port) == (inst.ssh_host, inst.ssh_port):
            return None
        ep = found.endpoint
        self.ledger.note(inst.id, f"SSH route {inst.ssh_host}:{inst.ssh_port} stopped answering: now {ep.host}:{ep.port}",
                         self.actor)
        return self.ledger.update(inst.id, ssh_host=ep.host, ssh_port=ep.port, ssh_user=ep.user)

    # -- down -------------------------------------------------------------------------------
    @claims.exclusive
    def down(self, inst: Instance, reason: str = "destroyed by the user") -> Instance:
        return self._destroy(self.provider(inst.provider), inst, reason)

    def _destroy(self, provider: Provider, inst: Instance, reason: str) -> Instance:
        if inst.state == states.DESTROYED:
            return inst
        if inst.state != states.DESTROYING:
            inst = self.move(inst, states.DESTROYING, reason)
        try:
            if inst.provider_id is None:
                found = provider.find(inst.label)
                if found is not None:
                    inst = self.ledger.update(inst.id, provider_id=found.provider_id)
            if inst.provider_id is not None:
                provider.destroy(inst.provider_id)
        except ProviderError as e:
            # The intent stays recorded: the next reaper pass (or `orch reconcile`) finishes the destroy
            # once the provider answers; nothing is marked destroyed that may still bill.
            raise ProviderError(f"destroying {inst.name} on {provider.name} failed ({_why(e)}): it is recorded "
                                "destroying, and the next reaper pass or `orch reconcile` finishes the destroy once "
                                f"{provider.name} answers") from e
        return self.move(inst, states.DESTROYED, reason)


def _fingerprint(line: str) -> str:
    import base64
    import hashlib

    try:
        blob = base64.b64decode(line.split()[1])
    except (IndexError, ValueError):
        return "?"
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
