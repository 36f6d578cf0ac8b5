"""The grace after a create: an instance this process has just made, which a lookup does not
show yet, is pending, not gone. Lookups and listings lag a create (EC2's eventual consistency,
RunPod's and Lambda's listings); without the grace a destroy right after a create would find
nothing to terminate. A provider whose lookups lag holds one ``JustMade`` and asks it in
``get`` (and so in ``destroy``)."""

from __future__ import annotations

import threading
import time

from orchestrator.provider.model import Remote, Status


class JustMade:
    def __init__(self, grace: float):
        self.grace = grace
        self._made: dict[str, float] = {}
        self._lock = threading.Lock()  # a group's nodes are made by threads sharing one provider

    def made(self, provider_id: str) -> None:
        """This process has just created ``provider_id``."""
        with self._lock:
            self._made[str(provider_id)] = time.monotonic()

    def seen(self, provider_id: str) -> None:
        """The provider has shown it: from now on, not showing it means gone."""
        with self._lock:
            self._made.pop(str(provider_id), None)

    def never_seen(self, provider_id: str) -> bool:
        """Made by this process and not shown by the provider since, however long ago: its absence
        from a lookup is no proof that it is gone (a destroy still sends the terminate)."""
        with self._lock:
            return str(provider_id) in self._made

    def unseen(self, provider_id: str) -> Remote | None:
        """What to say of an instance the provider does not show: pending within the grace of this
        process's own create of it, until the provider first shows it; None otherwise (gone)."""
        with self._lock:
            at = self._made.get(str(provider_id))
        if at is None or time.monotonic() - at >= self.grace:
            return None
        return Remote(provider_id=str(provider_id), label="", status=Status.PENDING,
                      detail="not visible yet (just created)")
