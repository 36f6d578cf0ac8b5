"""``orch dashboard``: the fleet on one local web page, and the same figures as JSON under ``/api/``.

It reads the ledger and the run files orch pulled, and changes nothing: no ledger write, no
provider call. The page is rendered here, with every value from the ledger or an instance
HTML-escaped, and the plots are inline SVG: no script, no CDN, nothing fetched from anywhere
(a Content-Security-Policy says so to the browser too). The server listens on 127.0.0.1 only and
answers only requests addressed to 127.0.0.1 or localhost (a page elsewhere that rebinds its own
name to 127.0.0.1 gets nothing).

Routes: ``/`` the page; ``/api/instances`` (``?all=1`` with ended ones), ``/api/instances/NAME``,
``/api/spend``, ``/api/runs``; a POST to ``/monitor/NAME`` from the dashboard's own page (its
``Origin``) starts ``orch monitor NAME`` (the forward to the run's ``libreyolo monitor``) as a child
process and redirects there. A GET changes nothing: it redirects to a monitor already running, or
offers the button that POSTs (a plain GET from curl or another local process starts no process).

Figures: spend is ``cost``'s arithmetic (time in each state at the price paid at launch); uptime
is the time since the instance last began billing compute; "idle for" is what the ledger knows:
since its last run ended (or it became ready), or the reaper last saw it busy.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import stat
import subprocess
import sys
import threading
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from orchestrator import config, states
from orchestrator.money import cost
from orchestrator.errors import OrchError, UsageError
from orchestrator.text import clean
from orchestrator.views.instances import age, iso, model_dict, run_dict

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
METRICS_MAX_BYTES = 4 << 20  # the tail of metrics.jsonl that is read: a run of any length fits many times
METRICS_MAX_LINE = 64 << 10
REFRESH_S = 15
MONITOR_WAIT_S = 120.0


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _now() -> datetime:
    return datetime.now(timezone.utc)


# -- reading the ledger ----------------------------------------------------------------------------
def open_ledger():
    """The ledger as it is, never migrated or made here; None while there is none yet."""
    from migrations import HEAD
    from orchestrator.ledger.ledger import Ledger

    url = config.database_url()
    if url.startswith("sqlite") and not config.sqlite_path(url).is_file():
        return None
    ledger = Ledger(url, upgrade=False)
    found = ledger.revision()
    if found != HEAD:
        raise UsageError(f"the ledger is at schema {found or 'none'}, this orch at {HEAD}: run `orch db upgrade` "
                         "(the dashboard changes nothing, not even the schema)")
    return ledger


class Snapshot:
    """Everything the page shows, read once per request."""

    def __init__(self, ledger, home: Path, now: datetime | None = None):
        self.now = _utc(now) or _now()
        self.home = home
        self.instances = ledger.instances() if ledger is not None else []
        self.events: dict[str, list] = {}
        for e in ledger.events() if ledger is not None else []:
            self.events.setdefault(e.instance_id, []).append(e)
        self.runs: dict[str, list] = {}
        for r in ledger.runs() if ledger is not None else []:
            self.runs.setdefault(r.instance_id, []).append(r)
        self._ledger = ledger

    # -- instances --------------------------------------------------------------------------------
    def instance(self, inst) -> dict[str, Any]:
        events = self.events.get(inst.id, [])
        runs = self.runs.get(inst.id, [])
        d = model_dict(inst)
        spent = cost.instance_cost(inst, events, runs, until=self.now)
        billing_since = self._billing_since(events) if inst.state in states.BILLING_COMPUTE else None
        d["spend_usd"] = round(spent.total_usd, 6)
        d["uptime_s"] = (self.now - billing_since).total_seconds() if billing_since else None
        idle_since = self._idle_since(inst, billing_since, runs)
        d["idle_s"] = max((self.now - idle_since).total_seconds(), 0.0) if idle_since else None
        since = next((e.at for e in reversed(events) if e.to_state == inst.state and e.from_state != e.to_state), None)
        d["state_since"] = iso(since)
        return d

    def _billing_since(self, events) -> datetime | None:
        """When the stretch of compute-billing states that reaches now began."""
        since = None
        for start, _end, state in cost.intervals(events, self.now):
            since = (since or start) if state in states.BILLING_COMPUTE else None
        return since

    def _idle_since(self, inst, billing_since, runs) -> datetime | None:
        if inst.state != states.READY:
            return None
        latest = runs[-1] if runs else None
        if latest is not None and latest.ended_at is None and latest.state in ("starting", "running"):
            return None
        seen = [billing_since, _utc(latest.ended_at) if latest is not None else None, self._busy_seen(inst)]
        seen = [t for t in seen if t is not None]
        return max(seen) if seen else None

    def _busy_seen(self, inst) -> datetime | None:
        try:
            memory = json.loads(inst.memory) if inst.memory else {}
            return _utc(datetime.fromisoformat(memory["busy_seen_at"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def fleet(self, include_ended: bool) -> list[dict]:
        return [self.instance(i) for i in self.instances if include_ended or i.state in states.LIVE]

    def detail(self, name: str) -> dict | None:
        """One instance by name (the newest of that name), with its events and runs."""
        found = [i for i in self.instances if i.name == name]
        if not found:
            return None
        inst = max(found, key=lambda i: (i.state in states.LIVE, _utc(i.created_at)))
        d = self.instance(inst)
        d["events"] = [{"at": iso(e.at), "from": e.from_state, "to": e.to_state, "reason": e.reason,
                        "actor": e.actor} for e in self.events.get(inst.id, [])]
        d["runs"] = [run_dict(r) for r in self.runs.get(inst.id, [])]
        return d

    # -- spend over time --------------------------------------------------------------------------
    def spend(self) -> dict:
        """Per provider, the money spent up to each of its instances' events (a point per event),
        and the total up to now."""
        spans: dict[str, list] = {}
        marks: dict[str, list] = {}
        for inst in self.instances:
            events = self.events.get(inst.id, [])
            for start, end, state in cost.intervals(events, self.now):
                rate = inst.price_hr if state in states.BILLING_COMPUTE else \
                    inst.stopped_price_hr if state in states.BILLING_DISK_ONLY else 0.0
                if rate:
                    spans.setdefault(inst.provider, []).append((start, end, rate))
            for e in events:
                marks.setdefault(inst.provider, []).append((_utc(e.at), e.id or 0, inst.name, e))
        out = {}
        for provider in sorted(marks):
            points = sorted(marks[provider], key=lambda m: (m[0], m[1]))
            usd = _cumulative(spans.get(provider, []), [m[0] for m in points] + [self.now])
            out[provider] = {
                "total_usd": round(usd[-1], 6),
                "points": [{"at": iso(at), "usd": round(v, 6), "instance": name, "from": e.from_state,
                            "to": e.to_state, "actor": e.actor}
                           for (at, _, name, e), v in zip(points, usd)],
            }
        return {"now": iso(self.now), "providers": out}

    def budget(self) -> dict | None:
        """This period against ``[budget]`` (``budget.standing``); None where none is set."""
        from orchestrator.money import budget

        st = budget.standing(self._ledger, self.now) if self._ledger is not None else None
        return st.to_dict() if st else None

    # -- runs -------------------------------------------------------------------------------------
    def run_rows(self) -> list[dict]:
        """Every run, newest first; the latest run of each instance name carries the loss curve from
        the metrics.jsonl orch pulled (the pulled folder is per name)."""
        by_id = {i.id: i for i in self.instances}
        latest_of_name: dict[str, int] = {}
        for inst_id, runs in self.runs.items():
            inst = by_id.get(inst_id)
            for r in runs:
                if inst is not None and (inst.name not in latest_of_name or r.id > latest_of_name[inst.name]):
                    latest_of_name[inst.name] = r.id
        rows = []
        for inst_id, runs in self.runs.items():
            inst = by_id.get(inst_id)
            if inst is None:
                continue
            for r in runs:
                d = run_dict(r)
                d["instance"] = inst.name
                d["instance_state"] = inst.state
                curve = loss_curve(self.home / "runs" / inst.name / "metrics.jsonl") \
                    if latest_of_name.get(inst.name) == r.id and NAME.fullmatch(inst.name) else []
                d["loss_curve"] = [{"epoch": ep, "loss": loss} for ep, loss in curve]
                done = max([d["completed_epochs"] or 0] + [ep for ep, _ in curve])
                d["progress"] = min(done / r.epochs, 1.0) if r.epochs else None
                d["monitor"] = inst.state == states.READY and bool(r.run_dir) and \
                    latest_of_name.get(inst.name) == r.id
                rows.append(d)
        return sorted(rows, key=lambda d: d["id"], reverse=True)


def _cumulative(spans: list[tuple[datetime, datetime, float]], times: list[datetime]) -> list[float]:
    """Dollars spent up to each of ``times`` (sorted), from (start, end, $/hr) spans: one sweep."""
    deltas = sorted([(s, r) for s, _, r in spans] + [(e, -r) for _, e, r in spans], key=lambda d: d[0])
    out, usd, rate, last, i = [], 0.0, 0.0, None, 0
    for t in times:
        while i < len(deltas) and deltas[i][0] <= t:
            at, change = deltas[i]
            if last is not None:
                usd += rate * (at - last).total_seconds() / 3600
            rate, last, i = rate + change, at, i + 1
        if last is not None:
            usd += max(rate, 0.0) * (t - last).total_seconds() / 3600
            last = t
        out.append(usd)
    return out


def loss_curve(path: Path) -> list[tuple[int, float]]:
    """(epoch, train loss) from a pulled metrics.jsonl, which came from an instance: only its tail
    is read, never through a link, and only rows with a sane epoch and a finite loss are kept."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return []
        if st.st_size > METRICS_MAX_BYTES:
            f.seek(st.st_size - METRICS_MAX_BYTES)
            f.readline()  # a partial line
        data = f.read(METRICS_MAX_BYTES)
    found: dict[int, float] = {}
    for line in data.split(b"\n"):
        if not line.strip() or len(line) > METRICS_MAX_LINE:
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            continue
        if not isinstance(row, dict):
            continue
        epoch, loss = row.get("epoch"), row.get("train/loss")
        if isinstance(epoch, int) and not isinstance(epoch, bool) and 0 <= epoch <= 1_000_000 \
                and isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss) \
                and abs(loss) < 1e12:
            found[epoch] = float(loss)  # a resumed run writes an epoch again: the last one counts
    return sorted(found.items())


