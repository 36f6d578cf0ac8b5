"""What provisioning costs after a restart that wiped the container disk (RunPod), two ways.

1. orch's way: the environment orch installed lives in a venv on the volume (``$W/orch/venv``),
   which survives the stop. Provisioning after the start only probes it: import torch and
   LibreYOLO, run a kernel (``playbooks/on_instance/probe.py``).
2. The other way: install into the image's Python, on the container disk, wiped at every stop.
   Provisioning after each start reinstalls LibreYOLO and its dependencies (the image brings torch).

This machine's package index is a local mirror, the fastest a pip install can ever be: on a rented
host, downloading the same wheels from PyPI only adds to the second figure.

    .venv/bin/python bench/restart_provision.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "playbooks" / "on_instance" / "probe.py"


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="leave the scratch venv in this folder")
    args = parser.parse_args()
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="orch-restart-bench-"))
    import torch
    import torchvision

    venv = scratch / "image-python"
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # The image: a Python with torch (not timed: it comes with the image).
        subprocess.run([*pip, "install", f"torch=={torch.__version__.split('+')[0]}",
                        f"torchvision=={torchvision.__version__.split('+')[0]}"], check=True)
        constraints = scratch / "constraints.txt"
        constraints.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
        reinstall = timed([*pip, "install", "libreyolo", "-c", str(constraints)])
        probe = min(timed([str(py), str(PROBE), "cpu"]) for _ in range(3))
        print("after a restart that wiped the container disk, on this machine (local package mirror):")
        print(f"  venv on the volume (orch): probe only           {probe:6.1f} s")
        print(f"  image Python: reinstall LibreYOLO, then probe    {reinstall + probe:6.1f} s "
              f"(pip {reinstall:.1f} s)")
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
