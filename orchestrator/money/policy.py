"""Per-instance reaper policy, stored as JSON on the instance's ledger row.

Flags on ``orch up`` beat ``[policy]`` in config.toml, which beats the defaults here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from orchestrator.errors import UsageError

ON_IDLE = ("auto", "stop", "destroy")


@dataclass(frozen=True)
class Policy:
    idle_minutes: float = 10.0
    max_hours: float = 0.0  # 0: no deadline
    on_idle: str = "auto"  # auto: the stop-vs-destroy break-even decides
    rebuild_cost: float | None = None  # $; None: estimated from the ledger

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def from_flags(idle_minutes=None, max_hours=None, on_idle=None, rebuild_cost=None) -> str:
    from orchestrator import config

    merged = {"idle_minutes": config.policy("idle_minutes", 10.0), "max_hours": config.policy("max_hours", 0.0),
              "on_idle": config.policy("on_idle", "auto"), "rebuild_cost": config.policy("rebuild_cost", None)}
    for key, value in (("idle_minutes", idle_minutes), ("max_hours", max_hours), ("on_idle", on_idle),
                       ("rebuild_cost", rebuild_cost)):
        if value is not None:
            merged[key] = value
    if not 0 < float(merged["idle_minutes"]) <= 100_000:
        raise UsageError(f"--idle-minutes must be above 0, not {merged['idle_minutes']}")
    if not 0 <= float(merged["max_hours"]) <= 100_000:
        raise UsageError(f"--max-hours must be 0 (none) or more, not {merged['max_hours']}")
    if merged["on_idle"] not in ON_IDLE:
        raise UsageError(f"--on-idle must be one of {', '.join(ON_IDLE)}, not {merged['on_idle']!r}")
    if merged["rebuild_cost"] is not None and not 0 <= float(merged["rebuild_cost"]) < 1e6:
        raise UsageError(f"--rebuild-cost must be a $ amount >= 0, not {merged['rebuild_cost']}")
    return Policy(**merged).to_json()


def of(instance) -> Policy:
    try:
        return Policy(**json.loads(instance.policy)) if instance.policy else Policy()
    except (TypeError, ValueError):
        return Policy()
