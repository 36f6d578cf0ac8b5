"""A RunPod pod stopped and started again, as RunPod does it (tests/fakes/runpod_api.py): new SSH
host keys at every start, the container disk cleared, only the volume (``/workspace``) kept. orch
accepts the new key right after a start it asked for (and only then), provisions and verifies again,
and re-arms the watchdog. Through REST API v2 and the ``orch`` CLI, on real sshd pods."""

from __future__ import annotations

import json

import pytest

from orchestrator import states
from orchestrator.errors import HostKeyMismatch
from orchestrator.provider import Request, Status
from tests.clouds import configure, open_orch, runpod, wait_for  # noqa: F401 - fixture
from tests.conftest import needs_torch, run_orch

# Where orch's work dir is on the pod: the volume where there is one, else $HOME (playbooks/host.py).
WORK = 'W=/workspace; [ -d "$W" ] && [ -w "$W" ] || W="$HOME"; W="$W/orch"'
KEY_NOTE = "host key changed at the start orch asked for"


def _events(name: str) -> list:
    ledger = open_orch().ledger
    return ledger.events(ledger.by_name(name, live_only=False).id)


def _watchdogs(pod) -> list[str]:
    return [p for p in pod.host.processes() if "watchdog.py run" in p]


@needs_torch
def test_cpu_pod_stop_start_new_key_provisioned_again_watchdog_again(orch_home, runpod):
    """The issue's restart, on a CPU pod. One point cannot hold on RunPod and is asserted the way
    RunPod behaves: a CPU pod has no volume (REST v2 openapi, CreatePodRequest: "CPU pods support
    container disk and network volumes only"), so the file in its run directory is gone after the
    start. The GPU-pod test below shows the run directory kept on a volume."""
    fake, env = runpod
    run_orch("up", "r1", "--provider", "runpod", "--cpu", env=env, check=0)
    inst = open_orch().ledger.by_name("r1")
    pod = fake.pods[inst.provider_id]
    assert _watchdogs(pod), "armed at up"
    run_orch("ssh", "r1", "--", f'{WORK}; mkdir -p "$W/runs/r1" && echo kept > "$W/runs/r1/marker"', env=env, check=0)
    first_key = inst.host_key

    stop = run_orch("stop", "r1", env=env, check=0)
    assert "stopped" in stop.stdout and pod.status == "EXITED" and not pod.host.running()

    start = run_orch("start", "r1", env=env, check=0)
    assert "r1: ready" in start.stdout, start.stderr
    inst = open_orch().ledger.by_name("r1")
    assert inst.host_key != first_key and inst.host_key == pod.host.host_key()  # the new one, pinned
    assert run_orch("ssh", "r1", "--", "echo", "over-ssh", env=env).stdout.strip() == "over-ssh"
    proc = run_orch("ssh", "r1", "--", "python3", "-c", '"import torch, libreyolo; print(torch.__version__)"',
                    env=env)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    gone = run_orch("ssh", "r1", "--", f'{WORK}; ls "$W/runs/r1/marker" 2>&1; true', env=env, check=0).stdout
    assert "No such file" in gone  # a CPU pod keeps nothing across a stop (see the docstring)
    assert _watchdogs(pod), "the watchdog runs again after the start"

    events = _events("r1")
    notes = [e.reason for e in events if e.from_state == e.to_state]
    assert any(KEY_NOTE in n for n in notes), notes
    last = [e for e in events if e.from_state != e.to_state][-1]
    assert last.to_state == states.READY and last.reason.startswith("started and verified on")
    armed = open_orch().ledger.recall(inst.id, "watchdog")
    assert armed["armed_at"] >= last.at.isoformat()[:19]  # re-armed after the start

    run_orch("down", "r1", env=env, check=0)
    assert fake.live() == []


