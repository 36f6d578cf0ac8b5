"""What the controller's checkpoint check costs in its bounded child process, against the same check
in-process (issue 53): the child is a fresh ``python -I -S checkpoint.py`` with its memory capped.

    .venv/bin/python bench/checkpoint_vet.py [PATH/last.pt] [--runs 9] [--quick]

Without a path, a small ``torch.save`` checkpoint is made (needs torch); a real LibreYOLO ``last.pt``
is the figure that matters (yolo9-t's: 0.7 s in-process on the 2-core build machine). The overhead
is printed beside a bare ``python -I -S -c pass``, measured in the same run: seconds move with the
machine's load, the difference much less.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(call, runs: int) -> float:
    call()  # warm the page cache and .pyc files
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    from orchestrator.runs import checkpoint_vet
    from playbooks.on_instance import checkpoint

    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="one run of each (the tests)")
    args = ap.parse_args()
    if args.quick:
        args.runs = 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.path) if args.path else Path(tmp) / "last.pt"
        if not args.path:
            import torch

            torch.save({"epoch": 2, "model": {f"w{i}": torch.ones(4) for i in range(200)}}, path)
        assert checkpoint_vet.vet(path)[1] is None, checkpoint_vet.vet(path)
        bare = timed(lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True), args.runs)
        inside = timed(lambda: checkpoint.check(str(path)), args.runs)
        child = timed(lambda: checkpoint_vet.vet(path), args.runs)
        print(f"{path} ({path.stat().st_size >> 20} MB), median of {args.runs}:")
        print(f"  python -I -S -c pass      {bare:.3f} s")
        print(f"  check in-process          {inside:.3f} s")
        print(f"  checkpoint_vet.vet        {child:.3f} s  (+{child - inside:.3f} s for the child)")
        print(f"  the child's cost: {(child - inside) / bare:.2f}x a bare interpreter's start, "
              f"{child / inside:.2f}x the check in-process")


if __name__ == "__main__":
    main()
