"""An unhealthy instance: wait ``unhealthy_grace``, send one ``/instance-operations/restart``, wait
again, and only then report it broken (and ``up`` or the reaper destroys it).

``unhealthy`` is not final (Lambda's OpenAPI description, InstanceStatus; SkyPilot's Lambda
provisioner, github.com/skypilot-org/skypilot, sky/provision/lambda_cloud/instance.py, maps it to
INIT, not to a failure). The time an instance was first seen unhealthy, and its restart, are kept in
orch's home, so a reaper that runs as a new process each pass still counts from the first sighting.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from orchestrator.provider import Status
from providers.lambda_cloud.api import ERRORS, Session, lambda_id

UNHEALTHY_GRACE_S = 300.0


class Unhealthy:
    """The memory of unhealthy instances (``lambda-unhealthy.json`` in orch's home; this object's
    own where there is no home) and the one restart each gets."""

    def __init__(self, api: Session, home, grace: float = UNHEALTHY_GRACE_S):
        self.api, self.grace = api, grace
        self.path = Path(home) / "lambda-unhealthy.json" if home else None
        self._kept: dict = {}

    def _memory(self) -> dict:
        if self.path is None:
            return self._kept
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _keep(self, memory: dict) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(memory))
        tmp.replace(self.path)

    def judge(self, provider_id: str, unhealthy: bool) -> tuple[Status, str] | None:
        """(status, detail) of an unhealthy instance, counted from its first sighting: pending for the
        grace, then one restart and pending again as long, then broken. None for one that is not
        unhealthy (its sighting is forgotten)."""
        memory = self._memory()
        if not unhealthy:
            if provider_id in memory:
                memory.pop(provider_id)
                self._keep(memory)
            return None
        now, grace = time.time(), self.grace
        seen = memory.get(provider_id) if isinstance(memory.get(provider_id), dict) else None
        if seen is None:
            seen = memory[provider_id] = {"since": now, "restarted": None}
            self._keep(memory)
        since, restarted = float(seen.get("since") or now), seen.get("restarted")
        if restarted is None:
            if now - since < grace:
                return Status.PENDING, f"unhealthy for {now - since:.0f} s: waiting for Lambda to recover it"
            try:
                self.api.call("POST", "/instance-operations/restart", {"instance_ids": [lambda_id(provider_id)]})
                note = "restarted once"
            except ERRORS as e:
                note = f"its restart was refused ({e})"
            seen["restarted"] = now
            self._keep(memory)
            return Status.PENDING, f"unhealthy for {now - since:.0f} s: {note}, waiting again"
        if now - float(restarted) < grace:
            return Status.PENDING, f"unhealthy for {now - since:.0f} s: restarted once, waiting again"
        return Status.BROKEN, f"unhealthy for {now - since:.0f} s, before and after a restart: given up"
