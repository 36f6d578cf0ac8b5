"""Fabric tasks that make an instance ready as its provisioning says (``orchestrator.provisioning``:
a job kind's): the right torch for the device first, then the provisioning's packages over it.

Idempotent, and run again after every start: on RunPod a stop wipes the container disk (only the
volume at ``/workspace`` survives), so whatever orch installed outside the volume must be found
missing and installed again, and whatever lives on the volume reused.

Which Python: the one recorded in the work dir by an earlier provisioning, if it still works; else
the first of ``$ORCH_PYTHON`` (the local provider points it at the controller's own),
``/opt/pytorch/bin/python`` (AWS's Deep Learning AMIs), ``python3`` and ``python``. When that Python has a torch that works for the device and every
package, nothing is installed. Otherwise orch installs into a virtual environment in the work dir, which is on the
volume where the provider has one, made with ``--system-site-packages`` so that the image's own
torch is used when it works: after a restart nothing needs installing again (measured in
bench/restart_provision.py). Where no venv can be made (no ``venv`` module in the image), orch
installs into the image's Python, and again after each restart that wiped it.
"""

from __future__ import annotations

import shlex

from fabric import task

from orchestrator.ssh import remote
from orchestrator.errors import OrchError, VerifyFailed
from orchestrator.provisioning import MACHINE, Provisioning
from playbooks import host

# PyTorch publishes one wheel index per CUDA minor; the driver runs any build up to its own version.
CUDA_INDEXES = ["13.0", "12.9", "12.8", "12.6", "12.4", "12.1", "11.8"]
TORCH_INDEX = "https://download.pytorch.org/whl/"
# The marker as first written (an instance provisioned before finds its block by it, whatever it installed).
BASHRC_MARK = "# >>> orch: the Python that has torch and LibreYOLO (written by orch at every provisioning) >>>"


def _q(s: str) -> str:
    return shlex.quote(s)


def base_python(c) -> str:
    """The Python to start from: the recorded one if it still runs, else the image's."""
    rec = _q(f"{host.workdir(c)}/python")
    # /opt/pytorch/bin/python: where AWS's Deep Learning AMIs keep their PyTorch (each DLAMI release
    # note's "python_location"); on its PATH is a bare python3 without torch.
    out = remote.run(c, f'for p in "$(cat {rec} 2>/dev/null)" "$ORCH_PYTHON" /opt/pytorch/bin/python python3 python; do '
                        '[ -n "$p" ] && command -v "$p" >/dev/null 2>&1 && '
                        '"$p" -c "import sys; assert sys.version_info >= (3, 9)" 2>/dev/null && '
                        '{ command -v "$p"; break; }; done', check=False)
    python = out.strip().splitlines()[-1] if out.strip() else ""
    if not python:
        raise OrchError("no Python >= 3.9 on the instance")
    return python


def probe(c, python: str, gpu: bool, packages: tuple[str, ...] = ()) -> dict:
    return host.script(c, "probe.py", "gpu" if gpu else "cpu", *packages, python_path=python)


def cuda_index(driver_cuda: str | None) -> str:
    """The newest PyTorch CUDA wheel index this driver can run."""
    if not driver_cuda:
        raise OrchError("nvidia-smi reports no CUDA driver version on the instance")
    have = tuple(int(x) for x in driver_cuda.split(".")[:2])
    for v in CUDA_INDEXES:
        if tuple(int(x) for x in v.split(".")) <= have:
            return TORCH_INDEX + "cu" + v.replace(".", "")
    raise OrchError(f"the driver's CUDA {driver_cuda} is older than any PyTorch build (11.8)")


def _missing(facts: dict, packages: tuple[str, ...]) -> list[str]:
    """The packages that do not import in the probed Python."""
    return [p for p in packages if not facts["packages"].get(p)]


def _works(facts: dict, gpu: bool) -> bool:
    return bool(facts["torch"]) and not facts["error"] and (facts["cuda_ok"] or not gpu)


