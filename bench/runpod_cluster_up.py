"""Time to ready of a 2-pod RunPod Instant Cluster (`orch run NAME --nodes 2 --provider runpod`) against
one pod's (`orch run NAME --provider runpod`), on the fake RunPod (tests/fakes/runpod_api.py: REST API
v2, its pods real sshd hosts on 127.x, a container "up" after two polls), in the same run.

Each figure is the job's own ``provision`` phase as ``orch run --wait --json`` reports it (from the
create until every node answers SSH and is provisioned), median of ``--rounds``, alternating single and
cluster, a fresh ORCH_HOME per round; every command a separate `orch` process, as a user runs it. The
command itself is ``true``. The fake makes the members of a cluster one after another in one request,
as a pod alone; RunPod's own times are RunPod's.

    .venv/bin/python bench/runpod_cluster_up.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.runpod_api import FakeRunPod  # noqa: E402


def run(home: Path, env: dict, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "run", "--wait", "--json", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **env, "ORCH_HOME": str(home)})
    try:
        job = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"orch run answered no JSON:\n{proc.stderr[-2000:]}") from None
    if job["state"] != "completed":
        raise SystemExit(f"the job did not complete: {job['history'][-3:]}\n{proc.stderr[-2000:]}")
    return job


def provision(job: dict) -> float:
    return float(job["phases"]["provision"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    singles, clusters = [], []
    scratch = Path(tempfile.mkdtemp(prefix="orch-runpod-cluster-bench-"))
    try:
        with FakeRunPod(scratch / "fake") as fake:
            env = {"RUNPOD_API_BASE_URL": fake.url, "HOME": str(scratch)}
            for i in range(rounds):
                home = scratch / f"r{i}"
                home.mkdir(mode=0o700)
                settings = {**fake.settings(), "poll_interval": 0.2}
                (home / "config.toml").write_text("[providers.runpod]\n" + "".join(
                    f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
                (home / "config.toml").chmod(0o600)
                singles.append(provision(run(home, env, "one", "--provider", "runpod", "--gpu", "H100 SXM", "--",
                                             "true")))
                clusters.append(provision(run(home, env, "two", "--provider", "runpod", "--gpu", "H100 SXM",
                                              "--nodes", "2", "--", "true")))
            assert not fake.live() and not fake.live_clusters(), "the bench left something billing"
        s, c = median(singles), median(clusters)
        print(f"to ready (the job's provision phase), median of {rounds}, fake RunPod on this machine "
              f"({os.cpu_count()} cores):")
        print(f"  one pod                      {s:6.1f} s   ({', '.join(f'{x:.1f}' for x in singles)})")
        print(f"  a 2-pod Instant Cluster      {c:6.1f} s   ({', '.join(f'{x:.1f}' for x in clusters)})")
        print(f"  ratio                        {c / s:6.2f}x (the cluster against one pod)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
