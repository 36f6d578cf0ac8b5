"""The trial's sampler: once a second, how busy every CPU core is (/proc/stat) and, where nvidia-smi
exists, each GPU's utilisation and memory, until the training process ends. Standard library only.

    python sampler.py TRAINING_PID OUT.jsonl
"""
import json
import os
import shutil
import subprocess
import sys
import time

pid, out = int(sys.argv[1]), sys.argv[2]
smi = shutil.which("nvidia-smi")

def cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)

def alive():
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True

prev = cpu()
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "a") as f:
    while alive():
        time.sleep(1)
        now = cpu()
        row = {"t": time.time(), "cpu": (now[0] - prev[0]) / max(now[1] - prev[1], 1)}
        prev = now
        if smi:
            try:
                q = subprocess.run([smi, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=10).stdout
                pairs = [[float(x) for x in line.split(",")] for line in q.strip().splitlines() if line.strip()]
                row["gpu"] = [p[0] for p in pairs]
                row["mem_mib"] = [p[1] for p in pairs]
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        f.write(json.dumps(row) + "\n")
        f.flush()
