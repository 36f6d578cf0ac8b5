"""The RunPod provider against the fake RunPod API, through the real runpod SDK and real sshd pods."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import remote as ssh
from orchestrator.errors import AuthError, NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.provider import Request, label_for, tcp_open
from orchestrator.provider import Status
from providers.runpod import RunPodProvider, register_providers
from tests.fakes.runpod_api import PRIVATE_IP, fake_runpod, parse  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def key(tmp_path) -> tuple[Path, str]:
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, (tmp_path / "id_ed25519.pub").read_text().strip()


@pytest.fixture
def provider(fake_runpod) -> RunPodProvider:
    return RunPodProvider(fake_runpod.settings())


def _label(name: str = "train") -> str:
    return label_for("0123456789ab", name)


def _shell(remote, key_path: Path, command: str) -> str:
    conn = ssh.connect(remote.endpoint.host, remote.endpoint.port, remote.endpoint.user, key_path, None)
    try:
        return ssh.run(conn, command)
    finally:
        conn.close()


def test_on_demand_pod_lifecycle(provider, fake_runpod, key):
    key_path, public_key = key
    created = provider.create(Request(name="train", gpu="RTX 4090", disk_gb=30), _label(), public_key)
    assert created.status == Status.PENDING and created.endpoint is None  # runtime is still null
    assert created.label == _label() and created.gpu_name == "RTX 4090" and not created.spot
    assert created.price_hr == pytest.approx(0.34)
    assert created.stopped_price_hr == pytest.approx(30 * 0.20 / 730)

    sent = fake_runpod.inputs("podFindAndDeployOnDemand")[0]
    assert sent["gpuTypeId"] == "NVIDIA GeForce RTX 4090" and sent["name"] == _label()
    assert sent["volumeInGb"] == 30 and sent["volumeMountPath"] == "/workspace" and sent["ports"] == "22/tcp"
    assert {"key": "PUBLIC_KEY", "value": public_key} in sent["env"]

    up = provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    pod = fake_runpod.pods[created.provider_id]
    assert up.status == Status.RUNNING and up.endpoint.host == pod.host.address and up.endpoint.port == pod.port
    assert up.endpoint.host != PRIVATE_IP  # the private entry comes first in runtime.ports
    assert _shell(up, key_path, "echo hi").strip() == "hi"
    _shell(up, key_path, "echo kept > /workspace/marker; echo wiped > ~/marker")

    provider.stop(created.provider_id)
    stopped = provider.get(created.provider_id)
    assert stopped.status == Status.STOPPED and stopped.endpoint is None
    assert not tcp_open(up.endpoint)  # sshd and the pod's processes are gone

    provider.start(created.provider_id)
    again = provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    # The volume survived the stop; the container disk (root's home) did not (RunPod docs, "Manage Pods").
    assert _shell(again, key_path, "cat /workspace/marker").strip() == "kept"
    assert "No such file" in _shell(again, key_path, "ls ~/marker 2>&1; true")

    provider.destroy(created.provider_id)
    assert provider.get(created.provider_id).status == Status.GONE
    assert not tcp_open(again.endpoint)
    provider.destroy(created.provider_id)  # already gone: success
    assert provider.list() == []


def test_cpu_pod(provider, fake_runpod, key):
    key_path, public_key = key
    created = provider.create(Request(name="cpu", cpu=True, disk_gb=40), _label("cpu"), public_key)
    sent = fake_runpod.inputs("deployCpuPod")[0]
    assert sent["instanceId"] == "cpu3c-2-4" and sent["containerDiskInGb"] == 40
    assert "volumeInGb" not in sent and "gpuTypeId" not in sent
    up = provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    assert up.gpus == 0 and up.gpu_name is None
    assert _shell(up, key_path, "echo hi").strip() == "hi"
    with pytest.raises(UsageError, match="no volume disk"):  # a stop would wipe its only disk
        provider.stop(created.provider_id)
    assert provider.get(created.provider_id).status == Status.RUNNING
    provider.destroy(created.provider_id)


def test_gpu_names_resolve_against_the_catalog(provider, fake_runpod):
    types = provider.gpu_types()
    assert provider.resolve_gpu("4090", types)["id"] == "NVIDIA GeForce RTX 4090"
    assert provider.resolve_gpu("nvidia geforce rtx 3090", types)["displayName"] == "RTX 3090"
    with pytest.raises(UsageError, match="ambiguous"):
        provider.resolve_gpu("A100", types)
    with pytest.raises(UsageError, match="no GPU type"):
        provider.create(Request(name="x", gpu="TPU v5"), _label(), "ssh-ed25519 AAAA")
    assert fake_runpod.live() == []


def test_spot_bid_comes_from_the_live_minimum(provider, fake_runpod, key):
    _, public_key = key
    gpu = fake_runpod.gpu("NVIDIA GeForce RTX 4090")
    gpu["minimumBidPrice"] = 0.31
    first = provider.create(Request(name="s1", gpu="4090", gpus=2, spot=True), _label("s1"), public_key)
    gpu["minimumBidPrice"] = 0.40  # the market moved: the next bid must follow, not a cached price
    provider.create(Request(name="s2", gpu="4090", spot=True), _label("s2"), public_key)
    bids = [i["bidPerGpu"] for i in fake_runpod.inputs("podRentInterruptable")]
    assert bids == [0.326, 0.42]  # 0.3255 rounds up, 0.42 stays
    assert first.spot and first.price_hr == pytest.approx(2 * bids[0])

    explicit = RunPodProvider(fake_runpod.settings(spot_margin=0.5))
    explicit.create(Request(name="s3", gpu="4090", spot=True, bid=0.55), _label("s3"), public_key)
    assert fake_runpod.inputs("podRentInterruptable")[-1]["bidPerGpu"] == 0.55


def test_preempted_spot_pod_is_stopped_and_resumes_with_a_bid(provider, fake_runpod, key):
    key_path, public_key = key
    created = provider.create(Request(name="spot", gpu="RTX 4090", spot=True), _label(), public_key)
    provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    fake_runpod.preempt(created.provider_id)
    gone = provider.get(created.provider_id)
    assert gone.status == Status.STOPPED and gone.spot and gone.endpoint is None

    fake_runpod.gpu("NVIDIA GeForce RTX 4090")["minimumBidPrice"] = 0.26
    provider.start(created.provider_id)
    assert fake_runpod.inputs("podResume") == []
    resumed = fake_runpod.inputs("podBidResume")
    assert resumed == [{"podId": created.provider_id, "bidPerGpu": 0.273,
                        "gpuCount": 1}]
    up = provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    assert _shell(up, key_path, "echo back").strip() == "back"
    provider.destroy(created.provider_id)


def test_create_that_errors_after_creating_returns_the_pod(provider, fake_runpod, key):
    fake_runpod.fail_create_after = 1
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]
    assert len(fake_runpod.inputs("podFindAndDeployOnDemand")) == 1  # found, not re-sent


def test_env_values_reach_the_pod_intact(provider, fake_runpod, key):
    key_path, public_key = key
    tricky = 'say "hi"\nthen a back\\slash and a trailing one\\'
    created = provider.create(Request(name="env", gpu="RTX 4090", env={"TRICKY": tricky}), _label(), public_key)
    assert fake_runpod.pods[created.provider_id].env["TRICKY"] == tricky
    provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    environ = fake_runpod.pods[created.provider_id].host.path("/proc/1/environ").read_bytes().split(b"\0")
    assert f"TRICKY={tricky}".encode() in environ, "the container's environment holds it, byte for byte"


@pytest.mark.parametrize("how", ["error", "null"])
def test_failed_listing_raises(provider, fake_runpod, key, how):
    provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    fake_runpod.fail_listing, fake_runpod.listing_failure = 100, how
    with pytest.raises(ProviderError):
        provider.list()
    fake_runpod.fail_listing = 0
    assert [r.label for r in provider.list()] == [_label()]


def test_listing_keeps_only_orch_pods(provider, fake_runpod, key):
    provider.create(Request(name="x", gpu="RTX 4090"), "someone-elses-pod", key[1])
    mine = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert [r.provider_id for r in provider.list()] == [mine.provider_id]
    assert provider.find(_label()).provider_id == mine.provider_id


def test_bad_key_is_an_auth_error(fake_runpod):
    with pytest.raises(AuthError, match="rejected the API key"):
        RunPodProvider(fake_runpod.settings(api_key="rpa_wrong")).list()


def test_missing_key_says_where_to_put_one(tmp_path, fake_runpod):
    code = ("from providers.runpod import RunPodProvider\n"
            "from orchestrator.errors import AuthError\n"
            "try:\n    RunPodProvider({}).list()\n"
            "except AuthError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "RUNPOD_API_KEY"}
    env["HOME"] = str(tmp_path)  # no ~/.runpod/config.toml
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert "no RunPod API key" in out.stdout and "RUNPOD_API_KEY" in out.stdout, out.stderr
    assert not any("myself" in q for q in fake_runpod.queries)  # nothing was sent without a key


def test_rate_limit_html_is_retried(provider, fake_runpod):
    fake_runpod.rate_limited = 2
    assert provider.list() == []
    assert len(fake_runpod.queries) == 3


def test_rate_limit_that_does_not_end_raises(fake_runpod):
    fake_runpod.rate_limited = 100
    with pytest.raises(ProviderError, match="not JSON"):
        RunPodProvider(fake_runpod.settings(retries=3)).list()
    assert len(fake_runpod.queries) == 3


def test_no_capacity(provider, fake_runpod, key):
    fake_runpod.no_capacity = 1
    with pytest.raises(NoCapacity):
        provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert fake_runpod.live() == []


def test_refused_resume_says_the_disk_is_safe(provider, fake_runpod, key):
    created = provider.create(Request(name="x", gpu="RTX 4090", disk_gb=25), _label(), key[1])
    provider.stop(created.provider_id)
    fake_runpod.refuse_resume = 1
    with pytest.raises(StartRefused) as refused:
        provider.start(created.provider_id)
    message = str(refused.value)
    assert "disk" in message and "safe" in message and "orch down" in message
    assert provider.get(created.provider_id).status == Status.STOPPED
    assert provider.start(created.provider_id).status in (Status.PENDING, Status.RUNNING)  # later, it works


def test_destroy_waits_for_confirmation(fake_runpod, key):
    impatient = RunPodProvider(fake_runpod.settings(destroy_timeout=0.3))
    created = impatient.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    fake_runpod.terminate_ignored = 1  # podTerminate answers as usual and does nothing
    with pytest.raises(ProviderError, match="did not confirm"):
        impatient.destroy(created.provider_id)
    assert impatient.get(created.provider_id).status in (Status.PENDING, Status.RUNNING)
    impatient.destroy(created.provider_id)
    assert impatient.get(created.provider_id).status == Status.GONE


def test_terminated_pod_counts_as_gone(provider, fake_runpod, key):
    fake_runpod.terminate_lag = 10**6  # RunPod keeps showing it as TERMINATED
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    provider.destroy(created.provider_id)
    assert provider.get(created.provider_id).status == Status.GONE and provider.list() == []


def test_offers_one_query_normalised(provider, fake_runpod):
    before = len(fake_runpod.queries)
    offers = {o.offer_id: o for o in provider.offers(Request(name="x", gpus=2))}
    assert len(fake_runpod.queries) == before + 1
    rtx = offers["NVIDIA GeForce RTX 4090"]
    assert (rtx.provider, rtx.gpu_name, rtx.gpus, rtx.vram_gb) == ("runpod", "RTX 4090", 2, 24.0)
    assert rtx.price_hr == pytest.approx(2 * 0.34) and rtx.spot_hr == pytest.approx(2 * 0.20)
    assert rtx.disk_gb_month == 0.10 and rtx.disk_gb_month_stopped == 0.20 and rtx.stock == "High"
    sxm = offers["NVIDIA A100-SXM4-80GB"]
    assert sxm.price_hr == pytest.approx(2 * 1.89) and sxm.spot_hr is None
    only = provider.offers(Request(name="x", gpu="4090"))
    assert [o.offer_id for o in only] == ["NVIDIA GeForce RTX 4090"]


@pytest.mark.parametrize("destroy", [False, True])
def test_pod_stops_itself(provider, fake_runpod, key, destroy):
    key_path, public_key = key
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), public_key)
    up = provider.wait_ssh(created.provider_id, timeout=30, interval=0.05)
    command = provider.self_stop_command(up.provider_id, destroy=destroy)
    assert fake_runpod.pods[created.provider_id].key not in command and fake_runpod.key not in command
    conn = ssh.connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key_path, None)
    try:
        ssh.run(conn, command, check=False)
    except Exception:  # noqa: BLE001 - the pod may go down under its own session
        pass
    finally:
        conn.close()
    assert provider.get(created.provider_id).status == (Status.GONE if destroy else Status.STOPPED)


def test_pod_key_is_scoped_to_its_pod(provider, fake_runpod, key):
    a = provider.create(Request(name="a", gpu="RTX 4090"), _label("a"), key[1])
    b = provider.create(Request(name="b", gpu="RTX 4090"), _label("b"), key[1])
    scoped = RunPodProvider(fake_runpod.settings(api_key=fake_runpod.pods[a.provider_id].key))
    assert scoped.get(a.provider_id).provider_id == a.provider_id
    with pytest.raises(ProviderError, match="scoped"):
        scoped.get(b.provider_id)


def test_spot_cpu_is_refused_before_anything_is_sent(provider, fake_runpod):
    with pytest.raises(UsageError, match="no spot CPU"):
        provider.create(Request(name="x", cpu=True, spot=True), _label(), "ssh-ed25519 AAAA")
    assert fake_runpod.queries == []


def test_the_sdk_itself_works_against_the_fake(fake_runpod, monkeypatch):
    """The fake answers the SDK's own calls as RunPod does, its unescaped quote included."""
    import runpod
    from runpod.error import QueryError

    monkeypatch.setattr(runpod, "api_key", fake_runpod.key)
    assert "NVIDIA GeForce RTX 4090" in [g["id"] for g in runpod.get_gpus()]
    assert runpod.get_gpu("NVIDIA GeForce RTX 4090", 2)["lowestPrice"]["minimumBidPrice"] == 0.20
    made = runpod.create_pod(_label("sdk"), "runpod/base", "NVIDIA GeForce RTX 4090", env={"A": "plain"})
    assert [p["name"] for p in runpod.get_pods()] == [_label("sdk")]
    assert runpod.stop_pod(made["id"])["desiredStatus"] == "EXITED"
    assert runpod.resume_pod(made["id"], 1)["desiredStatus"] == "RUNNING"
    runpod.terminate_pod(made["id"])
    assert runpod.get_pod(made["id"])["desiredStatus"] == "TERMINATED"  # for a moment, then null
    assert runpod.get_pod(made["id"]) is None
    with pytest.raises(QueryError, match="Syntax Error"):
        runpod.create_pod(_label("sdk2"), "runpod/base", "NVIDIA GeForce RTX 4090", env={"A": 'a "b"'})
    assert len(fake_runpod.live()) == 0


def test_registers_itself():
    found = []
    register_providers(found.append)
    assert found == [RunPodProvider]


def test_import_does_not_load_the_sdk():
    code = "import sys, providers.runpod; print('runpod' in sys.modules, 'requests' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_queries_are_valid_graphql(provider, fake_runpod, key):
    """Every query sent parses, and a label with quotes arrives as it was: nothing slipped through unescaped."""
    label = _label('a "b" \\ c')
    created = provider.create(Request(name="q", gpu="RTX 4090", env={"X": "\\"}), label, key[1])
    provider.list()
    for q in fake_runpod.queries:
        parse(q)
    assert fake_runpod.pods[created.provider_id].name == label
