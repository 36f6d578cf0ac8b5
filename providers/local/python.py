"""Each local instance's own Python: a virtual environment on its disk (``home/.orch-python``) that
sees the controller's packages (torch, LibreYOLO: nothing downloaded again) but installs into
itself. Without it a task's ``pip install`` on the local provider went into orch's own
environment (the instance's PATH began with the controller's ``bin``), and a task pinning another
torch would have broken orch.

It is what ``--system-site-packages`` does for a venv made from a system Python (Python's ``venv``
documentation), with the controller's environment in the system's place: a ``.pth`` file in the
instance's site-packages adds the controller's site directories after its own (``site.addsitedir``,
so their ``.pth`` files, editable installs included, are read too), and what the instance
installs comes first. pip is the controller's, run by the instance's Python (``python -m pip``:
pip installs into the environment of the interpreter that runs it, and leaves alone a
distribution outside that environment: "Not uninstalling ... outside environment", pip's
``req_install``); ``pip``, ``pip3`` and ``pip3.X`` in its ``bin`` say so.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

DIR = ".orch-python"  # under the instance's home, its disk: stop keeps it, destroy removes it
PTH = "orch-controller.pth"
PIP = '#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n'


def make(home: Path) -> Path:
    """The instance's Python, made in its home (no pip of its own: the controller's, through the
    ``.pth``); the path of its ``python``."""
    env = Path(home) / DIR
    python = env / "bin" / "python"
    if python.exists():
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True,
                       text=True, timeout=120)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"could not make the instance's Python ({(e.stderr or '').strip()[-300:]})") from None
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in controller_sites()]
    (Path(purelib) / PTH).write_text("".join(f"{line}\n" for line in lines))
    v = sys.version_info
    for name in ("pip", "pip3", f"pip{v.major}.{v.minor}"):
        script = env / "bin" / name
        script.write_text(PIP)
        script.chmod(0o755)
    return python


def controller_sites() -> list[str]:
    """Where the controller's packages are: its site-packages (a venv's own), and the user's where
    this Python reads them."""
    sites = [d for d in site.getsitepackages() if os.path.isdir(d)]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        sites.append(site.getusersitepackages())
    return list(dict.fromkeys(sites))
