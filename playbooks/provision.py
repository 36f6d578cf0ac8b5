"""Fabric tasks that make an instance ready to train: the right torch first, then LibreYOLO.

Idempotent: a second run on a provisioned instance only probes. The instance's Python is the
first that works of ``$ORCH_PYTHON`` (the local provider points it at the controller's own),
``python3`` and ``python``; what was chosen is kept in ``~/.orch/python``.
"""

from __future__ import annotations

import json
from pathlib import Path

from fabric import task

from orchestrator import remote
from orchestrator.errors import OrchError

HERE = Path(__file__).parent
# PyTorch publishes one wheel index per CUDA minor; the driver runs any build up to its own version.
CUDA_INDEXES = ["13.0", "12.9", "12.8", "12.6", "12.4", "12.1", "11.8"]
TORCH_INDEX = "https://download.pytorch.org/whl/"


class VerifyFailed(OrchError):
    pass


def find_python(c) -> str:
    out = remote.run(c, 'mkdir -p "$HOME/.orch"; for p in "$ORCH_PYTHON" "$(cat "$HOME/.orch/python" 2>/dev/null)" '
                        'python3 python; do [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 && '
                        '"$p" -c "import sys; assert sys.version_info >= (3, 9)" 2>/dev/null && '
                        '{ command -v "$p"; break; }; done')
    python = out.strip().splitlines()[-1] if out.strip() else ""
    if not python:
        raise OrchError("no Python >= 3.9 on the instance")
    remote.run(c, f'printf "%s\\n" {_q(python)} > "$HOME/.orch/python"')
    return python


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _script(c, python: str, name: str, *args: str, marker: str) -> dict:
    path = remote.put_text(c, (HERE / name).read_text(), f".orch/playbooks/{name}", 0o644)
    out = c.run(f"{_q(python)} {path} {' '.join(args)}", hide=True, warn=True)
    for line in out.stdout.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1:])
    raise OrchError(f"{name} printed nothing usable: {(out.stderr or out.stdout).strip()[-300:]}")


def probe(c, python: str, gpu: bool) -> dict:
    return _script(c, python, "probe.py", "gpu" if gpu else "cpu", marker="ORCH_PROBE")


def cuda_index(driver_cuda: str | None) -> str:
    """The newest PyTorch CUDA wheel index this driver can run."""
    if not driver_cuda:
        raise OrchError("nvidia-smi reports no CUDA driver version on the instance")
    have = tuple(int(x) for x in driver_cuda.split(".")[:2])
    for v in CUDA_INDEXES:
        if tuple(int(x) for x in v.split(".")) <= have:
            return TORCH_INDEX + "cu" + v.replace(".", "")
    raise OrchError(f"the driver's CUDA {driver_cuda} is older than any PyTorch build (11.8)")


@task
def provision(c, gpu: bool = False, log=print) -> dict:
    """Make sure the instance has a torch that works for the request, then LibreYOLO."""
    python = find_python(c)
    facts = probe(c, python, gpu)
    torch_ok = facts["torch"] and not facts["error"] and (facts["cuda_ok"] or not gpu)
    if gpu and not torch_ok and not facts["gpus"]:
        raise VerifyFailed("a GPU was requested but the instance has no working NVIDIA GPU "
                           "(nvidia-smi shows no GPU or driver)")
    installed = []
    if not torch_ok:
        index = cuda_index(facts["driver_cuda"]) if gpu else TORCH_INDEX + "cpu"
        log(f"installing torch from {index}")
        _pip(c, python, f"install --upgrade torch torchvision --index-url {index}")
        installed.append("torch")
        facts = probe(c, python, gpu)
        if not facts["torch"] or facts["error"] or (gpu and not facts["cuda_ok"]):
            raise OrchError(f"torch does not work after installing it: {facts['error'] or 'CUDA kernel failed'}")
    if not facts["libreyolo"]:
        # Hold torch where it is: unconstrained, pip would swap in its own (CPU-only or other CUDA) build.
        pins = f"torch=={facts['torch']}\n" + (f"torchvision=={facts['torchvision']}\n" if facts["torchvision"] else "")
        remote.run(c, f'printf %s {_q(pins)} > "$HOME/.orch/constraints.txt"')
        log("installing libreyolo (torch held by a constraint)")
        _pip(c, python, 'install libreyolo -c "$HOME/.orch/constraints.txt"')
        installed.append("libreyolo")
        facts = probe(c, python, gpu)
        if not facts["libreyolo"]:
            raise OrchError(f"libreyolo does not import after installing it: {facts.get('libreyolo_error')}")
    facts["installed"] = installed
    return facts


def _pip(c, python: str, args: str) -> None:
    out = c.run(f"{_q(python)} -m pip --disable-pip-version-check -q {args}", hide=True, warn=True)
    if not out.ok:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        raise OrchError(f"pip {args.split()[0]} failed on the instance: {tail}")


@task
def verify(c, gpu: bool = False) -> dict:
    """The seed's check: a 2000x2000 matmul on the device, with the device name and the result."""
    python = find_python(c)
    out = _script(c, python, "verify_device.py", "gpu" if gpu else "cpu", marker="ORCH_VERIFY")
    if not out["ok"]:
        if out.get("kind") == "no-kernel-image":
            raise VerifyFailed("CUDA error: no kernel image is available for this GPU: the installed torch was "
                               f"built for another architecture ({out['error']})")
        raise VerifyFailed(f"verify failed on the {'GPU' if gpu else 'CPU'}: {out['error']}")
    return out


__all__ = ["provision", "verify", "cuda_index", "find_python", "VerifyFailed"]
