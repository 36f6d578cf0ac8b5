"""The RunPod provider against the fake RunPod API, through the real runpod SDK and real sshd pods."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import reach
from orchestrator import remote as ssh
from orchestrator.errors import AuthError, NoCapacity, ProviderError, SSHError, StartRefused, UsageError
from orchestrator.provider import Request, label_for
from orchestrator.reach import tcp_open
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
    # The default image is built on CUDA 12.4: every version from there on, none older.
    assert sent["allowedCudaVersions"][:3] == ["12.4", "12.5", "12.6"] and "12.3" not in sent["allowedCudaVersions"]
    assert fake_runpod.pods[created.provider_id].host_cuda == "12.8"  # not the 11.8 host it lands on unasked

    up = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    pod = fake_runpod.pods[created.provider_id]
    assert up.status == Status.RUNNING and up.endpoint.host == pod.host.address and up.endpoint.port == pod.port
    assert up.endpoint.host != PRIVATE_IP  # the private entry comes first in runtime.ports
    assert _shell(up, key_path, "echo hi").strip() == "hi"
    _shell(up, key_path, "echo kept > /workspace/marker; echo wiped > ~/marker")
    first_key = fake_runpod.pods[created.provider_id].host.host_key()

    provider.stop(created.provider_id)
    stopped = provider.get(created.provider_id)
    assert stopped.status == Status.STOPPED and stopped.endpoint is None
    assert not tcp_open(up.endpoint)  # sshd and the pod's processes are gone

    provider.start(created.provider_id)
    again = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    # The volume survived the stop; the container disk (root's home) did not (RunPod docs, "Manage Pods").
    assert _shell(again, key_path, "cat /workspace/marker").strip() == "kept"
    assert "No such file" in _shell(again, key_path, "ls ~/marker 2>&1; true")
    # RunPod's images make new SSH host keys at every start (official-templates/base start.sh).
    assert fake_runpod.pods[created.provider_id].host.host_key() != first_key
    assert provider.new_host_key_on_start

    provider.destroy(created.provider_id)
    assert provider.get(created.provider_id).status == Status.GONE
    assert not tcp_open(again.endpoint)
    provider.destroy(created.provider_id)  # already gone: success
    assert provider.list() == []


def test_cpu_pod_has_no_volume_stops_and_keeps_nothing(provider, fake_runpod, key):
    """RunPod CPU pods have container disk only (REST v2 openapi, CreatePodRequest: "CPU pods support
    container disk and network volumes only"), and stop and start like any pod: a start is a fresh
    container, whatever was written on it gone."""
    key_path, public_key = key
    created = provider.create(Request(name="cpu", cpu=True, disk_gb=40), _label("cpu"), public_key)
    sent = fake_runpod.inputs("deployCpuPod")[0]
    assert sent["instanceId"] == "cpu3c-2-4" and sent["containerDiskInGb"] == 40
    assert not {"volumeInGb", "gpuTypeId", "allowedCudaVersions"} & set(sent)
    up = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    assert up.gpus == 0 and up.gpu_name is None and up.stopped_price_hr == 0  # nothing bills while stopped
    _shell(up, key_path, "echo gone > ~/marker; test -d /workspace || echo no-volume > ~/where")
    assert _shell(up, key_path, "cat ~/where").strip() == "no-volume"

    provider.stop(created.provider_id)
    assert provider.get(created.provider_id).status == Status.STOPPED and fake_runpod.inputs("podStop")
    provider.start(created.provider_id)
    assert fake_runpod.inputs("podResume") == [{"podId": created.provider_id, "gpuCount": 0}]
    again = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    assert "No such file" in _shell(again, key_path, "ls ~/marker 2>&1; true")
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


def test_a_planned_offer_is_rented_as_quoted_without_listing_the_gpu_types_again(provider, fake_runpod, key):
    """Plan once: a create given the offer a plan chose (``Request.quote``) rents that GPU type and
    asks RunPod for no listing of its GPU types first; without one, ``--gpu`` is resolved in one."""
    [quote] = provider.offers(Request(name="x", gpu="RTX 4090"))
    fake_runpod.queries.clear()
    created = provider.create(Request(name="x", gpu="RTX 4090", offer=quote.offer_id, quote=quote), _label(), key[1])
    deploy = next(i for i, q in enumerate(fake_runpod.queries) if "podFindAndDeployOnDemand" in q)
    assert deploy == 0 and not any("gpuTypes" in q for q in fake_runpod.queries[:deploy]), fake_runpod.queries
    [sent] = fake_runpod.inputs("podFindAndDeployOnDemand")
    assert sent["gpuTypeId"] == quote.offer_id == "NVIDIA GeForce RTX 4090"
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]

    fake_runpod.queries.clear()
    RunPodProvider(fake_runpod.settings()).create(Request(name="y", gpu="RTX 4090"), _label("y"), key[1])
    asked = [parse(q)[1][0].name for q in fake_runpod.queries[:2]]
    assert asked == ["gpuTypes", "podFindAndDeployOnDemand"]


@pytest.mark.parametrize("request_", [Request(name="x", gpu="RTX 4090", spot=True),
                                      Request(name="x", cpu=True, spot=True),
                                      Request(name="x", gpu="RTX 4090", spot=True, bid=0.3)])
def test_spot_is_refused_before_anything_is_sent(provider, fake_runpod, request_):
    assert not provider.capabilities.spot
    with pytest.raises(UsageError, match="no spot pods"):
        provider.create(request_, _label(), "ssh-ed25519 AAAA")
    assert fake_runpod.queries == []


@pytest.mark.parametrize("mutation", ["podRentInterruptable", "podBidResume"])
def test_the_removed_spot_mutations_are_a_validation_error(fake_runpod, monkeypatch, mutation):
    """What RunPod's GraphQL answers for a field its schema no longer has (removed 2026-09-11)."""
    import runpod
    from runpod.api.graphql import run_graphql_query
    from runpod.error import QueryError

    monkeypatch.setattr(runpod, "api_key", fake_runpod.key)
    with pytest.raises(QueryError, match=f'Cannot query field "{mutation}" on type "Mutation"'):
        run_graphql_query(f'mutation {{ {mutation}(input: {{podId: "x", bidPerGpu: 0.2, gpuCount: 1}}) {{ id }} }}')
    assert fake_runpod.live() == []


@pytest.mark.parametrize("lag", [0, 3])
def test_create_that_errors_after_creating_returns_the_pod(provider, fake_runpod, key, lag):
    fake_runpod.fail_create_after = 1
    fake_runpod.listing_lag = lag  # and the new pod is missing from the next listings
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]
    assert len(fake_runpod.inputs("podFindAndDeployOnDemand")) == 1  # found, not re-sent
    assert sum("myself" in q for q in fake_runpod.queries) == lag + 1  # it looked until the listing showed it