# -- the page --------------------------------------------------------------------------------------
def e(value: Any) -> str:
    """Any value as HTML text: escaped, control characters and terminal escapes gone."""
    return html.escape(clean(value, 2000) or "", quote=True) if value is not None else ""


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}" if v >= 1 or v == 0 else f"${v:.4f}"


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s"


PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")


def plot(series: list[tuple[str, list[tuple[float, float, str]]]], point_class: str, y_fmt, x_fmt,
         width: int = 760, height: int = 260, label: str = "") -> str:
    """An inline SVG line plot: a polyline and a circle per point (its <title> says what it is)."""
    pts = [p for _, ps in series for p in ps]
    if not pts:
        return '<p class="empty">nothing to plot yet</p>'
    left, right, top, bottom = 64, 16, 12, 34
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(p[1] for p in pts)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y1 = y0 + 1
    sx = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    sy = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    out = [f'<svg class="plot" role="img" aria-label="{e(label)}" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
           f'<line class="axis" x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}"/>',
           f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}"/>']
    for frac in (0.0, 0.5, 1.0):
        y = y0 + (y1 - y0) * frac
        out.append(f'<text class="tick" x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{e(y_fmt(y))}</text>')
    for frac, anchor in ((0.0, "start"), (1.0, "end")):
        x = x0 + (x1 - x0) * frac
        out.append(f'<text class="tick" x="{sx(x):.1f}" y="{height - 12}" text-anchor="{anchor}">{e(x_fmt(x))}</text>')
    for n, (name, ps) in enumerate(series):
        color = PALETTE[n % len(PALETTE)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in ps)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        out += [f'<circle class="{point_class}" data-series="{e(name)}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" '
                f'fill="{color}"><title>{e(title)}</title></circle>' for x, y, title in ps]
    out.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{PALETTE[n % len(PALETTE)]}"></i>{e(name)}</span>'
                     for n, (name, _) in enumerate(series))
    return "".join(out) + (f'<div class="legend">{legend}</div>' if len(series) > 1 or label == "spend" else "")


