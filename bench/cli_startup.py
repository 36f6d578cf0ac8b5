"""Whole-process time of `orch --help` and `orch status` with 1,000 instances in the ledger.

    .venv/bin/python bench/cli_startup.py [--runs 15]

Target (issue 2): median under 0.25 s each. Peers on this machine: `sky --help` 1.5 s, warm
`sky status` 2.3 s, `dstack --help` 0.8 s.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def fill(home: Path, n: int) -> None:
    os.environ["ORCH_HOME"] = str(home)
    from orchestrator import states
    from orchestrator.lifecycle import Orch

    ledger = Orch.open().ledger
    for i in range(n):
        inst = ledger.create_instance(name=f"box{i}", provider="local", label="", gpus=1, gpu="RTX 4090")
        ledger.transition(inst.id, states.PROVISIONING, provider_id=f"p{i}", ssh_host="127.0.0.1", ssh_port=2200 + i)
        ledger.transition(inst.id, states.READY)


def timed(argv: list[str], runs: int, env: dict) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--instances", type=int, default=1000)
    args = ap.parse_args()
    orch = str(Path(sys.executable).with_name("orch"))
    with tempfile.TemporaryDirectory() as tmp:
        fill(Path(tmp), args.instances)
        env = {**os.environ, "ORCH_HOME": tmp}
        for label, argv in (("orch --help", [orch, "--help"]), (f"orch status ({args.instances} instances)", [orch, "status"]),
                            ("orch status --json", [orch, "status", "--json"])):
            timed(argv, 2, env)  # warm the page cache and .pyc files
            t = timed(argv, args.runs, env)
            print(f"{label:<34} median {statistics.median(t):.3f} s  min {min(t):.3f} s  max {max(t):.3f} s")


if __name__ == "__main__":
    main()
