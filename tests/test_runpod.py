"""The RunPod provider against the fake RunPod (REST API v2, its GraphQL pod mutations retired) and real sshd pods."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.ssh import reach
from orchestrator.ssh import remote as ssh
from orchestrator.errors import AuthError, NoCapacity, ProviderError, SSHError, StartRefused, UsageError
from orchestrator.provider import Request, label_for
from orchestrator.ssh.reach import tcp_open
from orchestrator.provider import Status
from providers.runpod import RunPodProvider, register_providers
from tests.fakes.runpod_api import fake_runpod  # noqa: F401 - fixture

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
    assert created.status == Status.PENDING and created.endpoint is None  # no ssh.direct yet
    assert created.label == _label() and created.gpu_name == "NVIDIA GeForce RTX 4090" and not created.spot
    assert created.price_hr == pytest.approx(0.34)
    assert created.stopped_price_hr == pytest.approx(30 * 0.20 / 730)

    [sent] = fake_runpod.sent("POST", "/v2/pods")
    assert sent["gpu"]["id"] == "NVIDIA GeForce RTX 4090" and sent["gpu"]["count"] == 1 and sent["name"] == _label()
    assert sent["mounts"] == {"persistent": {"size": 30, "path": "/workspace"}} and sent["ports"] == ["22/tcp"]
    assert sent["env"]["PUBLIC_KEY"] == public_key and sent["startSsh"] is True
    # The cheapest cloud with the type in stock, and only the data centers the catalog shows it in.
    assert sent["cloud"] == "COMMUNITY" and sent["dataCenterIds"] == ["EU-SE-1"]
    # The default image is built on CUDA 12.4: every version from there on, none older.
    cudas = sent["gpu"]["allowedCudaVersions"]
    assert cudas[:3] == ["12.4", "12.5", "12.6"] and "12.3" not in cudas
    assert "env" not in created.raw  # v2 answers a pod's env (the user's secrets): never kept
    assert fake_runpod.pods[created.provider_id].host_cuda == "12.8"  # not the 11.8 host it lands on unasked

    up = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    pod = fake_runpod.pods[created.provider_id]
    assert up.status == Status.RUNNING and up.endpoint.host == pod.host.address and up.endpoint.port == pod.port
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
    [sent] = fake_runpod.sent("POST", "/v2/pods")
    assert sent["cpu"] == {"id": "cpu3c", "vcpuCount": 2} and sent["disk"] == 40
    assert not {"mounts", "gpu"} & set(sent)
    up = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    assert up.gpus == 0 and up.gpu_name is None and up.stopped_price_hr == 0  # nothing bills while stopped
    _shell(up, key_path, "echo gone > ~/marker; test -d /workspace || echo no-volume > ~/where")
    assert _shell(up, key_path, "cat ~/where").strip() == "no-volume"

    provider.stop(created.provider_id)
    assert provider.get(created.provider_id).status == Status.STOPPED
    assert fake_runpod.actions("stop") == [created.provider_id]
    provider.start(created.provider_id)
    assert fake_runpod.actions("start") == [created.provider_id]
    again = reach.wait_ssh(provider, created.provider_id, timeout=30, interval=0.05)
    assert "No such file" in _shell(again, key_path, "ls ~/marker 2>&1; true")
    provider.destroy(created.provider_id)


def test_gpu_names_resolve_against_the_catalog(provider, fake_runpod):
    types = provider.catalog(1)["SECURE"]
    assert provider.resolve_gpu("4090", types)["id"] == "NVIDIA GeForce RTX 4090"
    assert provider.resolve_gpu("nvidia geforce rtx 3090", types)["name"] == "RTX 3090"
    with pytest.raises(UsageError, match="ambiguous"):
        provider.resolve_gpu("A100", types)
    with pytest.raises(UsageError, match="no GPU type"):
        provider.create(Request(name="x", gpu="TPU v5"), _label(), "ssh-ed25519 AAAA")
    assert fake_runpod.live() == []


def test_a_planned_offer_is_rented_as_quoted_without_listing_the_gpu_types_again(provider, fake_runpod, key):
    """Plan once: a create given the offer a plan chose (``Request.quote``) rents that GPU type and
    asks RunPod for no listing of its GPU types first; without one, ``--gpu`` is resolved in one."""
    quote = next(o for o in provider.offers(Request(name="x", gpu="RTX 4090")) if o.raw["cloud"] == "SECURE")
    fake_runpod.queries.clear()
    created = provider.create(Request(name="x", gpu="RTX 4090", offer=quote.offer_id, quote=quote), _label(), key[1])
    assert fake_runpod.queries[0] == "POST /v2/pods", fake_runpod.queries
    [sent] = fake_runpod.sent("POST", "/v2/pods")
    assert sent["gpu"]["id"] == quote.offer_id == "NVIDIA GeForce RTX 4090"
    assert sent["cloud"] == "SECURE" and sent["dataCenterIds"] == ["EU-RO-1", "EU-SE-1"]  # as quoted
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]
    assert fake_runpod.pods[created.provider_id].cost_per_hr == quote.price_hr == pytest.approx(0.69)

    fake_runpod.queries.clear()
    RunPodProvider(fake_runpod.settings()).create(Request(name="y", gpu="RTX 4090"), _label("y"), key[1])
    assert [q.split("?")[0] for q in fake_runpod.queries[:3]] == ["GET /v2/catalog/gpus"] * 2 + ["POST /v2/pods"]


@pytest.mark.parametrize("request_", [Request(name="x", gpu="RTX 4090", spot=True),
                                      Request(name="x", cpu=True, spot=True),
                                      Request(name="x", gpu="RTX 4090", spot=True, bid=0.3)])
def test_spot_is_refused_before_anything_is_sent(provider, fake_runpod, request_):
    assert not provider.capabilities.spot
    with pytest.raises(UsageError, match="no spot pods"):
        provider.create(request_, _label(), "ssh-ed25519 AAAA")
    assert fake_runpod.queries == []


@pytest.mark.parametrize("lag", [0, 3])
def test_create_that_errors_after_creating_returns_the_pod(provider, fake_runpod, key, lag):
    fake_runpod.fail_create_after = 1
    fake_runpod.listing_lag = lag  # and the new pod is missing from the next listings
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]
    assert len(fake_runpod.sent("POST", "/v2/pods")) == 1  # found, not re-sent
    assert fake_runpod.queries.count("GET /v2/pods") == lag + 1  # it looked until the listing showed it


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
    assert [p for m, p, _ in fake_runpod.requests if m == "DELETE"] == [f"/v2/pods/{created.provider_id}"]
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
    assert len(fake_runpod.sent("POST", "/v2/pods")) == 1 and len(fake_runpod.live()) == 1
    fake_runpod.live()[0].hidden_listings = 0  # the listing catches up: the one pod is found by its name
    assert provider.find(_label()).provider_id == fake_runpod.live()[0].id


def test_a_refused_create_is_retried_after_a_look(provider, fake_runpod, key):
    """A 429 page made nothing: one look, then the create again (one pod)."""
    [quote] = [o for o in provider.offers(Request(name="x", gpu="RTX 4090")) if o.raw["cloud"] == "COMMUNITY"]
    fake_runpod.queries.clear()
    fake_runpod.rate_limited = 1
    created = provider.create(Request(name="x", gpu="RTX 4090", quote=quote), _label(), key[1])
    assert [p.id for p in fake_runpod.live()] == [created.provider_id]
    assert fake_runpod.queries[:3] == ["POST /v2/pods", "GET /v2/pods", "POST /v2/pods"]


@pytest.mark.parametrize("image, needs", [
    ("runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04", "12.4"),
    ("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404", "12.8"),
    ("nvidia/cuda:12.1.0-cudnn8-devel-ubuntu22.04", "12.1"),
    ("runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04", "11.8"),
    ("ubuntu:22.04", None)])
def test_cuda_versions_come_from_the_image_tag(provider, fake_runpod, key, image, needs):
    provider.create(Request(name="x", gpu="RTX 4090", image=image), _label(), key[1])
    sent = fake_runpod.sent("POST", "/v2/pods")[0]["gpu"]
    if needs is None:
        assert "allowedCudaVersions" not in sent  # the tag says nothing: nothing to ask for
    else:
        assert sent["allowedCudaVersions"][0] == needs and "13.0" in sent["allowedCudaVersions"]
    pinned = RunPodProvider(fake_runpod.settings(min_cuda="12.6"))
    pinned.create(Request(name="y", gpu="RTX 4090", image=image), _label("y"), key[1])
    assert fake_runpod.sent("POST", "/v2/pods")[1]["gpu"]["allowedCudaVersions"][0] == "12.6"


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
    a CUDA 12.4 image never starts: RunPod shows it STARTING, with no SSH published, for ever."""
    provider = RunPodProvider(fake_runpod.settings(min_cuda="11.8", container_start_minutes=0.02))
    created = provider.create(Request(name="x", gpu="RTX 4090"), _label(), key[1])
    assert fake_runpod.pods[created.provider_id].host_cuda == "11.8"
    t0 = time.monotonic()
    with pytest.raises(SSHError, match="has not started its container within 1 s"):
        reach.wait_ssh(provider, created.provider_id, timeout=600, interval=0.05)
    assert time.monotonic() - t0 < 10
    assert provider.get(created.provider_id).raw["status"] == "STARTING"  # and billing
    provider.destroy(created.provider_id)


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
    assert fake_runpod.queries == []  # nothing was sent without a key


