"""Time to a ready 2-node group (`orch up NAME --nodes 2`) against one `orch up`, in the same run.

A group's nodes come up in parallel (``orchestrator/instances/groups.py``): the target is at most 1.5x the
time of one instance. Local instances (each a real sshd on a loopback address of its own, the real
provisioning probe and verify matmul), CPU, no training; alternating single and group, ``--rounds``
of each, a fresh ORCH_HOME per round. Every command is a separate `orch` process, as a user runs it.

    .venv/bin/python bench/group_up.py [--rounds 3] [--nodes 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent


def orch(home: Path, *args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "ORCH_HOME": str(home)})
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round (the suite runs every bench so)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    singles, groups = [], []
    scratch = Path(tempfile.mkdtemp(prefix="orch-group-bench-"))
    try:
        for i in range(args.rounds):
            home = scratch / f"r{i}"
            singles.append(orch(home, "up", "one", "--cpu"))
            orch(home, "down", "one")
            groups.append(orch(home, "up", "grp", "--cpu", "--nodes", str(args.nodes)))
            orch(home, "down", "grp")
        s, g = median(singles), median(groups)
        print(f"to ready, median of {args.rounds} (local, CPU, {os.cpu_count()} cores on this machine):")
        print(f"  one `orch up`                   {s:6.1f} s   ({', '.join(f'{x:.1f}' for x in singles)})")
        print(f"  `orch up --nodes {args.nodes}` (a group)   {g:6.1f} s   ({', '.join(f'{x:.1f}' for x in groups)})")
        print(f"  ratio                           {g / s:6.2f}x  (target: at most 1.5x)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
