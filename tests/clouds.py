"""What the reconcile, fault, concurrency and secrets tests share: fake clouds configured for the
``orch`` CLI, instances arranged without provisioning, and the checks a user would make.

    from tests.clouds import runpod, vast  # noqa: F401  (fixtures)
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.ssh import reach
from orchestrator import states
from tests.conftest import ROOT
from tests.fakes.runpod_api import FakeRunPod
from tests.fakes.vast_api import FakeVast


def configure(orch_home: Path, provider: str | None = None, settings: dict | None = None, **top) -> None:
    """Add ``[providers.PROVIDER]`` settings (and top-level ones) to $ORCH_HOME/config.toml."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from orchestrator import config

    path = orch_home / "config.toml"
    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    data.update(top)
    if provider:
        data.setdefault("providers", {})[provider] = settings or {}
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, section in data.get("providers", {}).items():
        lines += [f"[providers.{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in section.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)  # it holds keys: orch warns about a config.toml others can read
    config._load.cache_clear()


@pytest.fixture
def runpod(orch_home, tmp_path, monkeypatch):
    """A fake RunPod configured for orch; yields (fake, env for ``run_orch``). Its ports show at once
    (late ports have their own tests): these tests run many ``orch up``."""
    with FakeRunPod(tmp_path / "runpod", runtime_delay=0) as fake:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
        configure(orch_home, "runpod", fake.settings(destroy_timeout=5))
        yield fake, {"RUNPOD_API_BASE_URL": fake.url}


@pytest.fixture
def vast(orch_home, tmp_path, monkeypatch):
    """A fake Vast.ai configured for orch, behaving as Vast does (direct SSH route silent, the proxy
    working, starts that schedule); yields (fake, env for ``run_orch``)."""
    with FakeVast(tmp_path, boot_polls=1) as fake:
        monkeypatch.setenv("VAST_URL", fake.url)
        configure(orch_home, "vastai", {"api_key": fake.key, "ssh_user": getpass.getuser(), "poll_seconds": 0.05,
                                        "destroy_timeout": 10, "direct_ssh_grace": 0.3})
        yield fake, {"VAST_URL": fake.url}


def orch_proc(*args, env=None) -> subprocess.Popen:
    """``orch`` started in the background (text stdout/stderr pipes)."""
    from tests.conftest import orch_popen

    return orch_popen(args, env)


def lost_midway(job: str, copies: int, timeout: float, *args, node_rank: int = 0) -> tuple[str, str]:
    """``orch run ... --wait`` (``args``) in the background; once job ``job`` has ``copies`` checkpoint
    copies at home, its machine (node ``node_rank`` of the first attempt) destroyed from outside; then
    the command's end, within ``timeout`` seconds: (stdout, stderr). Killed if anything goes wrong."""
    proc = orch_proc(*args)
    try:
        ledger = open_orch().ledger
        wait_for(lambda: (ledger.job(job) or None) and (ledger.job(job).checkpoint_epoch or 0) >= copies, 240,
                 f"{copies} checkpoint copy(ies) of {job} at home")
        node = next(i for i in ledger.instances() if i.name.startswith(f"{job}-a1") and (i.node_rank or 0) == node_rank)
        open_orch().provider(node.provider).destroy(node.provider_id)
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def open_orch():
    from orchestrator.instances.lifecycle import Orch

    return Orch.open(say=lambda m: None)


def arrange(orch, name: str, provider_name: str = "local", **request):
    """A ready instance, really running at its provider, without the minutes of provisioning."""
    from orchestrator import config
    from orchestrator.provider import Request

    req = Request(name=name, cpu=True, **request) if "gpu" not in request else Request(name=name, **request)
    provider = orch.provider(provider_name)
    inst = orch.ledger.create_instance(name=name, provider=provider_name, label="", cpu_only=req.cpu,
                                       gpus=0 if req.cpu else req.gpus)
    remote = provider.create(req, inst.label, config.ssh_key()[1])
    inst = orch.move(inst, states.PROVISIONING, f"created {remote.provider_id}", provider_id=remote.provider_id,
                     price_hr=provider.prices(remote)[0])
    inst = orch._endpoint(inst, provider, reach.wait_ssh(provider, remote.provider_id, 60, interval=0.1))
    return orch.move(inst, states.READY, "arranged by the test (not provisioned)")


def legal_path(events) -> list[str]:
    """The states an instance went through; fails unless every step is a transition the lifecycle
    allows, each starting where the previous one ended (notes stay in place)."""
    assert events, "no events"
    first = events[0]
    assert first.from_state is None and (first.to_state == states.REQUESTED or first.actor == "reconcile"), first
    path, state = [first.to_state], first.to_state
    for e in events[1:]:
        assert e.from_state == state, f"{e.from_state} -> {e.to_state} recorded while the instance was {state}"
        if e.to_state != e.from_state:
            assert states.allowed(e.from_state, e.to_state), f"illegal {e.from_state} -> {e.to_state}"
            path.append(e.to_state)
            state = e.to_state
    return path


def local_billing(orch_home: Path) -> set[str]:
    """Labels of the local instances that exist (and would bill)."""
    root = orch_home / "local"
    return {d.name for d in root.iterdir()} if root.exists() else set()


WAIT_FIRST_S, WAIT_MOST_S = 0.1, 1.0


def wait_for(pred, timeout: float = 30.0, what: str = "condition", every: float | None = None):
    """``pred()``'s first true value, asked until ``timeout`` and once more at the deadline.

    By default it is asked often at first and less as the wait goes on (0.1 s apart, half as long
    again each time, at most 1 s): many predicates are an orch command or an SSH round trip, and a
    wait of a minute asked at 10 Hz was 600 of them (a reaper's schedule waited on through ``orch
    reaper status`` cost 7 CPU-s). ``every``: a fixed pause instead, short for a state that lasts
    only a moment (a node while it provisions), long for a predicate that is costly to ask."""
    deadline = time.monotonic() + timeout
    pause = every or WAIT_FIRST_S
    while True:
        value = pred()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(min(pause, left))
        if every is None:
            pause = min(pause * 1.5, WAIT_MOST_S)


@contextlib.contextmanager
def provider_installed(cls):
    """``cls`` found as a provider for the block, registered through orch's hook as an installed
    plugin's would be (a fake cloud with one behaviour changed: a create cut, a lookup that errs)."""
    from orchestrator.hookspecs import hookimpl
    from orchestrator.provider import plugins

    class Plugin:
        @hookimpl
        def register_providers(self, register):
            register(cls)

    plugin = Plugin()
    plugins.manager().register(plugin)
    try:
        yield
    finally:
        plugins.manager().unregister(plugin)
