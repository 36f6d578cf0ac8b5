"""`orch ssh NAME -- true` against plain `ssh -F $ORCH_HOME/ssh_config orch-NAME true`, on one
local instance (a real sshd on loopback).

    .venv/bin/python bench/ssh.py [--runs 10] [--quick]

Target (issue 33): within half a second of plain ssh (it was about 6 s more: Typer, SQLAlchemy
and the ledger's models loaded before ssh started).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(argv: list[str], runs: int) -> float:
    took = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, cwd=ROOT, stdin=subprocess.DEVNULL)
        took.append(time.perf_counter() - t0)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="two runs each: does it work (the tests)")
    args = parser.parse_args()
    runs = 2 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ORCH_HOME"] = str(Path(tmp) / "orch")
        orch = [sys.executable, "-m", "orchestrator"]
        subprocess.run([*orch, "up", "bench-ssh", "--cpu"], check=True, cwd=ROOT, capture_output=True)
        subprocess.run([*orch, "ssh-config"], check=True, cwd=ROOT, capture_output=True)  # the file plain ssh reads
        try:
            plain = timed(["ssh", "-F", str(Path(tmp) / "orch" / "ssh_config"), "orch-bench-ssh", "true"], runs)
            ours = timed([*orch, "ssh", "bench-ssh", "--", "true"], runs)
            print(f"plain ssh -F ssh_config: median {plain:.3f} s")
            print(f"orch ssh NAME -- true:   median {ours:.3f} s ({ours - plain:+.3f} s)")
            print(f"ratio: {ours / plain:.2f}x plain ssh -F ssh_config, orch ssh NAME -- true")
        finally:
            subprocess.run([*orch, "down", "bench-ssh", "--no-pull", "--yes"], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
