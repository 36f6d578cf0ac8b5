"""What the reconcile at the start of every reaper pass costs: a pass over N ready local instances,
timed with the reconcile (as `orch reap` runs now) and the reconcile alone.

The reconcile lists each provider once more and asks each row's provider once: on the local
provider, a directory listing and a look per instance. The figure to watch is its share of the
pass (target: under a fifth; the pass's SSH looks dominate).

    .venv/bin/python bench/reap_reconcile.py [--instances 4] [--runs 5] [--quick]

``--quick`` (the tests): 2 instances, one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 instances, one run (the tests)")
    args = ap.parse_args()
    if args.quick:
        args.instances, args.runs = 2, 1
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ORCH_HOME"] = str(Path(tmp) / "orch")
        os.environ["ORCH_WATCHDOG"] = "off"
        from orchestrator.reaper import reaper
        from orchestrator.instances import reconcile
        from orchestrator.instances.lifecycle import Orch
        from tests.clouds import arrange

        orch = Orch.open(say=lambda m: None)
        made = [arrange(orch, f"b{i}") for i in range(args.instances)]
        try:
            passes, alone = [], []
            for _ in range(args.runs):
                t = time.perf_counter()
                reaper.reap(orch)
                passes.append(time.perf_counter() - t)
                t = time.perf_counter()
                reconcile.reconcile(orch)
                alone.append(time.perf_counter() - t)
        finally:
            for inst in made:
                orch.down(orch.ledger.get(inst.id))
    p, r = statistics.median(passes), statistics.median(alone)
    print(f"{args.instances} ready local instances, median of {args.runs}: reaper pass {p:.3f} s, "
          f"of which reconcile {r:.3f} s ({100 * r / p:.0f} %)")
    print(f"ratio: {r / p:.2f}x the whole pass (measured beside it), the reconcile alone")


if __name__ == "__main__":
    main()
