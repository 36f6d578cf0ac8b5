"""One lost node replaced alone against the whole group relaunched, on the local provider, both in
the same run (issue 38's target: a ratio of 0.6 or less).

    .venv/bin/python bench/group_replace.py [--nodes 4] [--setup-cpu-s 3] [--quick]

Each mode runs the same command job on ``--nodes`` CPU nodes: a ``setup`` that burns
``--setup-cpu-s`` CPU-seconds (what unpacking a pip install or a dataset costs), then a loop that
saves a checkpoint folder. Once a checkpoint copy is home, node 1 is destroyed from outside (the
machine is gone) and ``orch run --wait`` carries on. The figure: from the moment orch noticed (node 1's
first change of state in the ledger: the same wait in both modes) to the ``run`` phase started again
on every node (each node appends its rank and the time to a file on this
machine as its ``run`` starts: local instances share this disk), so a setup run again counts. Mode "replace" is orch's
default; mode "whole" sets ``replace_lost_node = false`` in config.toml (what SkyPilot and dstack do).
``--quick`` (the tests): 2 nodes, a short setup and run, no target.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASK = """
name: rep
resources:
  cpu: true
nodes: {nodes}
setup: |
  python3 - <<'PY'
  import hashlib, time
  t, h = time.process_time(), b"x"
  while time.process_time() - t < {setup}:
      h = hashlib.sha256(h * 64).digest()
  PY
env:
  STARTS: "{starts}"
run: |
  echo "$ORCH_NODE_RANK $(date +%s.%N)" >> "$STARTS"
  mkdir -p ckpt
  n=$(cat ckpt/n 2>/dev/null || echo 0)
  while [ "$n" -lt {steps} ]; do n=$((n + 1)); [ "$ORCH_NODE_RANK" = 0 ] && echo "$n" > ckpt/n; sleep 0.1; done
checkpoint: ckpt
checkpoint_minutes: 0.02
"""


def one(mode: str, nodes: int, setup: float, steps: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"orch-bench-{mode}-"))
    work = Path(tempfile.mkdtemp(prefix="orch-bench-task-"))
    starts = work / "starts.txt"
    (work / "task.yaml").write_text(textwrap.dedent(TASK).format(nodes=nodes, setup=setup, starts=starts,
                                                                            steps=steps))
    env = {**os.environ, "ORCH_HOME": str(home / "orch")}
    (home / "orch").mkdir()
    if mode == "whole":
        (home / "orch" / "config.toml").write_text("replace_lost_node = false\n")
    os.environ["ORCH_HOME"] = env["ORCH_HOME"]
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "-f", str(work / "task.yaml"), "--wait",
                             "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    from orchestrator.instances.lifecycle import Orch

    orch = Orch.open(say=lambda m: None)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"orch run ended early: {proc.stderr.read()[-2000:]}")
        job = orch.ledger.job("rep")
        if job is not None and (job.checkpoint_epoch or 0) >= 1:
            break
        time.sleep(0.2)
    node = next(i for i in orch.ledger.instances() if i.name == "rep-a1-1")
    killed = time.time()
    orch.provider("local").destroy(node.provider_id)
    out, err = proc.communicate(timeout=900)
    job = json.loads(out)
    attempt = job["attempts"][-1]
    rows = [i for i in orch.ledger.instances()]
    again: dict[int, float] = {}
    for line in starts.read_text().split("\n"):
        if line.strip():
            rank, at = line.split()
            if float(at) > killed:
                again.setdefault(int(rank), float(at))
    # When orch noticed: node 1's first change of state after the kill (the same wait in both modes:
    # how often `--wait` looks), the figure compared is from there.
    from datetime import timezone

    changes = [e for e in orch.ledger.events(node.id) if e.from_state != e.to_state
               and e.at.replace(tzinfo=timezone.utc).timestamp() > killed]
    noticed = changes[0].at.replace(tzinfo=timezone.utc).timestamp() if changes else killed
    back = max(again.values()) - noticed if len(again) == nodes else None
    return {"mode": mode, "state": job["state"], "recover_s": round(back, 2) if back else None,
            "noticed_s": round(noticed - killed, 2),
            "launch_s": (attempt.get("phases") or {}).get("recover"), "machines": len(rows),
            "attempt": attempt["instance"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--setup-cpu-s", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    nodes, setup, steps = (2, 0.2, 80) if args.quick else (args.nodes, args.setup_cpu_s, 400)
    got = [one(mode, nodes, setup, steps) for mode in ("replace", "whole")]
    for g in got:
        print(f"{g['mode']:8} {g['state']:10} loss noticed {g['noticed_s']} s after the kill; every node running "
              f"again {g['recover_s']} s after that (orch's relaunch itself {g['launch_s']} s), {g['machines']} "
              f"machines rented, attempt on {g['attempt']}")
    a, b = got[0]["recover_s"], got[1]["recover_s"]
    if a and b:
        print(f"ratio replace/whole: {a / b:.2f}x" + ("" if args.quick else " (target 0.6 or less)")
              + f" on {os.cpu_count()} CPUs, {nodes} nodes")


if __name__ == "__main__":
    main()
