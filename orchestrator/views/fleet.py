"""``orch status`` without a name: the fleet from the ledger, with no Typer and no SQLAlchemy.

This is the command people run most, often in a loop: on a SQLite ledger at the schema head it
reads with the standard library alone (SQLAlchemy takes 0.2 s to import, Typer's parameter
adapters 0.1 s). Anything else (PostgreSQL, a ledger to migrate) opens the ledger proper.
"""

from __future__ import annotations

import json
import sys

from orchestrator import states

META_KEYS = ("reconcile:last_run", "reconcile:last_report")


def read(include_ended: bool) -> tuple[list[dict], dict]:
    """(instances as their --json dicts, the reconcile meta values)."""
    from migrations import HEAD
    from orchestrator import config
    from orchestrator.views.instances import fast_read

    url = config.database_url()
    db = config.sqlite_path(url) if url.startswith("sqlite") else None
    fast = fast_read(db, HEAD, include_ended, META_KEYS) if db is not None else None
    if fast is not None:
        return fast
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.views.instances import model_dict

    ledger = Orch.open().ledger
    return ([model_dict(i) for i in ledger.instances(live_only=not include_ended)],
            {k: ledger.get_meta(k) for k in META_KEYS})


def show(include_ended: bool, as_json: bool, refreshed: bool = False) -> None:
    rows, meta = read(include_ended)
    mounted = attached()
    if as_json:
        for r in rows:  # what each instance mounts (``orch volume``): [] for most
            r["volumes"] = [{"volume": v["volume"], "path": v["path"]} for v in mounted.get(r["id"], [])]
        print(json.dumps(rows, indent=2, sort_keys=True, default=str))
        return
    sys.stdout.write(table(rows))
    for found in sorted(mounted.values(), key=lambda f: f[0]["instance"]):
        print(f"{found[0]['instance']} mounts " + ", ".join(f"volume {v['volume']} at {v['path']}" for v in found))
    print(reconcile_note(meta.get(META_KEYS[0]), meta.get(META_KEYS[1])))
    if rows and not refreshed:
        print("states as the ledger last saw them: `orch status --refresh` asks each provider now")


def attached() -> dict[str, list[dict]]:
    """Instance id -> the volumes it mounts, read as the fleet is (no SQLAlchemy on SQLite)."""
    from orchestrator import config
    from orchestrator.volumes import volume_snapshot, volumes

    return volumes.attached(volume_snapshot.Unopened(config.database_url()))


def table(rows: list[dict]) -> str:
    """Plain aligned columns: Rich's Table takes most of a second for a thousand rows."""
    from orchestrator.text import clean
    from orchestrator.text import columns
    from orchestrator.views.instances import age

    if not rows:
        return "no instances (start one with `orch up NAME`)\n"
    out = []

    def line(r, name):
        gpu = "cpu" if r["cpu_only"] else f"{r['gpus']}x {clean(r['gpu_name'] or r['gpu'], 40) or '?'}"
        return (name, r["provider"], r["state"], gpu, f"{r['price_hr']:.3f}", r["ssh"] or "-", age(r["created_at"]))

    done: set = set()
    for r in rows:
        if r["id"] in done:
            continue
        if (r.get("group_size") or 1) <= 1:
            out.append(line(r, r["name"]))
            continue
        # A group: one line for it (its states, what it bills together), then its nodes by rank.
        key = (r.get("group_name"), r.get("group_size"))
        nodes = sorted((n for n in rows if (n.get("group_name"), n.get("group_size")) == key and n["id"] not in done),
                       key=lambda n: n.get("node_rank") or 0)
        done |= {n["id"] for n in nodes}
        billing = sum(n["price_hr"] or 0.0 for n in nodes if n["state"] in states.LIVE)  # not a node it replaced
        out.append((key[0], r["provider"], "/".join(sorted({n["state"] for n in nodes})), f"{key[1]} nodes",
                    f"{billing:.3f}", f"orch ssh {key[0]} --node R", age(r["created_at"])))
        out += [line(n, f"  {n['name']} (rank {n.get('node_rank')})") for n in nodes]
    return columns(("NAME", "PROVIDER", "STATE", "GPU", "$/HR", "SSH", "AGE"), out)


def reconcile_note(last_run: str | None, last_report: str | None) -> str:
    """What ``orch status`` says about reconcile, from the two meta values reconcile writes."""
    from orchestrator.views.instances import age

    if not last_run:
        return "reconcile: never run (`orch reconcile` checks the ledger against every provider)"
    note = f"reconcile: last ran {age(last_run)} ago ({last_run})"
    try:
        errors = json.loads(last_report or "{}").get("errors") or {}
    except (ValueError, AttributeError):
        errors = {}
    if errors:
        note += f"; it could not check {', '.join(sorted(errors))}"
    return note
