"""On the local provider a task's installs stay on its instance (issue 55, 5): each instance has a
Python of its own that sees orch's packages but installs into itself, so a task's `pip install`
never changes orch's own environment. The package installed is a wheel the test writes (no
network)."""

from __future__ import annotations

import base64
import hashlib
import os
import site
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from tests.conftest import run_orch
from tests.test_tasks import live_instances, write


def wheel(folder: Path, name: str, value: str) -> Path:
    """A pure-Python wheel of one module, ``name.VALUE = value`` (PEP 427's layout, written by hand)."""
    files = {f"{name}.py": f"VALUE = {value!r}\n".encode(),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: orch-test\nRoot-Is-Purelib: true\n"
                                            b"Tag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for p, data in files.items():
            z.writestr(p, data)
        z.writestr(f"{name}-1.0.dist-info/RECORD", record)
    return path


def controller_has(name: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({name!r}) else 1)"
    return subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_a_tasks_pip_install_goes_to_its_instance_never_into_orchs_environment(orch_home, tmp_path):
    name = f"orch_probe_{uuid.uuid4().hex[:8]}"
    whl = wheel(tmp_path / "work", name, "installed on the instance")
    sites = [Path(d) for d in site.getsitepackages() if os.path.isdir(d)]
    before = {d: sorted(os.listdir(d)) for d in sites}
    task = write(tmp_path / "task.yaml", f"""
        name: pins
        resources: {{cpu: true}}
        workdir: work
        run: pip install --no-index --no-deps {whl.name} && python -c "import {name}; print({name}.VALUE)"
        """)
    try:
        run_orch("run", "-f", task, "--wait", check=0)
        log = (orch_home / "runs" / "pins" / "train.log").read_text()
        assert "installed on the instance" in log, log[-2000:]
        assert not controller_has(name), "the task's install reached orch's own environment"
        assert {d: sorted(os.listdir(d)) for d in sites} == before, "orch's site-packages changed"
    finally:  # on an orch without the fix the install landed in the shared environment: take it back out
        if controller_has(name):
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", name], check=False)
    assert live_instances() == []


def test_a_create_interrupted_while_it_makes_the_instances_python_leaves_nothing(orch_home, monkeypatch):
    """Ctrl-C while the local provider makes an instance's Python (before its meta.json, which every
    listing reads) left a folder that no listing showed and no destroy by label found: a create is
    all or nothing, as a cloud's is."""
    import pytest

    from orchestrator import config
    from orchestrator.ledger.ledger import new_id
    from orchestrator.provider import Request, label_for
    from providers.local import LocalProvider
    from providers.local import python as instance_python

    def interrupted(home):
        raise KeyboardInterrupt

    monkeypatch.setattr(instance_python, "make", interrupted)
    local = LocalProvider({}, orch_home)
    label = label_for(new_id(), "reflex")
    with pytest.raises(KeyboardInterrupt):
        local.create(Request(name="reflex", cpu=True), label, config.ssh_key()[1])
    assert not (orch_home / "local" / label).exists() and local.find(label) is None
