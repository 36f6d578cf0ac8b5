"""scripts/install.sh: which torch it picks and says, and what it shows while it installs orch.

Its steps are shell functions (the script, sourced, only defines them); the whole install, torch
and all, is minutes of downloads: tried by hand, figures in issue 33's closing note. Where the CPU
pair comes from is asked of real sockets on loopback (a refused port, a silent listener, a small
HTTP index), never of the internet; only pip's downloads are recorded instead of made."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


@contextmanager
def wheel_index():
    """A PEP 503 index on loopback that serves torch's page; yields its URL and the paths asked for."""
    asked: list[str] = []

    class Index(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            found = self.path == "/whl/cpu/torch/"
            body = b'<a href="torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl">torch</a>' if found else b""
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu", asked
    finally:
        server.shutdown()
        server.server_close()


def install_torch(tmp_path, default_index: str, env: dict | None = None, pip_fails_on_index: bool = False):
    """install_torch on a machine without an NVIDIA driver, PyTorch's CPU index moved to
    default_index: what it says, how long it took, and the pip installs it ran (recorded, not run)."""
    calls = tmp_path / "pip-calls"
    calls.unlink(missing_ok=True)
    fail = 'case "$*" in *--extra-index-url*) echo "ERROR: No matching distribution found" >&2; return 1;; esac; ' \
        if pip_fails_on_index else ""
    started = time.monotonic()
    done = step(f'nvidia_driver() {{ false; }}; torch_works() {{ true; }}; '
                f'pip_() {{ shift; echo "$*" >> "{calls}"; {fail}}}; '
                f'PYTORCH_CPU_INDEX="{default_index}"; install_torch "{sys.executable}"', env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout, time.monotonic() - started, calls.read_text().splitlines() if calls.exists() else []


PAIRS = step('echo "$CUDA_PAIR"; cpu_pair').stdout.splitlines()  # the script's own pins
CUDA, CPU = PAIRS
CPU_ON_PYPI = os.uname().machine in ("aarch64", "arm64")


@pytest.fixture
def refused():
    """A loopback port bound but not listening: a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu", "Connection refused"


@pytest.fixture
def silent():
    """A loopback port that takes the connection and never answers: a network that swallows requests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"http://127.0.0.1:{s.getsockname()[1]}/whl/cpu", "no answer in 10 s"


@pytest.mark.parametrize("unreachable", ["refused", pytest.param("silent", marks=pytest.mark.long)])
def test_without_pytorchs_cpu_index_it_falls_back_to_pypi_within_30s_and_says_why(tmp_path, request, unreachable):
    index, reason = request.getfixturevalue(unreachable)
    said, took, pip = install_torch(tmp_path, index)
    assert took < 30, said
    assert f"PyTorch's CPU wheel index ({index}) cannot be reached: " in said and reason in said, said
    if CPU_ON_PYPI:  # PyPI's aarch64 wheels are the CPU build
        assert f"the CPU build ({CPU}) from PyPI" in said and pip == [f"install {CPU}"], said
    else:
        assert f"the CUDA build ({CUDA}) from PyPI, which runs on the CPU too" in said, said
        assert f"PyPI has no CPU torchvision for {os.uname().machine}" in said, said
        assert pip == [f"install {CUDA}"]


def test_the_cpu_pair_comes_from_pytorchs_index_when_it_answers_and_orch_torch_index_overrides_it(tmp_path):
    with wheel_index() as (index, asked):
        said, _, pip = install_torch(tmp_path, index)
        assert f"the CPU build ({CPU}) from {index} (PyTorch's CPU wheel index answers)" in said, said
        assert pip == [f"install {CPU} --extra-index-url {index}"] and asked == ["/whl/cpu/torch/"]

        asked.clear()  # the user's index is taken as it is: PyTorch's is not even asked
        mine = "http://127.0.0.1:9/simple"
        said, _, pip = install_torch(tmp_path, index, env={"ORCH_TORCH_INDEX": mine})
        assert f"the CPU build ({CPU}) from {mine} (ORCH_TORCH_INDEX is set)" in said, said
        assert pip == [f"install {CPU} --extra-index-url {mine}"] and asked == []

        said, _, pip = install_torch(tmp_path, index, pip_fails_on_index=True)  # the index lacks the pair
        assert f"the CUDA build ({CUDA}) from PyPI, which runs on the CPU too: the CPU build could not be had " \
               f"from {index}: ERROR: No matching distribution found" in said, said
        assert pip == [f"install {CPU} --extra-index-url {index}", f"install {CUDA}"]


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


def test_the_readme_names_every_extra_pyproject_offers():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in extras if name != "test" and f"orch-gpu[{name}]" not in readme]
    assert missing == [], f"README's install section does not name the extras {missing}"
