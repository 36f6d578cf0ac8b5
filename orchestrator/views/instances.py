"""What the CLI shows of an instance, shared by the fast SQLite read and the ledger proper.

The ``--json`` shape is part of orch's interface: keys are only ever added, never renamed.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator import states
from orchestrator.ledger import ledger_sql

FIELDS = ("id", "name", "provider", "provider_id", "state", "gpu", "gpu_name", "gpus", "cpu_only", "disk_gb",
          "spot", "bid", "price_hr", "stopped_price_hr", "ssh_host", "ssh_port", "ssh_user", "device",
          "protected", "created_at", "updated_at", "group_name", "node_rank", "group_size", "private_ip")
LIVE = tuple(sorted(states.LIVE))


def instance_dict(get) -> dict[str, Any]:
    """``get(field)`` reads one column from a model or a row."""
    d = {f: get(f) for f in FIELDS}
    for f in ("cpu_only", "spot", "protected"):
        d[f] = bool(d[f])
    for f in ("created_at", "updated_at"):
        v = d[f]
        d[f] = iso(v)
    d["ssh"] = f"{d.pop('ssh_user') or 'root'}@{d.pop('ssh_host')}:{d.pop('ssh_port')}" if d["ssh_host"] else None
    if d["ssh"] is None:
        d.pop("ssh_host"), d.pop("ssh_port"), d.pop("ssh_user")
    return d


def iso(v) -> str | None:
    """UTC as 2026-01-31T12:00:00Z, from an aware datetime or SQLite's stored text."""
    if v is None:
        return None
    if isinstance(v, datetime):
        v = v.astimezone(timezone.utc).replace(tzinfo=None) if v.tzinfo else v
        return v.isoformat(timespec="seconds") + "Z"
    return v.replace(" ", "T")[:19] + "Z"


def fast_read(db: Path, head: str, include_ended: bool, meta_keys: tuple[str, ...]
              ) -> tuple[list[dict], dict[str, str]] | None:
    """Instances and meta values straight from SQLite with the standard library; None when the
    database is missing or not at the schema head, so the caller opens the ledger properly
    (which migrates it)."""
    conn = ledger_sql.reader(db)
    if conn is None:
        return None
    try:
        conn.row_factory = sqlite3.Row
        if conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] != head:
            return None
        q = f"SELECT {', '.join(FIELDS)} FROM instances"
        if not include_ended:
            q += f" WHERE state IN ({', '.join('?' * len(LIVE))})"
        rows = conn.execute(q + " ORDER BY created_at", () if include_ended else LIVE).fetchall()
        meta = conn.execute(f"SELECT key, value FROM meta WHERE key IN ({', '.join('?' * len(meta_keys))})",
                            meta_keys).fetchall()
        return [instance_dict(row.__getitem__) for row in rows], {k: v for k, v in meta}
    except (sqlite3.Error, TypeError):
        return None
    finally:
        conn.close()


def model_dict(inst) -> dict[str, Any]:
    return instance_dict(lambda f: getattr(inst, f))


def age(stamp: str | None) -> str:
    if not stamp:
        return "-"
    secs = (datetime.now(timezone.utc) - datetime.fromisoformat(stamp.rstrip("Z")).replace(tzinfo=timezone.utc)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs / size:.0f}{unit}"
    return f"{max(secs, 0):.0f}s"


RUN_FIELDS = ("id", "model", "data", "epochs", "state", "run_dir", "pid", "completed_epochs", "best_metric",
              "mean_epoch_seconds", "gpu_name")


def run_dict(run, view: dict | None = None) -> dict[str, Any]:
    d = {f: getattr(run, f) for f in RUN_FIELDS}
    d["started_at"], d["ended_at"], d["pulled_at"] = iso(run.started_at), iso(run.ended_at), iso(run.pulled_at)
    if view:
        from orchestrator.runs.runs import progress_line

        d.update({k: view.get(k) for k in ("state", "epoch", "epochs", "eta_seconds", "loss", "best_metric",
                                             "best_metric_name", "error", "problems")})
        d["progress"] = progress_line(view)
    return d