def test_a_new_pod_not_visible_to_a_lookup_yet_is_pending_not_gone(provider, fake_runpod, key):
    """The create answered, and the pod's first lookups answer null: orch waits for it instead of
    calling it gone (which `orch up` would destroy, a no-op, and record destroyed while it bills)."""
    fake_runpod.lookup_lag = 3
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert created.status == Status.PENDING and created.price_hr == pytest.approx(0.34), created
    assert created.label == _label() and created.provider_id == fake_runpod.live()[0].id
    ready = reach.wait_ssh(provider, created.provider_id, 60, interval=0.05)
    assert ready.status == Status.RUNNING and ready.endpoint is not None
    provider.destroy(created.provider_id)
    assert provider.get(created.provider_id).status == Status.GONE, "once seen, a missing pod is gone"
    assert fake_runpod.live() == []


def test_a_pod_still_unseen_when_its_lookup_window_ends_is_terminated_all_the_same(fake_runpod, key):
    """The create answered, and the pod's lookups lag past the 60 s window (here 0.3 s): a lookup now
    calls it gone, yet it exists and bills. The destroy (``orch up`` giving up on it, say) still sends
    the terminate: nothing is left running."""
    provider = RunPodProvider(fake_runpod.settings(create_lookup_seconds=0.3))
    fake_runpod.lookup_lag = 10**6
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert created.status == Status.PENDING
    deadline = time.monotonic() + 10
    while provider.get(created.provider_id).status != Status.GONE:  # the window ends
        assert time.monotonic() < deadline, "the lookup window never ended"
        time.sleep(0.05)
    assert [p.id for p in fake_runpod.live()] == [created.provider_id], "it exists all the same"
    provider.destroy(created.provider_id)
    assert fake_runpod.inputs("podTerminate") == [{"podId": created.provider_id}]
    assert fake_runpod.live() == []


