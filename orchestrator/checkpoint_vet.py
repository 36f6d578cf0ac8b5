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
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.text import clean
from playbooks.on_instance import checkpoint as _check


def vet(path: Path) -> tuple[int | None, str | None]:
    """(the epochs ``path`` holds, None) when it is a checkpoint to resume from; else (None, why not)."""
    info = _check.check(str(path))
    if not info["exists"]:
        return None, f"{path} is not a regular file"
    if not info["loads"]:
        return None, f"{path} is not resumable ({clean(info.get('error'), 200)})"
    return info["epoch"], None


def refuse_unsafe(path: Path) -> None:
    """A resume that would upload ``path``: refused up front (exit 2), before anything is opened."""
    _, why = vet(path)
    if why is not None:
        raise UsageError(f"--resume: {why}")