def test_rate_limit_is_retried_after_its_retry_after(provider, fake_runpod):
    """v2's 429 goes through the shared verdict: worth another try after its Retry-After, and retried."""
    from orchestrator.provider import http

    fake_runpod.rate_limited, fake_runpod.retry_after = 1, "0.2"
    with pytest.raises(http.Transient) as limited:
        provider.api.once("GET", "/pods")
    assert limited.value.status == 429 and limited.value.wait == pytest.approx(0.2)
    fake_runpod.rate_limited = 2
    assert provider.list() == []
    assert fake_runpod.queries == ["GET /v2/pods"] * 4


def test_rate_limit_that_does_not_end_raises(fake_runpod):
    fake_runpod.rate_limited = 100
    with pytest.raises(ProviderError, match="rate limit"):
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
    fake_runpod.terminate_ignored = 1  # the delete answers 204 as usual and does nothing
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


def test_offers_come_from_the_catalog_one_per_cloud_with_their_stock(provider, fake_runpod):
    """Each type's price in each cloud, with the data centers that have it in stock (RunPod API v2
    reference, "List GPU types": ``availability`` and ``dataCenters`` per product, count and cloud)."""
    before = len(fake_runpod.queries)
    offers = {(o.offer_id, o.raw["cloud"]): o for o in provider.offers(Request(name="x", gpus=2))}
    asked = fake_runpod.queries[before:]
    assert sorted(asked) == sorted(f"GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=2&cloud={c}"
                                   for c in ("COMMUNITY", "SECURE")), asked
    rtx = offers["NVIDIA GeForce RTX 4090", "COMMUNITY"]
    assert (rtx.provider, rtx.gpu_name, rtx.gpus, rtx.vram_gb) == ("runpod", "RTX 4090", 2, 24.0)
    assert rtx.price_hr == pytest.approx(2 * 0.34) and rtx.raw["dataCenters"] == ["EU-SE-1"]
    assert rtx.disk_gb_month == 0.10 and rtx.disk_gb_month_stopped == 0.20 and rtx.stock == "high"
    secure = offers["NVIDIA GeForce RTX 4090", "SECURE"]
    assert secure.price_hr == pytest.approx(2 * 0.69) and secure.raw["dataCenters"] == ["EU-RO-1", "EU-SE-1"]
    # No spot prices (spot pods are gone).
    assert all(o.spot_hr is None and o.min_bid_per_gpu is None for o in offers.values())
    # In stock nowhere: offered with no price (never ranked), and the note says so.
    sxm = offers["NVIDIA A100-SXM4-80GB", "SECURE"]
    assert sxm.price_hr is None and sxm.note == "out of stock in every secure data center"
    only = provider.offers(Request(name="x", gpu="4090"))
    assert {o.offer_id for o in only} == {"NVIDIA GeForce RTX 4090"}


