"""A fleet of 10,000: ``orch reap --dry-run``, ``orch reap`` and ``orch cost`` as multiples of ``orch status``.

One ledger, filled once, every command run as a user runs it (a fresh process: imports included),
each timed by the CPU it used (user + system, from ``wait4``), the median of --runs, all in the same
run: the baseline (``orch status``) is measured beside what it is compared to, on the same machine
under the same load, so the ratios mean something on a busy machine where seconds do not.

Two fleets, every instance live (so ``orch status`` shows all of them), each with its events and
one ended run. The first: half stopped, with their local-provider folders in place, so the
provider's listing shows them stopped and the rules decide on each from its whole history; the
other half ready in the ledger but missing from the listing, so each is asked for by id. The
second, for a real ``reap``: every instance stopped, with the decision of an earlier pass
remembered (the steady state of a scheduled reaper: nothing to change, everything to look at).

Target (issue 31): ``reap --dry-run``, ``reap`` and ``cost`` at most 4x ``status``, and linear.

    .venv/bin/python bench/fleet.py [--instances 10000] [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET = 4.0


def fill(home: Path, n: int, settled: bool = False) -> None:
    """``n`` live instances with their history, written in one transaction (the ledger's own
    verbs would take minutes: three commits per instance). ``settled``: every one stopped, with the
    decision a pass made before remembered, as a scheduled reaper leaves its fleet."""
    os.environ["ORCH_HOME"] = str(home)
    from sqlalchemy import insert

    from orchestrator import states
    from orchestrator.ledger.ledger import Event, Instance, Run
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import label_for

    ledger = Orch.open().ledger
    now = datetime.now(timezone.utc)
    t0 = now - timedelta(days=2)
    instances, events, runs = [], [], []
    local = home / "local"
    for i in range(n):
        iid, name = f"{i:012x}", f"box{i}"
        label = label_for(iid, name)
        stopped = settled or i % 2 == 0
        born = t0 + timedelta(seconds=i)
        ready_at, ended_at = born + timedelta(minutes=2), born + timedelta(hours=1)
        stopped_at = now - timedelta(minutes=30)  # within its break-even (8 h): every pass keeps it
        state = states.STOPPED if stopped else states.READY
        instances.append(dict(id=iid, name=name, provider="local", provider_id=label, label=label, state=state,
                              gpus=0, cpu_only=True, disk_gb=20, price_hr=1.2, stopped_price_hr=0.005,
                              ssh_host="127.0.0.1", ssh_port=2200 + i % 60000, ssh_user="root",
                              created_at=born, updated_at=stopped_at if stopped else ready_at,
                              memory=json.dumps({"decision": "keep:stopped"}) if settled else None))
        moves = [(None, states.REQUESTED, born), (states.REQUESTED, states.PROVISIONING, born + timedelta(seconds=5)),
                 (states.PROVISIONING, states.READY, ready_at)]
        if stopped:
            moves.append((states.READY, states.STOPPED, stopped_at))
        events += [dict(instance_id=iid, from_state=a, to_state=b, reason="bench", actor="cli", at=at)
                   for a, b, at in moves]
        runs.append(dict(instance_id=iid, model="yolox-n", data="bench", epochs=1, run_dir=f"/w/runs/{name}", pid=1,
                         state="completed", started_at=ready_at, ended_at=ended_at, pulled_at=ended_at))
        if stopped:  # the local provider shows it stopped: a folder with its meta.json, no sshd
            folder = local / label
            folder.mkdir(parents=True)
            (folder / "meta.json").write_text(json.dumps({"label": label, "host": "127.0.0.1", "port": 2200,
                                                          "state": "stopped", "instance_id": iid, "gpus": 0}))
    with ledger.engine.begin() as conn:
        conn.execute(insert(Instance), instances)
        conn.execute(insert(Event), events)
        conn.execute(insert(Run), runs)


def cpu(argv: list[str], env: dict) -> float:
    """CPU seconds (user + system) of one run of ``argv`` and its children."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:])} failed ({proc.returncode}): {err.strip()[-500:]}")
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="300 instances, one run, no target: does it work (the tests)")
    args = ap.parse_args(argv)
    if args.quick:
        args.instances, args.runs = 300, 1
    orch = [sys.executable, "-m", "orchestrator"]
    ok = True
    with tempfile.TemporaryDirectory(prefix="orch-bench-fleet-") as tmp:
        home = Path(tmp) / "orch"
        fill(home, args.instances)
        env = {**os.environ, "ORCH_HOME": str(home), "ORCH_WATCHDOG": "off"}

        def measure(title: str, commands: dict[str, list[str]]) -> None:
            nonlocal ok
            times: dict[str, list[float]] = {k: [] for k in commands}
            for _ in range(args.runs):  # interleaved: a burst of load on the machine hits every command alike
                for label, cmd in commands.items():
                    times[label].append(cpu([*orch, *cmd], env))
            base = statistics.median(times["status"])
            print(f"{title}: CPU seconds (user+sys), median of {args.runs}")
            for label, t in times.items():
                ratio = statistics.median(t) / base
                judged = label != "status" and not args.quick  # 300 instances: start-up costs, not per instance
                ok &= not judged or ratio <= TARGET
                print(f"  orch {label:<15} {statistics.median(t):7.3f} s  {ratio:5.1f}x status"
                      + (f"  ({'ok' if ratio <= TARGET else 'OVER'} the {TARGET:g}x target)" if judged else ""),
                      flush=True)
                if label != "status":
                    print(f"ratio: {ratio:.2f}x orch status, orch {label}, {title}")

        measure(f"{args.instances} live instances, half stopped, half gone from the provider",
                {"status": ["status"], "reap --dry-run": ["reap", "--dry-run"], "cost": ["cost"]})
        home = Path(tmp) / "settled"
        fill(home, args.instances, settled=True)
        env["ORCH_HOME"] = str(home)
        measure(f"{args.instances} stopped instances, as a scheduled reaper leaves them",
                {"status": ["status"], "reap": ["reap"]})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