def test_a_pod_that_never_shows_is_not_created_twice(fake_runpod, key):
    """A 500 after the pod was made, and a listing that lags past the lookup: orch says so and sends no
    second create (RunPod answers the same 500 after making a pod: a retry could make another)."""
    provider = RunPodProvider(fake_runpod.settings(create_lookup_seconds=0.5))
    fake_runpod.fail_create_after = 1
    fake_runpod.listing_lag = 10**6
    with pytest.raises(ProviderError, match="no second create") as failed:
        provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert "orch reconcile" in str(failed.value)
    assert len(fake_runpod.inputs("podFindAndDeployOnDemand")) == 1 and len(fake_runpod.live()) == 1
    fake_runpod.live()[0].hidden_listings = 0  # the listing catches up: the one pod is found by its name
    assert provider.find(_label()).provider_id == fake_runpod.live()[0].id


def test_a_refused_create_is_retried_after_a_look(provider, fake_runpod, key):
    """A 429 page made nothing: one look, then the create again (one pod)."""
    provider.gpu_types()  # (cached: the next request is the create)
    fake_runpod.rate_limited = 1
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]
    asked = [parse(q)[1][0].name for q in fake_runpod.queries[-4:-1]]
    assert asked == ["podFindAndDeployOnDemand", "myself", "podFindAndDeployOnDemand"]


@pytest.mark.parametrize("image, needs", [
    ("runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04", "12.4"),
    ("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404", "12.8"),
    ("nvidia/cuda:12.1.0-cudnn8-devel-ubuntu22.04", "12.1"),
    ("runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04", "11.8"),
    ("ubuntu:22.04", None)])
def test_cuda_versions_come_from_the_image_tag(provider, fake_runpod, key, image, needs):
    provider.create(Request(name="x", gpu="RTX 4090", image=image), _label(), key[1])
    sent = fake_runpod.inputs("podFindAndDeployOnDemand")[0]
    if needs is None:
        assert "allowedCudaVersions" not in sent  # the tag says nothing: nothing to ask for
    else:
        assert sent["allowedCudaVersions"][0] == needs and "13.0" in sent["allowedCudaVersions"]
    pinned = RunPodProvider(fake_runpod.settings(min_cuda="12.6"))
    pinned.create(Request(name="y", gpu="RTX 4090", image=image), _label("y"), key[1])
    assert fake_runpod.inputs("podFindAndDeployOnDemand")[1]["allowedCudaVersions"][0] == "12.6"


def test_bad_min_cuda_setting_is_refused(fake_runpod):
    with pytest.raises(UsageError, match="min_cuda"):
        RunPodProvider(fake_runpod.settings(min_cuda="twelve"))
    assert fake_runpod.queries == []


def test_no_host_with_the_cuda_asked_for_is_no_capacity(provider, fake_runpod, key):
    fake_runpod.host_cudas = ["11.8", "12.2"]
    with pytest.raises(NoCapacity):
        provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert fake_runpod.live() == []