def test_an_out_of_stock_type_is_never_asked_for(provider, fake_runpod, key):
    """The catalog shows no stock of the A100 SXM anywhere: the create says so, and no pod is asked for."""
    with pytest.raises(NoCapacity, match="out of stock in every secure data center: nothing was asked"):
        provider.create(Request(name="x", gpu="A100 SXM"), _label(), key[1])
    assert fake_runpod.sent("POST", "/v2/pods") == [] and fake_runpod.live() == []
    # The cheapest cloud is out of it now: the pod goes to the cloud and data center that have it, at its price.
    for center in fake_runpod.data_centers:
        center["community"].pop("NVIDIA GeForce RTX 3090", None)
    made = provider.create(Request(name="x", gpu="RTX 3090"), _label(), key[1])
    [sent] = fake_runpod.sent("POST", "/v2/pods")
    assert (sent["cloud"], sent["dataCenterIds"]) == ("SECURE", ["US-KS-2"])
    assert made.price_hr == pytest.approx(0.43) and fake_runpod.pods[made.provider_id].data_center == "US-KS-2"


def test_a_body_the_v2_schema_does_not_define_is_refused_by_name(fake_runpod):
    """What v2 answers for a field its CreatePodRequest lacks (the v1 spelling ``gpuTypeIds``): 422,
    naming it; the fake checks every body against the published description."""
    from providers.runpod.api import Rest, RunPodError

    api = Rest(fake_runpod.key, attempts=1)
    with pytest.raises(RunPodError, match="HTTP 422.*additional properties 'gpuTypeIds' not allowed"):
        api.once("POST", "/pods", {"name": "x", "image": "i", "gpu": {"id": "NVIDIA GeForce RTX 4090"},
                                   "gpuTypeIds": ["NVIDIA GeForce RTX 4090"]})
    assert fake_runpod.live() == []


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


