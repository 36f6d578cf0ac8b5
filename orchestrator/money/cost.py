"""What every instance cost, from the ledger's events and the price paid at launch.

Never from today's catalog: prices change, and a report built on them is wrong about the past.
Time in a compute-billing state (``states.BILLING_COMPUTE``) costs ``price_hr``; time in a
disk-only state (``states.BILLING_DISK_ONLY``) costs ``stopped_price_hr``. **Idle waste** is the
compute time billed after a training run ended, until the instance stopped or was destroyed
(or the next run began): money that bought nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone

from orchestrator import states
from orchestrator.errors import UsageError


def _utc(dt: datetime) -> datetime:
    if dt.tzinfo is timezone.utc:  # the ledger's own: as it is
        return dt
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


@dataclass
class Cost:
    name: str
    instance_id: str
    provider: str
    state: str
    price_hr: float
    stopped_price_hr: float
    running_hours: float = 0.0
    stopped_hours: float = 0.0
    running_usd: float = 0.0
    stopped_usd: float = 0.0
    total_usd: float = 0.0
    idle_hours: float = 0.0
    idle_usd: float = 0.0
    group_name: str | None = None  # a node of a group (`--nodes N`), and its rank
    node_rank: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def intervals(events, until: datetime) -> list[tuple[datetime, datetime, str]]:
    """(start, end, state) for every stretch of the timeline; the last one runs to ``until`` if live."""
    evs = sorted(events, key=lambda e: (_utc(e.at), e.id or 0))
    out = []
    for cur, nxt in zip(evs, evs[1:] + [None]):
        start = _utc(cur.at)
        end = _utc(nxt.at) if nxt is not None else (until if cur.to_state in states.LIVE else start)
        if end > start:
            out.append((start, end, cur.to_state))
    return out


def _overlap(a0, a1, b0, b1) -> float:
    """Hours shared by [a0, a1) and [b0, b1)."""
    lo, hi = max(a0, b0), min(a1, b1)
    return max((hi - lo).total_seconds(), 0.0) / 3600


def instance_cost(inst, events, runs, since: datetime | None = None, until: datetime | None = None) -> Cost:
    until = _utc(until or datetime.now(timezone.utc))
    since = _utc(since) if since else datetime.min.replace(tzinfo=timezone.utc)
    grouped = (getattr(inst, "group_size", None) or 1) > 1  # a node of a group (a plain row has no such fields)
    c = Cost(inst.name, inst.id, inst.provider, inst.state, inst.price_hr, inst.stopped_price_hr,
             group_name=inst.group_name if grouped else None, node_rank=inst.node_rank if grouped else None)
    spans = intervals(events, until)
    starts = sorted(_utc(r.started_at) for r in runs)
    waste_windows = []
    for r in runs:
        if r.ended_at is None:
            continue
        end = _utc(r.ended_at)
        # until the instance stopped billing compute (stopped, destroyed) or the next run began
        stops = [s for s, _, state in spans if s >= end and state not in states.BILLING_COMPUTE]
        waste_windows.append((end, min([s for s in starts if s > end] + stops[:1] + [until])))
    for start, end, state in spans:
        if state in states.BILLING_COMPUTE:
            c.running_hours += _overlap(start, end, since, until)
            c.idle_hours += sum(_overlap(start, end, max(w0, since), min(w1, until)) for w0, w1 in waste_windows)
        elif state in states.BILLING_DISK_ONLY:
            c.stopped_hours += _overlap(start, end, since, until)
    c.running_usd = c.running_hours * c.price_hr
    c.stopped_usd = c.stopped_hours * c.stopped_price_hr
    c.total_usd = c.running_usd + c.stopped_usd
    c.idle_usd = c.idle_hours * c.price_hr
    return c


def report(ledger, name: str | None = None, since: datetime | None = None,
           until: datetime | None = None) -> tuple[list[Cost], dict[str, dict[str, float]]]:
    """Every instance's cost (those named ``name``, or the nodes of the group ``name``, if given) and the totals per provider, from the
    ledger read whole (``snapshot``: one query per table, whatever the fleet's size) or from a
    snapshot already read."""
    from orchestrator.ledger import ledger_snapshot

    snap = ledger if isinstance(ledger, ledger_snapshot.Snapshot) else ledger_snapshot.read(ledger, name=name)
    insts = [i for i in snap.instances if name is None or name in (i.name, getattr(i, "group_name", None))]
    if name is not None and not insts:
        raise UsageError(f"no instance named {name!r} in the ledger")
    until = _utc(until or datetime.now(timezone.utc))  # one clock for every instance
    costs = []
    with ledger_snapshot.quiet_gc():  # ten thousand costs and their intervals, no cycle among them
        for inst in insts:
            c = instance_cost(inst, snap.events_of(inst.id), snap.runs_of(inst.id), since, until)
            if name is not None or c.running_hours or c.stopped_hours or inst.state in states.LIVE:
                costs.append(c)
    totals: dict[str, dict[str, float]] = {}
    for c in costs:
        t = totals.setdefault(c.provider, {"running_usd": 0.0, "stopped_usd": 0.0, "total_usd": 0.0,
                                           "idle_usd": 0.0, "running_hours": 0.0, "stopped_hours": 0.0})
        for k in t:
            t[k] += getattr(c, k)
    return costs, totals


def groups(costs: list[Cost]) -> dict[str, dict]:
    """Each group's total and what each of its nodes cost (a group bills as its nodes together)."""
    out: dict[str, dict] = {}
    for c in costs:
        if c.group_name is None:
            continue
        g = out.setdefault(c.group_name, {"provider": c.provider, "total_usd": 0.0, "running_usd": 0.0,
                                          "stopped_usd": 0.0, "idle_usd": 0.0, "nodes": []})
        for k in ("total_usd", "running_usd", "stopped_usd", "idle_usd"):
            g[k] += getattr(c, k)
        g["nodes"].append({"name": c.name, "node_rank": c.node_rank, "total_usd": c.total_usd})
    for g in out.values():
        g["nodes"].sort(key=lambda n: n["node_rank"] or 0)  # rank order, whichever node was made first
    return out


def show(ledger, name: str | None = None, start: datetime | None = None, as_json: bool = False,
         period=None) -> None:
    """``orch cost``: the report as plain columns (``text.columns``: Rich's table took seconds
    for ten thousand rows) or JSON, and ``period`` (``budget.Standing``: this period against the
    budget) where one is set. Needs no Typer: ``cli.main`` answers ``orch cost`` with it
    (``budget.show_cost``)."""
    import json

    from orchestrator.volumes import volumes

    rows, totals = report(ledger, name, start)
    vols = volumes.costs(ledger, start) if name is None else []  # each volume bills from its creation
    if as_json:
        print(json.dumps({"since": start.isoformat() if start else None, "instances": [r.to_dict() for r in rows],
                          "providers": totals, "groups": groups(rows), "volumes": vols,
                          "budget": period.to_dict() if period else None}, indent=2, sort_keys=True, default=str))
        return
    if not rows and not vols:
        print("nothing billed" + (f" since {start:%Y-%m-%d %H:%M}Z" if start else ""))
    elif not rows:
        _volumes(vols)
    else:
        _instances(rows, totals)
        _volumes(vols)
    for line in period.lines() if period else []:
        print(line)


def _instances(rows: list[Cost], totals: dict) -> None:
    import sys

    from orchestrator.text import columns

    table = [(r.name, r.provider, r.state, f"{r.running_hours:.2f} h ${r.running_usd:.2f}",
              f"{r.stopped_hours:.2f} h ${r.stopped_usd:.2f}", f"${r.total_usd:.2f}",
              f"{r.idle_hours:.2f} h ${r.idle_usd:.2f}" if r.idle_hours else "-") for r in rows]
    sys.stdout.write(columns(("NAME", "PROVIDER", "STATE", "RUNNING", "STOPPED", "TOTAL", "IDLE WASTE"), table,
                             right=frozenset({3, 4, 5, 6})))
    print("running at the price paid at launch, stopped at the disk's rate; idle waste: billed after the training ended")
    for group, g in sorted(groups(rows).items()):
        nodes = ", ".join(f"{n['name']} ${n['total_usd']:.2f}" for n in g["nodes"])
        print(f"group {group:<10} total ${g['total_usd']:.2f} over {len(g['nodes'])} nodes ({nodes})")
    for provider, tot in sorted(totals.items()):
        print(f"{provider:<10} total ${tot['total_usd']:.2f} (running ${tot['running_usd']:.2f}, stopped "
              f"${tot['stopped_usd']:.2f}), idle waste ${tot['idle_usd']:.2f}")


def _volumes(vols: list[dict]) -> None:
    """Each volume's dollars since its creation (size x $/GB-month, prorated), then their total."""
    import sys

    from orchestrator.text import columns

    if not vols:
        return
    table = [(v["name"], v["provider"], v["state"], f"{v['size_gb']} GB",
              f"${v['price_gb_month']:.3f}" if v["price_gb_month"] is not None else "?",
              f"{v['hours']:.2f} h", f"${v['usd']:.2f}") for v in vols]
    sys.stdout.write(columns(("VOLUME", "PROVIDER", "STATE", "SIZE", "$/GB-MONTH", "BILLED", "TOTAL"), table,
                             right=frozenset({3, 4, 5, 6})))
    print(f"volumes    total ${sum(v['usd'] for v in vols):.2f} (size x $/GB-month, from creation to deletion)")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``2026-07-31``, ``2026-07-31T12:00``, or a span back from now: ``7d``, ``12h``, ``30m``."""
    now = _utc(now or datetime.now(timezone.utc))
    t = text.strip()
    if t[:-1].replace(".", "", 1).isdigit() and t[-1:] in ("d", "h", "m"):
        unit = {"d": "days", "h": "hours", "m": "minutes"}[t[-1]]
        try:
            return now - timedelta(**{unit: float(t[:-1])})
        except OverflowError:  # before year 1: everything the ledger holds
            return datetime.min.replace(tzinfo=timezone.utc)
    try:
        return _utc(datetime.fromisoformat(t.replace("Z", "+00:00")))
    except ValueError:
        raise UsageError(f"--since takes a date (2026-07-31), a time (2026-07-31T12:00) or a span (7d, 12h), "
                         f"not {text!r}") from None
