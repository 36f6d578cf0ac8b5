"""What provisioning costs after a restart that wiped the container disk (RunPod), two ways.

1. orch's way: the environment orch installed lives in a venv on the volume (``$W/orch/venv``),
   which survives the stop. Provisioning after the start only probes it: import torch and
   LibreYOLO, run a kernel (``playbooks/on_instance/probe.py``).
2. The other way: install into the image's Python, on the container disk, wiped at every stop.
   Provisioning after each start reinstalls LibreYOLO and its dependencies (the image brings torch).

This machine's package index is a local mirror, the fastest a pip install can ever be: on a rented
host, downloading the same wheels from PyPI only adds to the second figure.

The figure is also printed as a ratio to the baseline measured in the same run, the probe alone.

    .venv/bin/python bench/restart_provision.py [--keep DIR] [--quick]

``--quick`` (the tests): the "image" is a venv over this one's site-packages (torch, LibreYOLO's
dependencies already there), and the reinstall is LibreYOLO's own wheel alone, from the index:
a lower bound of the second figure, in seconds rather than minutes.
"""

from __future__ import annotations

import argparse
import json
import os
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
    # ORCH_FRESH_PROOF: the probe imports torch and runs its kernel each time, as after a restart
    # (a new boot), instead of answering with the proof it made a moment ago.
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env={**os.environ, "ORCH_FRESH_PROOF": "1"}).stdout
    took = time.monotonic() - t0
    if argv[1] == str(PROBE):  # a probe that found no torch is fast and proves nothing
        line = next((ln for ln in out.splitlines() if ln.startswith("ORCH_RESULT ")), "ORCH_RESULT {}")
        result = json.loads(line.split(" ", 1)[1])
        if result.get("error") or not (result.get("proof") or {}).get("ok"):
            raise SystemExit(f"the probe failed: {out[-500:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="leave the scratch venv in this folder")
    parser.add_argument("--quick", action="store_true", help="LibreYOLO alone over this venv's packages (the tests)")
    args = parser.parse_args()
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="orch-restart-bench-"))
    venv = scratch / "image-python"
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        if args.quick:
            from importlib.metadata import version

            import site

            # No pip of its own (ensurepip: seconds of CPU): this venv's, through the .pth below, installs
            # into the interpreter that runs it, as the local provider's instance Python does.
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            # This venv's packages behind the new one's own (a .pth line): the image's torch and the rest.
            own = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                                 capture_output=True, text=True).stdout.strip()
            Path(own, "image.pth").write_text("\n".join(site.getsitepackages()) + "\n")
            reinstall = timed([*pip, "install", "--no-deps", "--force-reinstall", f"libreyolo=={version('libreyolo')}"])
        else:
            import torch  # the versions the image's Python is given (torchvision's import alone is a CPU-second)
            import torchvision

            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            # The image: a Python with torch (not timed: it comes with the image).
            subprocess.run([*pip, "install", f"torch=={torch.__version__.split('+')[0]}",
                            f"torchvision=={torchvision.__version__.split('+')[0]}"], check=True)
            constraints = scratch / "constraints.txt"
            constraints.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
            reinstall = timed([*pip, "install", "libreyolo", "-c", str(constraints)])
        # The best of three (one in --quick: the tests ask that it runs, and each probe imports torch).
        probe = min(timed([str(py), str(PROBE), "cpu", "libreyolo"]) for _ in range(1 if args.quick else 3))
        print("after a restart that wiped the container disk, on this machine (local package mirror):")
        print(f"  venv on the volume (orch): probe only           {probe:6.1f} s")
        print(f"  image Python: reinstall LibreYOLO, then probe    {reinstall + probe:6.1f} s "
              f"(pip {reinstall:.1f} s)")
        print(f"ratio: {(reinstall + probe) / probe:.2f}x the probe alone, reinstalling after each restart"
              + (" (LibreYOLO's own wheel only: --quick)" if args.quick else ""))
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