def test_registers_itself():
    found = []
    register_providers(found.append)
    assert found == [RunPodProvider]


def test_no_call_loads_the_sdk(fake_runpod, key, tmp_path):
    """runpod-python is a GraphQL client: the provider no longer imports it, at import or in a call."""
    code = ("import sys, providers.runpod\n"
            "from orchestrator.provider import Request\n"
            "p = providers.runpod.RunPodProvider({'api_key': sys.argv[1], 'retry_base': 0.01})\n"
            "p.list(); p.offers(Request(name='o')); p.list_volumes()\n"
            "print('runpod' in sys.modules, 'requests' in sys.modules)")
    env = {**os.environ, "RUNPOD_API_BASE_URL": fake_runpod.url}
    out = subprocess.run([sys.executable, "-c", code, fake_runpod.key], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_a_pod_from_graphql_days_keeps_working_by_its_id(provider, fake_runpod, key):
    """A pod a ledger holds from GraphQL days has the same id in v2: looked up, stopped, started and
    ended through v2 alone (the GraphQL mutations are retired)."""
    fake_runpod.retire_graphql = False
    import json
    import urllib.error
    import urllib.request

    mutation = ('mutation { podFindAndDeployOnDemand(input: {name: "%s", imageName: "runpod/base", '
                'gpuTypeId: "NVIDIA GeForce RTX 4090", gpuCount: 1, cloudType: COMMUNITY, volumeInGb: 20, '
                'volumeMountPath: "/workspace", allowedCudaVersions: ["12.8"], ports: "22/tcp", env: [{key: '
                '"PUBLIC_KEY", value: %s}]}) { id } }') % (_label("old"), json.dumps(key[1]))
    req = urllib.request.Request(fake_runpod.url + "/graphql", method="POST", data=json.dumps({"query": mutation}).encode(),
                                 headers={"Authorization": f"Bearer {fake_runpod.key}", "Content-Type": "application/json"})
    old = json.load(urllib.request.urlopen(req, timeout=30))["data"]["podFindAndDeployOnDemand"]["id"]
    fake_runpod.retire_graphql = True  # from here on GraphQL's pod mutations answer as a retired API
    req = urllib.request.Request(fake_runpod.url + "/graphql", method="POST", data=json.dumps(
        {"query": 'mutation { podStop(input: {podId: "%s"}) { id } }' % old}).encode(),
        headers={"Authorization": f"Bearer {fake_runpod.key}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError, match="410"):
        urllib.request.urlopen(req, timeout=10)
    up = reach.wait_ssh(provider, old, timeout=30, interval=0.05)
    assert up.label == _label("old") and [r.provider_id for r in provider.list()] == [old]
    provider.stop(old)
    assert provider.get(old).status == Status.STOPPED
    provider.start(old)
    reach.wait_ssh(provider, old, timeout=30, interval=0.05)
    provider.destroy(old)
    assert provider.get(old).status == Status.GONE and fake_runpod.live() == []


def test_odd_labels_and_values_arrive_as_they_were(provider, fake_runpod, key):
    """JSON bodies: a label with quotes and a backslash in a value arrive unchanged."""
    label = _label('a "b" \\ c')
    created = provider.create(Request(name="q", gpu="RTX 4090", env={"X": "\\"}), label, key[1])
    assert fake_runpod.pods[created.provider_id].name == label and fake_runpod.pods[created.provider_id].env["X"] == "\\"
