"""scripts/install.sh: which torch it picks and says, and what it shows while it installs orch.

Its steps are shell functions (the script, sourced, only defines them); the whole install, torch
and all, is minutes of downloads: tried by hand, figures in issue 33's closing note."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "install.sh"


def step(call: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """One step of install.sh, as the script itself runs it."""
    return subprocess.run([shutil.which("bash"), "-c", f'. "{SCRIPT}"; {call}'], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="an NVIDIA driver is loaded here")
def test_the_cpu_build_is_planned_without_an_nvidia_driver_and_the_cuda_build_with_one(tmp_path):
    bare = tmp_path / "bare"  # a PATH with no nvidia-smi on it
    bare.mkdir()
    for tool in ("uname", "grep"):
        (bare / tool).symlink_to(shutil.which(tool))
    plan = step("torch_plan; cpu_pair", env={"PATH": str(bare)}).stdout.splitlines()
    assert plan[0] == "cpu no NVIDIA driver here"
    machine = os.uname().machine
    assert plan[1] == ("torch==2.9.1 torchvision==0.24.1" if machine in ("aarch64", "arm64")
                       else "torch==2.13.0+cpu torchvision==0.28.0+cpu")
    smi = tmp_path / "driver" / "nvidia-smi"  # what the driver's tool answers on a machine with a GPU
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n')
    smi.chmod(0o755)
    assert step("torch_plan", env={"PATH": f"{smi.parent}:{bare}"}).stdout.strip() == "cuda an NVIDIA driver is here"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2; exit 9\n")  # the tool without a driver
    assert step("torch_plan", env={"PATH": f"{smi.parent}:{bare}"}).stdout.startswith("cpu ")


@pytest.mark.long
def test_installing_orch_shows_no_setuptools_editable_note(tmp_path):
    checkout = tmp_path / "orch"
    shutil.copytree(ROOT, checkout, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", "build", ".pytest_cache", ".hypothesis"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "-q", "install", "--upgrade", "pip"], check=True, timeout=600,
                   capture_output=True)  # as install.sh does: a pip that shows the build backend's warnings
    plain = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps", "-e",
                            str(checkout)], capture_output=True, text=True, timeout=600)
    if "Editable installation" not in plain.stderr:
        pytest.skip("this pip does not pass setuptools' editable note on: nothing to filter")
    ours = step(f'install_orch "{python}" --no-deps --force-reinstall -e "{checkout}"')
    assert ours.returncode == 0, ours.stderr
    assert "Editable installation" not in ours.stdout + ours.stderr
    where = subprocess.run([python, "-c", "import orchestrator; print(orchestrator.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, check=True).stdout
    assert where.startswith(str(checkout)), where
