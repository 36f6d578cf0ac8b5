"""`orch up --provider runpod|vastai` end to end: the real SDKs, fake APIs on loopback, real sshd pods."""

import getpass
import json

import pytest

from orchestrator.tasks import dataset
from tests.clouds import wait_for
from tests.conftest import needs_torch, run_orch
from tests.fakes.runpod_api import FakeRunPod
from tests.fakes.vast_api import FakeVast


def configure(orch_home, provider, settings):
    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = [f"[providers.{provider}]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    (orch_home / "config.toml").write_text("\n".join(lines) + "\n")
    (orch_home / "config.toml").chmod(0o600)


@pytest.fixture
def runpod(orch_home, tmp_path, monkeypatch):
    with FakeRunPod(tmp_path / "runpod") as fake:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
        configure(orch_home, "runpod", fake.settings())
        yield fake, {"RUNPOD_API_BASE_URL": fake.url}


@pytest.fixture
def vast(orch_home, tmp_path, monkeypatch):
    with FakeVast(tmp_path) as fake:
        monkeypatch.setenv("VAST_URL", fake.url)
        configure(orch_home, "vastai", {"api_key": fake.key, "ssh_user": getpass.getuser(), "poll_seconds": 0.1,
                                        "direct_ssh_grace": 0.3})
        yield fake, {"VAST_URL": fake.url}


@needs_torch
@pytest.mark.training
def test_runpod_cpu_pod_trains_end_to_end(orch_home, runpod, tmp_path):
    fake, env = runpod
    ds = dataset.synth(tmp_path / "ds")
    up = run_orch("up", "rp1", "--provider", "runpod", "--cpu", "--data", ds, "--epochs", "1", "--imgsz", "64",
                  "--batch", "4", "--train-arg", "workers=0", "--wait", "--json", env=env, check=0)
    inst = json.loads(up.stdout)
    assert inst["provider"] == "runpod" and inst["state"] == "ready" and inst["run"]["state"] == "completed"
    assert len(fake.live()) == 1 and fake.live()[0].name.startswith(f"orch-{inst['id']}-rp1")
    assert (orch_home / "runs" / "rp1" / "weights" / "best.pt").exists()
    listed = json.loads(run_orch("status", "--json", env=env, check=0).stdout)
    assert [(i["name"], i["provider_id"]) for i in listed] == [("rp1", fake.live()[0].id)]
    run_orch("down", "rp1", env=env, check=0)
    assert fake.live() == [], "down leaves nothing billing at the provider"


@needs_torch
@pytest.mark.parametrize("provider", ["runpod", "vastai"])
def test_gpu_verify_failure_terminates_and_the_ledger_says_why(orch_home, request, provider):
    fake, env = request.getfixturevalue("runpod" if provider == "runpod" else "vast")
    proc = run_orch("up", "g1", "--provider", provider, "--gpu", "RTX 4090", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no working NVIDIA GPU" in proc.stderr or "verify failed on the GPU" in proc.stderr, proc.stderr
    detail = json.loads(run_orch("status", "g1", "--json", env=env, check=0).stdout)
    assert detail["state"] == "destroyed"
    assert "up failed" in detail["events"][-1]["reason"] and "GPU" in detail["events"][-1]["reason"]
    assert fake.live() == [], "the pod that failed verify was terminated, not left billing"


@needs_torch
@pytest.mark.training
def test_runpod_up_with_a_long_training_returns_once_it_runs(orch_home, runpod, tmp_path):
    """Issue 11: on pods whose login shell is bash, ``orch up --data`` without --wait returns within a
    minute of the training starting (a detached launch must not hold the SSH channel), and the
    training goes on: ``orch status`` says running."""
    from datetime import datetime, timezone

    fake, env = runpod
    ds = dataset.synth(tmp_path / "ds")
    up = run_orch("up", "long", "--provider", "runpod", "--cpu", "--data", ds, "--epochs", "2000", "--imgsz", "64",
                  "--batch", "4", "--train-arg", "workers=0", "--json", env=env, check=0, timeout=300)
    returned = datetime.now(timezone.utc)
    run = json.loads(up.stdout)["run"]
    started = datetime.fromisoformat(run["started_at"].replace("Z", "+00:00"))
    assert (returned - started).total_seconds() < 60, f"up returned {returned - started} after the training started"
    pod = fake.live()[0]
    status_json = pod.host.path(run["run_dir"]) / "status.json"

    def first_epoch_begun() -> bool:  # the run reports "starting" until LibreYOLO writes its status.json
        try:
            return json.loads(status_json.read_text()).get("state") is not None
        except (OSError, ValueError):
            return False

    wait_for(first_epoch_begun, timeout=120, what="LibreYOLO's status.json on the pod")
    detail = json.loads(run_orch("status", "long", "--json", env=env, check=0).stdout)
    assert detail["state"] == "ready" and detail["run"]["state"] == "running", detail["run"]
    assert any("train_entry.py" in p for p in pod.host.processes()), "the training outlived orch up's SSH session"
    assert pod.host.run("getent passwd root").stdout.strip().endswith(":/bin/bash")  # the shell that hid nothing
    run_orch("down", "long", "--no-pull", "--yes", env=env, check=0)
    assert fake.live() == []