@task
def provision(c, gpu: bool = False, log=print, steps: Provisioning = MACHINE) -> dict:
    """Make sure the instance has a torch that works for the request, then ``steps.packages``."""
    packages = steps.packages
    python = base_python(c)
    facts = probe(c, python, gpu, packages)
    if gpu and not _works(facts, gpu) and not facts["gpus"]:
        raise VerifyFailed("a GPU was requested but the instance has no working NVIDIA GPU "
                           "(nvidia-smi shows no GPU or driver)")
    installed = []
    if not (_works(facts, gpu) and not _missing(facts, packages)):
        python = _environment(c, python, log)
        facts = probe(c, python, gpu, packages)
    if not _works(facts, gpu):
        index = cuda_index(facts["driver_cuda"]) if gpu else TORCH_INDEX + "cpu"
        log(f"installing torch from {index}")
        _pip(c, python, f"install --upgrade torch torchvision --index-url {index}")
        installed.append("torch")
        facts = probe(c, python, gpu, packages)
        if not _works(facts, gpu):
            raise OrchError(f"torch does not work after installing it: {facts['error'] or 'CUDA kernel failed'}")
    missing = _missing(facts, packages)
    if missing:
        # Hold torch where it is: unconstrained, pip would swap in its own (CPU-only or other CUDA) build.
        pins = f"torch=={facts['torch']}\n" + (f"torchvision=={facts['torchvision']}\n" if facts["torchvision"] else "")
        constraints = remote.put_text(c, pins, f"{host.workdir(c)}/constraints.txt", 0o644)
        log(f"installing {' '.join(missing)} (torch held by a constraint)")
        _pip(c, python, f"install {' '.join(_q(p) for p in missing)} -c {_q(constraints)}")
        installed.extend(missing)
        facts = probe(c, python, gpu, packages)
        for name in _missing(facts, packages):
            raise OrchError(f"{name} does not import after installing it: {facts['package_errors'].get(name)}")
    host.record_python(c, python)
    if python.startswith(host.workdir(c) + "/venv/"):
        _sessions_use(c, python.rsplit("/", 1)[0])
    facts["installed"] = installed
    facts["python"] = python
    return facts


def _environment(c, base: str, log) -> str:
    """orch's venv in the work dir (made once, kept on the volume), else the image's Python."""
    venv = f"{host.workdir(c)}/venv"
    py = f"{venv}/bin/python"
    if remote.run(c, f"test -x {_q(py)} && {_q(py)} -c 'import sys' 2>/dev/null && echo ok", check=False).strip() == "ok":
        return py
    log(f"making a virtual environment in {venv} (kept on the volume across restarts)")
    out = c.run(f"{_q(base)} -m venv --system-site-packages {_q(venv)}", hide=True, warn=True, in_stream=False)
    if not out.ok:
        log(f"no venv here ({(out.stderr or out.stdout).strip()[-120:]}): installing into {base}")
        remote.run(c, f"rm -rf {_q(venv)}", check=False)
        return base
    return py


def _sessions_use(c, bindir: str) -> None:
    """Put orch's venv first on the PATH of SSH sessions (``orch ssh NAME -- python3 ...``): a block
    at the top of ~/.bashrc, before Ubuntu's early return for non-interactive shells. ~/.bashrc is
    on the container disk, so it is written again at every provisioning."""
    block = f"{BASHRC_MARK}\nexport PATH={_q(bindir)}:\"$PATH\"\n# <<< orch <<<\n"
    remote.run(c, f'f="$HOME/.bashrc"; touch "$f"; if ! grep -qF {_q(BASHRC_MARK)} "$f"; then '
                  f'{{ printf %s {_q(block)}; cat "$f"; }} > "$f.orch" && mv "$f.orch" "$f"; fi')


def _pip(c, python: str, args: str) -> None:
    out = c.run(f"{_q(python)} -m pip --disable-pip-version-check -q {args}", hide=True, warn=True, in_stream=False)
    if not out.ok:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        raise OrchError(f"pip {args.split()[0]} failed on the instance: {tail}")


@task
def verify(c, gpu: bool = False, facts: dict | None = None) -> dict:
    """A real 2000x2000 matmul on the device, with its name and the result: a wheel built for another
    GPU architecture says CUDA is available and fails on its first real kernel ("no kernel image").
    ``facts``: what ``provision`` answered, whose last probe ran the same proof in the environment
    it settled on; without a proof there, the proof runs now."""
    out = (facts or {}).get("proof")
    if not isinstance(out, dict) or not isinstance(out.get("ok"), bool):
        out = host.script(c, "verify_device.py", "gpu" if gpu else "cpu")
    if not out["ok"]:
        if out.get("kind") == "no-kernel-image":
            raise VerifyFailed("CUDA error: no kernel image is available for this GPU: the installed torch was "
                               f"built for another architecture ({out['error']})")
        raise VerifyFailed(f"verify failed on the {'GPU' if gpu else 'CPU'}: {out['error']}")
    return out


__all__ = ["provision", "verify", "cuda_index", "base_python", "VerifyFailed"]