def _epoch_s(stamp: str) -> float:
    return datetime.fromisoformat(stamp.rstrip("Z")).replace(tzinfo=timezone.utc).timestamp()


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M")


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#111827;background:#f9fafb}
header{background:#111827;color:#f9fafb;padding:12px 24px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}header .fig{color:#d1d5db}header .fig b{color:#fff}
main{padding:8px 24px 40px}h2{font-size:15px;margin:24px 0 8px}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0001;width:100%}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #e5e7eb;white-space:nowrap}
th{font-weight:600;color:#374151;background:#f3f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.state{padding:1px 8px;border-radius:9px;background:#e5e7eb}.state.ok{background:#dcfce7}.state.warn{background:#fef3c7}
.state.bad{background:#fee2e2}.state.off{background:#e0e7ff}.state.ended{background:#f3f4f6;color:#6b7280}
svg.plot{background:#fff;box-shadow:0 1px 2px #0001;max-width:100%;height:auto}
svg .axis{stroke:#9ca3af}svg .tick{font-size:11px;fill:#6b7280}
.legend{margin:4px 0}.key{margin-right:16px}.key i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.bar{display:inline-block;width:90px;height:8px;background:#e5e7eb;border-radius:4px;vertical-align:middle;overflow:hidden}
.bar i{display:block;height:100%;background:#2563eb}.empty{color:#6b7280}details{margin-top:12px}
a{color:#2563eb}.muted{color:#6b7280}
"""

_STATE_CLASS = {states.READY: "ok", states.STOPPED: "off", states.PREEMPTED: "warn", states.SCHEDULING: "warn",
                states.UNATTENDED: "bad", states.BROKEN: "bad", states.LOST: "bad", states.FAILED: "bad"}


def _state(s: str) -> str:
    cls = _STATE_CLASS.get(s, "ended" if s in states.TERMINAL else "")
    return f'<span class="state {cls}">{e(s)}</span>'


def _gpu(d: dict) -> str:
    return "cpu" if d["cpu_only"] else f"{d['gpus']}x {d['gpu_name'] or d['gpu'] or '?'}"


def _instance_rows(rows: list[dict]) -> str:
    out = []
    for d in rows:
        out.append(
            f'<tr class="instance" data-name="{e(d["name"])}"><td><b>{e(d["name"])}</b></td><td>{_state(d["state"])}</td>'
            f'<td>{e(d["provider"])}</td><td>{e(_gpu(d))}</td><td class="num">{e(_money(d["price_hr"]))}</td>'
            f'<td class="num">{e(_span(d["uptime_s"]))}</td><td class="num">{e(_money(d["spend_usd"]))}</td>'
            f'<td class="num">{e(_span(d["idle_s"]))}</td><td>{e(d["ssh"] or "-")}</td>'
            f'<td class="muted">{e(age(d["created_at"]))} ago</td></tr>')
    return "".join(out)


_INSTANCE_HEAD = ("<tr><th>name</th><th>state</th><th>provider</th><th>GPU</th><th>$/hr</th><th>uptime</th>"
                  "<th>spent</th><th>idle for</th><th>ssh</th><th>created</th></tr>")


def page(snap: Snapshot) -> str:
    every = snap.fleet(include_ended=True)
    live = [d for d in every if d["state"] in states.LIVE]
    ended = [d for d in every if d["state"] not in states.LIVE]
    spend = snap.spend()
    burning = sum(d["price_hr"] if d["state"] in states.BILLING_COMPUTE else
                  d["stopped_price_hr"] if d["state"] in states.BILLING_DISK_ONLY else 0.0 for d in live)
    total = sum(p["total_usd"] for p in spend["providers"].values())
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="refresh" content="{REFRESH_S}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<link rel="icon" href="data:,"><title>orch fleet</title>', f"<style>{STYLE}</style></head><body>",
        f'<header><h1>orch fleet</h1><span class="fig"><b id="live-count">{len(live)}</b> live</span>'
        f'<span class="fig">billing now <b>{e(_money(burning))}/hr</b></span>'
        f'<span class="fig">spent <b id="spent-total">{e(_money(total))}</b></span>'
        + "".join(f'<span class="fig" id="budget-{e(p["period"])}">{e(p["period"])} budget <b>'
                  f'{e(_money(p["spent"]["total"]))} of {e(_money(p["budget_usd"]))}</b> '
                  f'({e(_money(p["left_usd"]))} left)</span>' for p in (snap.budget() or {}).get("periods", []))
        + 
        f'<span class="fig">as of {e(spend["now"])} (read-only; refreshes every {REFRESH_S} s)</span></header><main>',
        "<h2>Instances</h2>",
        f'<table id="instances">{_INSTANCE_HEAD}{_instance_rows(live)}</table>' if live else
        '<p class="empty" id="instances">no live instances (start one with <code>orch up NAME</code>)</p>',
    ]
    if ended:
        parts.append(f'<details><summary>ended ({len(ended)})</summary><table id="ended">{_INSTANCE_HEAD}'
                     f'{_instance_rows(ended)}</table></details>')
    series = [(provider, [(_epoch_s(p["at"]), p["usd"], f'{p["at"]}  {p["instance"]}: {p["from"] or "-"} -> '
                                                           f'{p["to"]} ({p["actor"]})  {_money(p["usd"])} so far')
                          for p in data["points"]])
              for provider, data in spend["providers"].items()]
    parts += ["<h2>Spend over time, per provider</h2>",
              plot(series, "event-point", _money, _clock, label="spend"),
              "<h2>Runs</h2>", _runs_table(snap.run_rows()), "</main></body></html>"]
    return "".join(parts)


def _runs_table(rows: list[dict]) -> str:
    if not rows:
        return '<p class="empty">no training runs yet (<code>orch up NAME --data ...</code>)</p>'
    out = ['<table id="runs"><tr><th>instance</th><th>run</th><th>model</th><th>state</th><th>progress</th>'
           "<th>best</th><th>started</th><th>loss</th><th>monitor</th></tr>"]
    for d in rows:
        done = d["completed_epochs"] or max([c["epoch"] for c in d["loss_curve"]] or [0])
        bar = (f'<span class="bar" title="{e(done)}/{e(d["epochs"])} epochs"><i style="width:{d["progress"] * 100:.0f}%">'
               f'</i></span> {e(done)}/{e(d["epochs"])}') if d["progress"] is not None else "-"
        curve = plot([("loss", [(c["epoch"], c["loss"], f'epoch {c["epoch"]}: loss {c["loss"]:.4f}')
                                for c in d["loss_curve"]])], "loss-point", lambda v: f"{v:.3g}",
                     lambda v: f"epoch {v:g}", width=260, height=90, label="loss") if d["loss_curve"] else "-"
        link = f'<a class="monitor" href="/monitor/{e(d["instance"])}">open monitor</a>' if d["monitor"] else "-"
        best = f'{d["best_metric"]:.4f}' if isinstance(d["best_metric"], (int, float)) else "-"
        out.append(f'<tr class="run" data-instance="{e(d["instance"])}"><td>{e(d["instance"])}</td><td>{e(d["id"])}</td>'
                   f'<td>{e(d["model"])}</td><td>{e(d["state"])}</td><td>{bar}</td><td class="num">{e(best)}</td>'
                   f'<td class="muted">{e(d["started_at"])}</td><td>{curve}</td><td>{link}</td></tr>')
    out.append("</table>")
    return "".join(out)


# -- the server ------------------------------------------------------------------------------------
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"


class Dashboard(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, home: Path):
        super().__init__(("127.0.0.1", port), Handler)
        self.port = self.server_address[1]
        self.home = home
        self.hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        self._ledger = None
        self._open = threading.Lock()
        self.monitors: dict[str, tuple[subprocess.Popen, str]] = {}
        self._monitor_lock = threading.Lock()

    def ledger(self):
        with self._open:
            if self._ledger is None:
                self._ledger = open_ledger()
            return self._ledger

    def snapshot(self) -> Snapshot:
        return Snapshot(self.ledger(), self.home)

    def monitor(self, name: str) -> str:
        """The URL of ``orch monitor NAME``'s forward, starting it the first time."""
        with self._monitor_lock:
            known = self.monitors.get(name)
            if known is not None and known[0].poll() is None:
                return known[1]
            import select
            import tempfile
            import time

            errors = tempfile.TemporaryFile()
            proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "monitor", name], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=errors, start_new_session=True)
            deadline, seen = time.monotonic() + MONITOR_WAIT_S, b""
            while time.monotonic() < deadline and proc.poll() is None:
                ready, _, _ = select.select([proc.stdout], [], [], 0.5)
                if ready:
                    seen += os.read(proc.stdout.fileno(), 4096)
                    m = re.search(rb"http://127\.0\.0\.1:(\d{4,5})/", seen)
                    if m:
                        url = f"http://127.0.0.1:{int(m.group(1))}/"
                        self.monitors[name] = (proc, url)
                        return url
            if proc.poll() is None:
                proc.terminate()
            proc.wait(10)
            errors.seek(0)
            tail = errors.read()[-2000:].decode(errors="replace").strip().splitlines()
            raise OrchError(f"orch monitor {name} did not start: {tail[-1] if tail else 'no output'}")

    def running_monitor(self, name: str) -> str | None:
        """The URL of ``orch monitor NAME``'s forward when this dashboard started it and it still runs."""
        with self._monitor_lock:
            known = self.monitors.get(name)
            return known[1] if known is not None and known[0].poll() is None else None

    def stop_monitors(self) -> None:
        for proc, _ in self.monitors.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.monitors.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


class Handler(BaseHTTPRequestHandler):
    server: Dashboard
    server_version = "orch-dashboard"
    sys_version = ""

    def log_message(self, fmt, *args):  # the terminal is for the URL and errors, not every request
        pass

    def do_HEAD(self):
        self.do_GET()

    def do_POST(self):
        """Only the monitor's button: anything else is read-only (405)."""
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        if self.headers.get("Host") not in self.server.hosts:
            return self._send(HTTPStatus.FORBIDDEN, "text/plain", "orch dashboard answers 127.0.0.1 and localhost only\n")
        if len(parts) != 2 or parts[0] != "monitor":
            return self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", "the dashboard is read-only\n")
        # Browsers send Origin with every POST: only the dashboard's own page may start a process.
        if self.headers.get("Origin") != f"http://{self.headers.get('Host')}" or \
                self.headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
            return self._error(HTTPStatus.FORBIDDEN, "start the monitor from the dashboard itself")
        try:
            return self._monitor(parts[1], start=True)
        except OrchError as err:
            return self._error(HTTPStatus.BAD_GATEWAY, str(err))
        except BrokenPipeError:
            return None

    def do_GET(self):
        if self.headers.get("Host") not in self.server.hosts:
            return self._send(HTTPStatus.FORBIDDEN, "text/plain", "orch dashboard answers 127.0.0.1 and localhost only\n")
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        try:
            if not parts:
                return self._send(HTTPStatus.OK, "text/html", page(self.server.snapshot()))
            if parts[0] == "api":
                return self._api(parts[1:], parse_qs(url.query))
            if parts[0] == "monitor" and len(parts) == 2:
                return self._monitor(parts[1])
            return self._send(HTTPStatus.NOT_FOUND, "text/plain", "not found\n")
        except OrchError as err:
            return self._error(HTTPStatus.BAD_GATEWAY if parts[:1] == ["monitor"] else HTTPStatus.SERVICE_UNAVAILABLE,
                               str(err))
        except BrokenPipeError:
            return None
        except Exception as err:  # noqa: BLE001 - one failed request is a 500, never the server's end
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(err).__name__}: {err}")

    def _api(self, parts: list[str], query: dict):
        snap = self.server.snapshot()
        if parts == ["instances"]:
            data = snap.fleet(include_ended=query.get("all", ["0"])[0] not in ("0", ""))
        elif len(parts) == 2 and parts[0] == "instances":
            data = snap.detail(parts[1]) if NAME.fullmatch(parts[1]) else None
            if data is None:
                return self._json(HTTPStatus.NOT_FOUND, {"error": "no instance of that name"})
        elif parts == ["spend"]:
            data = snap.spend()
        elif parts == ["runs"]:
            data = snap.run_rows()
        elif parts == ["budget"]:
            data = snap.budget()
        else:
            return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})
        return self._json(HTTPStatus.OK, data)

    def _monitor(self, name: str, start: bool = False):
        # A link on another site must not start processes here: browsers say where a navigation came from.
        if self.headers.get("Sec-Fetch-Site", "none") not in ("same-origin", "none"):
            return self._error(HTTPStatus.FORBIDDEN, "open the monitor from the dashboard itself")
        snap = self.server.snapshot()
        d = snap.detail(name) if NAME.fullmatch(name) else None
        if d is None or d["state"] != states.READY:
            return self._error(HTTPStatus.NOT_FOUND, f"no ready instance named {name}")
        url = self.server.monitor(name) if start else self.server.running_monitor(name)
        if url is None:  # a GET: the button that POSTs, nothing started
            return self._send(HTTPStatus.OK, "text/html", (
                f"<!doctype html><html lang=en><head><meta charset=utf-8><link rel=icon href=\"data:,\">"
                f"<title>orch monitor {e(name)}</title><style>{STYLE}</style></head><body><main>"
                f"<h2>monitor of {e(name)}</h2><p>starts <code>orch monitor {e(name)}</code> on this machine</p>"
                f'<form method="post" action="/monitor/{e(name)}"><button type="submit">start the monitor</button>'
                f'</form><p><a href="/">back to the fleet</a></p></main></body></html>'))
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", url)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _json(self, status: HTTPStatus, data) -> None:
        self._send(status, "application/json", json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")

    def _error(self, status: HTTPStatus, message: str) -> None:
        body = (f"<!doctype html><html lang=en><head><meta charset=utf-8><link rel=icon href=\"data:,\">"
                f"<title>orch dashboard: {status.value}</title><style>{STYLE}</style></head><body><main>"
                f"<h2>{status.value} {e(status.phrase)}</h2><p>{e(message)}</p><p><a href=\"/\">back to the fleet</a>"
                f"</p></main></body></html>")
        self._send(status, "text/html", body)

    def _send(self, status: HTTPStatus, kind: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def serve(port: int, announce) -> None:
    """Serve until interrupted; ``announce(url)`` once it listens. The next free port is taken when
    ``port`` is in use (of the 20 from it)."""
    server = None
    for p in range(port, min(port + 20, 65536)):
        try:
            server = Dashboard(p, config.home())
            break
        except OSError:
            continue
    if server is None:
        raise OrchError(f"no free local port in {port}-{port + 19}")
    server.ledger()  # a ledger this orch cannot read is said now, not on the first page
    import signal

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a kill ends the monitors it started too
    announce(f"http://127.0.0.1:{server.port}/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.stop_monitors()