def test_a_container_that_never_starts_fails_the_wait_within_minutes(fake_runpod, key):
    """Without the right CUDA filter (here a wrong ``min_cuda``) the pod lands on an 11.8 host, where
    a CUDA 12.4 image never starts: RunPod shows it RUNNING with no runtime, for ever."""
    provider = RunPodProvider(fake_runpod.settings(min_cuda="11.8", container_start_minutes=0.02))
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert fake_runpod.pods[created.provider_id].host_cuda == "11.8"
    t0 = time.monotonic()
    with pytest.raises(SSHError, match="has not started its container within 1 s"):
        reach.wait_ssh(provider, created.provider_id, timeout=600, interval=0.05)
    assert time.monotonic() - t0 < 10
    assert provider.get(created.provider_id).raw["desiredStatus"] == "RUNNING"  # and billing
    provider.destroy(created.provider_id)


def test_a_pod_made_without_a_cuda_filter_can_land_where_it_never_starts(fake_runpod, monkeypatch):
    """The SDK's own create_pod sends no allowedCudaVersions: the fake places it on its oldest host."""
    import runpod

    monkeypatch.setattr(runpod, "api_key", fake_runpod.key)
    made = runpod.create_pod(_label("sdk"), "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
                             "NVIDIA GeForce RTX 4090")
    for _ in range(5):
        pod = runpod.get_pod(made["id"])
        assert pod["desiredStatus"] == "RUNNING" and pod["runtime"] is None
    runpod.terminate_pod(made["id"])


def test_env_values_reach_the_pod_intact(provider, fake_runpod, key):
    key_path, public_key = key
    tricky = 'say "hi"\nthen a back\\slash and a trailing one\\'
    created = provider.create(Request(name="env", gpu="RTX 4090", env={"TRICKY": tricky}), _label(), public_key)
    assert fake_runpod.pods[created.provider_id].env["TRICKY"] == tricky
    reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
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
    assert rtx.price_hr == pytest.approx(2 * 0.34)
    assert rtx.disk_gb_month == 0.10 and rtx.disk_gb_month_stopped == 0.20 and rtx.stock == "High"
    # No spot prices (spot pods are gone), not even asked for.
    assert all(o.spot_hr is None and o.min_bid_per_gpu is None for o in offers.values())
    assert "minimumBidPrice" not in fake_runpod.queries[-1] and "SpotPrice" not in fake_runpod.queries[-1]
    # stockStatus null is out of stock (gpuhunt leaves these out): the A100 SXM has a price, and no stock.
    assert "NVIDIA A100-SXM4-80GB" not in offers and len(offers) == len(fake_runpod.gpus) - 1
    only = provider.offers(Request(name="x", gpu="4090"))
    assert [o.offer_id for o in only] == ["NVIDIA GeForce RTX 4090"]


@pytest.mark.parametrize("destroy", [False, True])
def test_pod_stops_itself(provider, fake_runpod, key, destroy):
    key_path, public_key = key
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), public_key)
    up = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    command = provider.self_stop_command(up.provider_id, destroy=destroy)
    assert fake_runpod.pods[created.provider_id].key not in command and fake_runpod.key not in command
    conn = ssh.connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key_path, None)
    try:
        # A command over SSH does not see the container's RUNPOD_* (RunPod's image sources them at the
        # end of ~/.bashrc, after Ubuntu's early return): the snippet reads them from /proc/1/environ.
        assert ssh.run(conn, 'echo "[$RUNPOD_POD_ID]"').strip() == "[]"
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


def test_the_sdk_leaves_logging_as_it_found_it():
    """Importing runpod configures the root logger at INFO (its rp_upload.py calls basicConfig): an
    orch that talks to RunPod, then opens a new ledger, printed Alembic's migration steps around its
    one-line answers. orch's import of the SDK leaves no handler and no level behind."""
    code = ("import logging; from providers.runpod.api import _sdk; _sdk(); "
            "logging.getLogger('alembic.runtime.migration').info('Running upgrade  -> 0001')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_queries_are_valid_graphql(provider, fake_runpod, key):
    """Every query sent parses, and a label with quotes arrives as it was: nothing slipped through unescaped."""
    label = _label('a "b" \\ c')
    created = provider.create(Request(name="q", gpu="RTX 4090", env={"X": "\\"}), label, key[1])
    provider.list()
    for q in fake_runpod.queries:
        parse(q)
    assert fake_runpod.pods[created.provider_id].name == label
