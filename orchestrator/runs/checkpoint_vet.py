"""A checkpoint that came from a rented machine, checked on this one before it is kept or uploaded.

LibreYOLO's resume reads ``last.pt`` with ``torch.load(weights_only=False)``: a pickle that names
anything but tensors and plain containers would run on the next instance (maybe another
provider's, another account's). An instance answers its own ``checkpoint.py`` as it likes, so its
"loads" is never taken alone: the controller runs the very same check (``on_instance/checkpoint.py``,
standard library only, nothing in the file runs) on its copy before the copy is kept as a job's
resume copy and again before it is uploaded anywhere (a job's next attempt, ``orch up --resume``,
``orch run --resume``).

The check reads the archive as torch's own reader does and takes only torch's own layout (see
``on_instance/checkpoint.py``): a file that Python's ``zipfile`` and torch would read as two
different archives (a second ``Data.pkl``, a second central directory, a TorchScript archive that
``torch.load`` hands to ``torch.jit.load``) is refused, whatever its ``data.pkl`` says. orch itself
never hands a checkpoint to torch; the examples it ships that do pass ``weights_only=True``.

The check runs in a child process of its own (the script itself, ``python -I -S checkpoint.py``:
the standard library alone, a fresh interpreter, nothing of the controller's state), its memory
capped (``MEMORY_MB``, ``RLIMIT_AS``) and its time (``TIME_S``): the script bounds what it reads,
and whatever it missed costs that child, refused, never the controller's memory. About 0.1 s more
than in-process on a loaded machine (``bench/checkpoint_vet.py``), next to 0.7 s for yolo9-t's last.pt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.text import clean
from playbooks.on_instance import checkpoint as _check

MEMORY_MB = 512  # the child's address space: a real check takes about 25 MB (a fresh interpreter 10)
TIME_S = 60.0  # yolo9-t's last.pt takes 0.7 s; the script's bounds (opcodes, records) keep any file to seconds


def vet(path: Path) -> tuple[int | None, str | None]:
    """(the epochs ``path`` holds, None) when it is a checkpoint to resume from; else (None, why not)."""
    info = check(path)
    if not info["exists"]:
        return None, f"{path} is not a regular file"
    if not info["loads"]:
        return None, f"{path} is not resumable ({clean(info.get('error'), 200)})"
    return info["epoch"], None


def check(path: Path) -> dict:
    """``checkpoint.check`` of ``path``, answered by a child process within ``MEMORY_MB`` and ``TIME_S``."""
    refused = {"exists": True, "loads": False, "epoch": None, "size": None}
    try:
        proc = subprocess.run([sys.executable, "-I", "-S", _check.__file__, "--max-mb", str(MEMORY_MB), str(path)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=TIME_S)
    except subprocess.TimeoutExpired:
        return {**refused, "error": f"checking it took over {TIME_S:.0f} s: not a checkpoint of tensors"}
    for line in proc.stdout.splitlines():
        if line.startswith("ORCH_RESULT "):
            return json.loads(line[len("ORCH_RESULT "):])
    if "MemoryError" in proc.stderr:
        return {**refused, "error": f"checking it needed over {MEMORY_MB} MB: not a checkpoint of tensors"}
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return {**refused, "error": f"the check failed on it ({last})"}


def refuse_unsafe(path: Path) -> None:
    """A resume that would upload ``path``: refused up front (exit 2), before anything is opened."""
    _, why = vet(path)
    if why is not None:
        raise UsageError(f"--resume: {why}")
