"""How long an idle instance keeps billing: training process ends -> instance stopped.

On the local provider with a price set and ``--idle-minutes 0.5`` (by default), a real one-epoch
CPU training on synthetic data, measured twice:

  (a) watchdog: ``orch up`` has exited, nothing of orch runs on the controller; the watchdog on
      the instance alone notices and stops it;
  (b) reaper:   the watchdog is off (ORCH_WATCHDOG=off); only ``orch reap --watch --interval N``
      runs on the controller.

The clock starts when the training process dies (polled in /proc every 50 ms) and stops when the
instance's sshd is gone. The figure that matters is the time beyond the configured idle time;
the target is under 15 s (SkyPilot checks every 60 s, dstack's idle default is 5 min). It is also
printed as a ratio to a baseline measured in the same run: how long ``orch stop`` itself takes on
a bare instance here (so a loaded machine's figure can be read against an idle one's).

    .venv/bin/python bench/reaper_latency.py [--idle-minutes 0.5] [--interval 10] [--only watchdog|reaper] [--quick]

``--quick`` (the tests): the reaper only (unless --only says), idle 0.1 min, a pass every 2 s, no
target: does it still work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from providers import local as sshd  # noqa: E402  (the local provider: its sshd and processes)


def orch(env, *args, check=True, **kw):
    out = subprocess.run([sys.executable, "-m", "orchestrator", *map(str, args)], env=env, cwd=ROOT,
                         capture_output=True, text=True, **kw)
    if check and out.returncode != 0:
        raise SystemExit(f"orch {' '.join(map(str, args))} failed: {out.stderr.strip()[-500:]}")
    return out


def run_pid(home: Path, name: str) -> int:
    import sqlite3

    with sqlite3.connect(home / "ledger.db") as db:
        return db.execute("SELECT runs.pid FROM runs JOIN instances ON runs.instance_id = instances.id "
                          "WHERE instances.name = ? ORDER BY runs.id DESC LIMIT 1", (name,)).fetchone()[0]


def measure(mode: str, idle_minutes: float, interval: float, data: Path, base: Path) -> dict:
    home = base / mode
    home.mkdir(parents=True)
    (home / "config.toml").write_text("[providers.local]\nprice_per_hour = 1.20\nstopped_price_per_hour = 0.02\n")
    env = {**os.environ, "ORCH_HOME": str(home)}
    if mode == "reaper":
        env["ORCH_WATCHDOG"] = "off"
    name = f"lat-{mode}"
    orch(env, "up", name, "--cpu", "--data", data, "--epochs", 1, "--imgsz", 64, "--batch", 4,
         "--train-arg", "workers=0", "--idle-minutes", idle_minutes, "--on-idle", "stop")
    root = next(d for d in (home / "local").iterdir() if d.name.endswith(name))
    pid = run_pid(home, name)
    watcher = None
    if mode == "reaper":
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator", "reap", "--watch", "--interval", str(interval)],
                                   env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while sshd.alive(pid):
            time.sleep(0.05)
        ended = time.monotonic()
        while sshd.running(root):
            time.sleep(0.05)
            if time.monotonic() - ended > idle_minutes * 60 + 300:
                raise SystemExit(f"{mode}: still running 5 min past the idle time")
        stopped = time.monotonic()
        if watcher:  # let the pass finish writing what it did
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(
                    i["state"] == "stopping" for i in json.loads(orch(env, "status", "--json").stdout)):
                time.sleep(0.2)
    finally:
        if watcher:
            watcher.terminate()
            watcher.wait()
    status = json.loads(orch(env, "status", name, "--json").stdout)
    stops = [e for e in status["events"] if e["to"] in ("stopped", "destroyed")]
    if not stops:
        raise SystemExit(f"{mode}: sshd is gone but the ledger says {status['state']}: {status['events'][-3:]}")
    stop_event = stops[-1]
    pulled = (home / "runs" / name / "weights" / "best.pt").exists()
    orch(env, "down", name, "--no-pull", check=False)
    total = stopped - ended
    return {"mode": mode, "idle_s": idle_minutes * 60, "end_to_stopped_s": round(total, 2),
            "beyond_idle_s": round(total - idle_minutes * 60, 2), "recorded_by": stop_event["actor"],
            "weights_home": pulled, "interval_s": interval if mode == "reaper" else 5.0}


def stop_baseline(base: Path) -> float:
    """Seconds ``orch stop`` takes on a bare local instance here: the same-run baseline."""
    home = base / "baseline"
    home.mkdir(parents=True)
    env = {**os.environ, "ORCH_HOME": str(home), "ORCH_WATCHDOG": "off"}
    orch(env, "up", "base", "--cpu")
    t = time.monotonic()
    orch(env, "stop", "base")
    took = time.monotonic() - t
    orch(env, "down", "base", "--no-pull", check=False)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle-minutes", type=float, default=0.5)
    ap.add_argument("--interval", type=float, default=10.0, help="the reaper's --watch interval (s)")
    ap.add_argument("--only", choices=("watchdog", "reaper"))
    ap.add_argument("--quick", action="store_true", help="idle 0.1 min, a pass every 2 s, no target (the tests)")
    args = ap.parse_args()
    if args.quick:  # the controller's reaper only: each mode is a training of its own
        args.idle_minutes, args.interval, args.only = 0.1, 2.0, args.only or "reaper"
    from orchestrator.tasks import dataset

    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        base = Path(tmp)
        stop_s = stop_baseline(base)
        print(f"baseline: `orch stop` of a bare local instance takes {stop_s:.1f} s here", flush=True)
        data = dataset.synth(base / "data")
        results = []
        for mode in ("watchdog", "reaper"):
            if args.only in (None, mode):
                r = measure(mode, args.idle_minutes, args.interval, data, base)
                results.append(r)
                print(f"{mode:<9} checks every {r['interval_s']:g} s: training ended -> stopped in "
                      f"{r['end_to_stopped_s']:.1f} s = idle {r['idle_s']:.0f} s + {r['beyond_idle_s']:.1f} s "
                      f"(recorded by {r['recorded_by']}; weights home: {r['weights_home']})", flush=True)
        for r in results:
            print(f"ratio: {r['beyond_idle_s'] / stop_s:.2f}x one `orch stop`, the {r['mode']}'s delay beyond the idle time")
        print(json.dumps(results))
        worst = max(r["beyond_idle_s"] for r in results)
        if not args.quick:
            print(f"target < 15 s beyond the idle time: {'met' if worst < 15 else 'MISSED'} (worst {worst:.1f} s)")


if __name__ == "__main__":
    main()
