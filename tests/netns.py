"""Run a test module in a network namespace of its own, where only loopback is up.

The AWS tests talk to moto, which hands out addresses outside loopback, and the Lambda fake's hosts
listen on port 22 as Lambda's do: both run where nothing but 127.0.0.0/8 can be reached, even by
mistake, and where port 22 of a 127.x address is free. ``pytest -q`` from the repository root
collects one test per such module, which runs the module again inside ``unshare --net`` (root, as
in CI), brings loopback up there (an ioctl: no iproute2 needed) and reports the outcome.

To run one of its tests by hand, from the repository root, as root::

    unshare --net .venv/bin/python -m tests.netns tests/test_aws.py -k spot
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ENV = "ORCH_TEST_NETNS"
ROOT = Path(__file__).resolve().parent.parent


def inside() -> bool:
    return os.environ.get(ENV) == "1"


def unavailable() -> str | None:
    """Why this machine cannot make a network namespace for the tests, or None."""
    if os.geteuid() != 0:
        return "needs root (unshare --net)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", "from tests.netns import lo_up; lo_up()"],
                           cwd=ROOT, capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace here: {probe.stderr.strip()[:200]}"
    return None


def isolate(module_globals: dict, timeout: float = 1800, shards: int = 1) -> None:
    """Called at the end of a test module: outside a namespace, replace the module's tests by
    ``shards`` tests that each run their share of them inside a namespace of its own (forwarding -k,
    -x and -v), and fail with the inner output's tail. Shards run on different workers: a module of
    many slow tests is not the whole suite's longest test."""
    if inside():
        return
    path = Path(module_globals["__file__"])
    names = [n for n in module_globals if n.startswith("test_") and callable(module_globals[n])]
    for name in names:
        del module_globals[name]
    shards = max(1, min(shards, len(names)))
    for k in range(shards):
        share = names[k::shards]  # in file order, dealt round-robin: the slow ones spread
        runner = _runner(path, share if shards > 1 else [], timeout)
        runner.__name__ = f"test_{path.stem.removeprefix('test_')}_in_a_network_namespace_of_its_own" + \
            (f"_{k + 1}_of_{shards}" if shards > 1 else "")
        module_globals[runner.__name__] = runner


def _runner(path: Path, share: list[str], timeout: float):
    @pytest.mark.long(weight=3)  # a module (or its share) in one test: among the longest of the suite
    @pytest.mark.timeout(timeout)
    def runner(request):
        why = unavailable()
        if why:
            pytest.skip(f"{path.name} runs in a network namespace of its own: {why}")
        opts = request.config.option
        where = str(path.relative_to(ROOT))
        args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", *([f"{where}::{n}" for n in share] or [where])]
        if getattr(opts, "keyword", ""):
            args += ["-k", opts.keyword]
        if getattr(opts, "exitfirst", False):
            args.append("-x")
        if getattr(opts, "verbose", 0) > 0:
            args.append("-v")
        env = {k: v for k, v in os.environ.items() if k != "ORCH_TEST_DATABASE_URL"}  # a TCP server is outside
        env[ENV] = "1"
        proc = subprocess.run(["unshare", "--net", "--", sys.executable, "-m", "tests.netns", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=timeout - 30)
        out = (proc.stdout + proc.stderr).strip()
        print(out[-6000:])
        if proc.returncode == 5:
            if share and getattr(opts, "keyword", ""):
                pytest.skip(f"-k selects none of this share of {path.name}")
            pytest.fail(f"no test of {path.name} ran in the namespace:\n{out[-3000:]}")
        assert proc.returncode == 0, f"{path.name} failed in its network namespace:\n{out[-12000:]}"

    return runner


def lo_up() -> None:
    """Bring the loopback interface up (what `ip link set lo up` does), in this process's namespace."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1  # linux/sockios.h, linux/if.h
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, struct.pack("16sH22x", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


if __name__ == "__main__":  # inside `unshare --net`: loopback up, then pytest with the arguments given
    lo_up()
    os.environ[ENV] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]])
