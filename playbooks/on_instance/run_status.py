"""Run on the instance (standard library only): the training run's state in a few hundred bytes.

Prints one JSON line: status.json as LibreYOLO wrote it, whether the training process is alive,
how long since status.json last moved, the files worth pulling with their size and mtime, and the
spot notice the watchdog wrote (``preempt.json`` in the work dir, the run folder's grandparent).
"""
import json
import os
import stat
import sys
import time
from pathlib import Path

run_dir, pid = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else None
PULL = ("weights/best.pt", "weights/last.pt", "status.json", "metrics.jsonl", "train.log", "results.csv",
        "summary.json", "train_config.yaml")


def alive(p):
    if not p:
        return False
    try:
        with open(f"/proc/{p}/stat") as f:
            if f.read().split(") ", 1)[1][0] == "Z":
                return False
        with open(f"/proc/{p}/cmdline", "rb") as f:
            cmd = f.read()
        return b"python" in cmd or b"libreyolo" in cmd
    except OSError:
        try:  # no /proc (not Linux): signal 0 at least says the pid exists
            os.kill(p, 0)
            return True
        except OSError:
            return False


status = None
try:
    status = json.loads((run_dir / "status.json").read_text())
except (OSError, ValueError):
    pass
pids = {pid, (status or {}).get("pid")} - {None}
files = []


def regular(rel):
    """[rel, size, mtime] of a regular file (never a link) in the run dir, else None."""
    try:
        st = os.lstat(run_dir / rel)
    except OSError:
        return None
    return [rel, st.st_size, st.st_mtime] if stat.S_ISREG(st.st_mode) else None


weights = run_dir / "weights"
epochs = sorted(f"weights/{f.name}" for f in weights.glob("epoch_*.pt")) if weights.is_dir() and not weights.is_symlink() else []
for rel in (*PULL, *epochs):
    entry = regular(rel)
    if entry:
        files.append(entry)
try:
    moved = time.time() - (run_dir / "status.json").stat().st_mtime
except OSError:
    moved = None
live = any(alive(p) for p in pids)
if not live and isinstance(status, dict) and status.get("state") in ("starting", "running"):
    # Read an instant before the training wrote its end and exited: its last word is there now
    # (without this a finished run could read as crashed, and a job would relaunch it).
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        pass
notice = None
try:
    with open(run_dir.parent.parent / "preempt.json") as f:
        notice = json.loads(f.read(4096))
except (OSError, ValueError):
    pass
print("ORCH_RESULT " + json.dumps({"status": status, "alive": live, "moved_s": moved,
                                 "files": files, "exists": run_dir.is_dir(), "notice": notice}))
