"""Whole-process time of `orch --help` and `orch status` with 1,000 instances in the ledger.

    .venv/bin/python bench/cli_startup.py [--runs 15] [--quick]

Target (issue 2): median under 0.25 s each. Peers on this machine: `sky --help` 1.5 s, warm
`sky status` 2.3 s, `dstack --help` 0.8 s. Each figure is also printed as a ratio to a baseline
measured in the same run, a bare Python start (``python -c pass``): seconds move with the
machine's load, the ratio much less. ``--quick`` (the tests): 100 instances, one warm-up and one
run of each, no target: does it still work.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fill(home: Path, n: int) -> None:
    os.environ["ORCH_HOME"] = str(home)
    from orchestrator import states
    from orchestrator.instances.lifecycle import Orch

    ledger = Orch.open().ledger
    for i in range(n):
        inst = ledger.create_instance(name=f"box{i}", provider="local", label="", gpus=1, gpu="RTX 4090")
        ledger.transition(inst.id, states.PROVISIONING, provider_id=f"p{i}", ssh_host="127.0.0.1", ssh_port=2200 + i)
        ledger.transition(inst.id, states.READY)


def timed(argv: list[str], runs: int, env: dict) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env, cwd=ROOT)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="100 instances, one run of each (the tests)")
    args = ap.parse_args()
    warm = 2
    if args.quick:  # each run is a Python start and an import of orch: the suite's CPU, for a median it ignores
        args.instances, args.runs, warm = 100, 1, 1
    # This checkout's orch, as `python -m orchestrator` from its root (the venv's `orch` script may be
    # another checkout's).
    orch = [sys.executable, "-m", "orchestrator"]
    with tempfile.TemporaryDirectory() as tmp:
        fill(Path(tmp), args.instances)
        env = {**os.environ, "ORCH_HOME": tmp}
        bare = [sys.executable, "-c", "pass"]
        timed(bare, warm, env)
        base = statistics.median(timed(bare, args.runs, env))
        print(f"{'python -c pass (the baseline)':<34} median {base:.3f} s")
        for label, argv in (("orch --help", [*orch, "--help"]), (f"orch status ({args.instances} instances)", [*orch, "status"]),
                            ("orch status --json", [*orch, "status", "--json"])):
            timed(argv, warm, env)  # warm the page cache and .pyc files
            t = timed(argv, args.runs, env)
            print(f"{label:<34} median {statistics.median(t):.3f} s  min {min(t):.3f} s  max {max(t):.3f} s")
            print(f"ratio: {statistics.median(t) / base:.2f}x a bare Python start, {label}")


if __name__ == "__main__":
    main()