def test_gpu_pod_restart_keeps_the_run_directory_on_its_volume(orch_home, runpod):
    """The same start on a GPU pod, which has a volume: what orch keeps in its run directory
    survives. (Reached over SSH only: the fake's pods have no GPU to provision and verify.)"""
    fake, env = runpod
    orch = open_orch()
    inst = orch.up("g1", "runpod", Request(name="g1", gpu="RTX 4090", disk_gb=10), ssh_timeout=60, prepare=None)
    pod = fake.pods[inst.provider_id]
    with orch.connect(inst) as c:
        c.run(f'{WORK}; mkdir -p "$W/runs/g1" && echo kept > "$W/runs/g1/marker" && echo "$W"', hide=True)
    assert (pod.host.volume / "orch/runs/g1/marker").read_text() == "kept\n"
    first_key = inst.host_key

    inst = orch.stop(inst)
    assert inst.state == states.STOPPED and inst.stopped_price_hr == pytest.approx(10 * 0.20 / 730)
    inst = orch.start(inst, timeout=60)
    assert inst.state == states.READY and inst.host_key != first_key
    with orch.connect(inst) as c:
        assert c.run('cat /workspace/orch/runs/g1/marker', hide=True).stdout == "kept\n"
    assert _watchdogs(pod)
    assert any(KEY_NOTE in e.reason for e in orch.ledger.events(inst.id))
    orch.down(inst)
    assert fake.live() == []


def test_a_new_key_at_any_other_time_is_refused(orch_home, runpod):
    """RunPod restarting a pod on its own (orch asked for no start) brings a new key too: refused."""
    fake, env = runpod
    orch = open_orch()
    inst = orch.up("k1", "runpod", Request(name="k1", cpu=True), ssh_timeout=60, prepare=None)
    pod = fake.pods[inst.provider_id]
    with fake._lock:  # the pod's container restarted behind orch's back
        fake._halt(pod)
        fake._boot(pod)
    wait_for(lambda: orch.provider("runpod").get(inst.provider_id).status == Status.RUNNING, what="the pod")
    with pytest.raises(HostKeyMismatch):  # on its new port, found through the provider's routes
        orch.connect(orch.ledger.get(inst.id))
    assert not any(KEY_NOTE in e.reason for e in orch.ledger.events(inst.id))
    assert run_orch("ssh", "k1", "--", "true", env=env).returncode != 0  # ssh refuses the key too
    orch.down(orch.ledger.get(inst.id))


def test_a_pod_whose_container_never_starts_is_destroyed_within_minutes(orch_home, runpod):
    """The CUDA filter wrong (min_cuda below the image's 12.4): the pod lands on an 11.8 host and its
    container never starts. orch up destroys it once ``container_start_minutes`` has passed, and the
    ledger's last event says why."""
    fake, env = runpod
    configure(orch_home, "runpod", fake.settings(min_cuda="11.8", container_start_minutes=0.05, destroy_timeout=5))
    proc = run_orch("up", "c1", "--provider", "runpod", "--gpu", "RTX 4090", env=env)
    assert proc.returncode == 1 and "has not started its container within 3 s" in proc.stderr, proc.stderr
    [pod] = fake.pods.values()
    assert pod.host_cuda == "11.8" and pod.stuck and pod.status == "TERMINATED"
    assert fake.live() == []
    last = _events("c1")[-1]
    assert last.to_state == states.DESTROYED and "has not started its container" in last.reason


def test_spot_is_refused_before_anything_is_created(orch_home, runpod):
    fake, env = runpod
    proc = run_orch("up", "s1", "--provider", "runpod", "--gpu", "RTX 4090", "--spot", env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "orch: error: runpod has no spot instances (`orch check runpod` lists what it lacks): drop --spot"]
    assert not any(q.startswith(("POST", "DELETE")) for q in fake.queries) and fake.pods == {}
    assert open_orch().ledger.instances() == []
    cheapest = run_orch("up", "s2", "--provider", "runpod", "--cheapest", "--spot", env=env)
    assert cheapest.returncode == 2 and cheapest.stderr == proc.stderr
    assert fake.pods == {} and open_orch().ledger.instances() == []
    offers = json.loads(run_orch("offers", "--provider", "runpod", "--spot", "--json", env=env).stdout)
    assert [o for o in offers["offers"] if o["provider"] == "runpod"] == []
