"""The Vast.ai provider, driven through the real vastai SDK against tests/fakes/vast_api.py."""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import AuthError, NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.provider import Endpoint, Request, label_for, tcp_open
from orchestrator.provider import Status
from orchestrator.remote import connect, run
from providers.vastai import VastAIProvider, vast_gpu_name
from tests.fakes.vast_api import PROXY_HOST, FakeVast

ROOT = Path(__file__).resolve().parents[1]
LABEL = label_for("0123456789ab", "train")
DISK_HR = 0.15 * 20 / 730  # offer 1001's storage for the default 20 GB, per hour


@pytest.fixture
def fake(tmp_path):
    with FakeVast(tmp_path) as f:
        yield f


def make_provider(fake, tmp_path, **settings):
    base = {"api_key": fake.key, "server_url": fake.url, "ssh_user": getpass.getuser(), "poll_seconds": 0.02}
    return VastAIProvider({**base, **settings}, home=tmp_path)


@pytest.fixture
def provider(fake, tmp_path):
    return make_provider(fake, tmp_path)


@pytest.fixture(scope="module")
def keypair(tmp_path_factory):
    key = tmp_path_factory.mktemp("keys") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch-test", "-f", str(key)], check=True)
    return key, (key.with_suffix(".pub")).read_text().strip()


def ssh(remote, key, command):
    conn = connect(remote.endpoint.host, remote.endpoint.port, remote.endpoint.user, key, None)
    try:
        return run(conn, command)
    finally:
        conn.close()


def sdk(fake, retry=3):
    from vastai import VastAI

    return VastAI(api_key=fake.key, server_url=fake.url, retry=retry)


# -- offers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", ["RTX 4090", "NVIDIA GeForce RTX 4090", "4090", "rtx_4090"])
def test_offers_keep_only_suitable_machines_cheapest_first(fake, provider, given):
    offers = provider.offers(Request(name="x", gpu=given))
    # 1002 unverified, 1003 unreliable, 1004 no direct port, 1005 old CUDA, 1006 slow, 1010 not rentable.
    assert [o.offer_id for o in offers] == ["1001", "1007"]
    best = offers[0]
    assert best.gpu_name == "RTX 4090" and best.gpus == 1 and best.vram_gb == 24.0
    assert best.price_hr == pytest.approx(0.40 + DISK_HR, abs=1e-5)
    assert best.spot_hr == pytest.approx(0.20 + DISK_HR, abs=1e-5)  # min_bid leaves the disk out
    assert best.disk_gb_month == 0.15 and best.reliability == 0.99 and best.location == "Sweden, SE"
    body = fake.calls("POST", r"/bundles/$")[-1].body
    assert body["gpu_name"] == {"eq": "RTX 4090"} and body["num_gpus"] == {"eq": 1}  # typed, not "1"
    assert body["allocated_storage"] == 20.0


def test_offers_without_gpu_name_and_with_a_price_cap(fake, tmp_path, provider):
    assert [o.offer_id for o in provider.offers(Request(name="x"))] == ["1009", "1001", "1007"]
    capped = make_provider(fake, tmp_path, max_price_hr=0.5)
    assert [o.offer_id for o in capped.offers(Request(name="x"))] == ["1009", "1001"]
    assert [o.offer_id for o in provider.offers(Request(name="x", gpu="A100 SXM4", gpus=2))] == ["1008"]
    assert provider.offers(Request(name="x", gpu="H100 SXM")) == []


def test_gpu_names_normalise_to_vasts_form():
    assert vast_gpu_name("NVIDIA GeForce RTX 3080 Ti") == "RTX 3080 Ti"
    assert vast_gpu_name("1080") == "GTX 1080"
    assert vast_gpu_name("A100 SXM4") == "A100 SXM4"


def test_no_offer_means_no_capacity_and_nothing_rented(fake, provider):
    with pytest.raises(NoCapacity):
        provider.create(Request(name="x", gpu="H100 SXM"), LABEL, "ssh-ed25519 AAAA x")
    assert fake.calls("PUT", r"/asks/") == [] and fake.live() == []


# -- the lifecycle -----------------------------------------------------------------------------
def test_lifecycle_create_ssh_stop_start_destroy(fake, provider, keypair):
    key, public = keypair
    remote = provider.create(Request(name="train", gpu="4090"), LABEL, public)
    assert remote.label == LABEL and remote.status == Status.PENDING and remote.endpoint is None
    create = fake.calls("PUT", r"^/api/v0/asks/1001/$")[0].body
    assert create["price"] is None and create["label"] == LABEL and create["disk"] == 20.0
    assert create["image"].startswith("pytorch/pytorch:") and create["runtype"] == "ssh_direc ssh_proxy"
    # The key is attached by create itself, before anyone could wait for SSH.
    attach = fake.calls("POST", rf"/instances/{remote.provider_id}/ssh/$")
    assert [a.body["ssh_key"] for a in attach] == [public]

    up = provider.wait_ssh(remote.provider_id, timeout=30, interval=0.05)
    assert up.status == Status.RUNNING and up.spot is False
    assert up.endpoint.host == up.raw["public_ipaddr"] and up.endpoint.host != PROXY_HOST  # the direct route
    assert up.price_hr == pytest.approx(0.40 + DISK_HR, abs=1e-5)
    assert up.stopped_price_hr == pytest.approx(DISK_HR, abs=1e-5)
    assert ssh(up, key, "echo hi").strip() == "hi"
    ssh(up, key, f'echo {remote.provider_id} > "$HOME/keep.txt"')
    assert [r.label for r in provider.list()] == [LABEL]

    provider.stop(remote.provider_id)
    stopped = provider.get(remote.provider_id)
    assert stopped.status == Status.STOPPED and stopped.endpoint is None
    assert not tcp_open(up.endpoint)
    assert (fake.home(remote.provider_id) / "keep.txt").exists()

    assert provider.start(remote.provider_id).status == Status.PENDING
    again = provider.wait_ssh(remote.provider_id, timeout=30, interval=0.05)
    assert ssh(again, key, 'cat "$HOME/keep.txt"').strip() == remote.provider_id

    provider.destroy(remote.provider_id)
    assert provider.get(remote.provider_id).status == Status.GONE
    assert fake.live() == [] and provider.list() == []
    assert not tcp_open(again.endpoint)
    provider.destroy(remote.provider_id)  # already gone: fine


def test_wait_ssh_falls_back_to_the_proxy_only_when_the_direct_route_is_dead(tmp_path, keypair):
    key, public = keypair
    with FakeVast(tmp_path, direct_broken=True) as fake:
        provider = make_provider(fake, tmp_path, direct_ssh_grace=0.3)
        remote = provider.create(Request(name="x", gpu="4090"), LABEL, public)
        notes = []
        up = provider.wait_ssh(remote.provider_id, timeout=30, progress=notes.append, interval=0.05)
        proxy = Endpoint(up.raw["ssh_host"], up.raw["ssh_port"], getpass.getuser())
        assert up.endpoint == proxy and any("proxy" in n for n in notes)
        assert proxy in provider.get(remote.provider_id).routes  # offered, for the ledger to keep
        assert ssh(up, key, "echo hi").strip() == "hi"


def test_spot_create_bids_the_live_minimum_plus_margin(fake, provider):
    fake.offers[0]["min_bid"] = 0.26  # the catalog moved since anyone last looked
    remote = provider.create(Request(name="x", gpu="4090", spot=True), LABEL, "ssh-ed25519 AAAA x")
    assert fake.calls("PUT", r"/asks/1001/$")[0].body["price"] == pytest.approx(0.273)
    assert remote.spot is True


def test_an_explicit_bid_is_sent_and_a_bid_below_the_live_minimum_refused(fake, provider):
    with pytest.raises(UsageError, match="below"):
        provider.create(Request(name="x", gpu="4090", spot=True, bid=0.1), LABEL, "ssh-ed25519 AAAA x")
    assert fake.calls("PUT", r"/asks/") == []
    provider.create(Request(name="x", gpu="4090", spot=True, bid=0.25), LABEL, "ssh-ed25519 AAAA x")
    assert fake.calls("PUT", r"/asks/")[0].body["price"] == 0.25


def test_outbid_spot_instance_shows_stopped_and_still_bills_storage(fake, provider, keypair):
    remote = provider.create(Request(name="x", gpu="4090", spot=True), LABEL, keypair[1])
    up = provider.wait_ssh(remote.provider_id, timeout=30, interval=0.05)
    fake.outbid(remote.provider_id)
    now = provider.get(remote.provider_id)
    assert now.status == Status.STOPPED and now.spot is True and now.endpoint is None
    assert now.stopped_price_hr == pytest.approx(DISK_HR, abs=1e-5)
    assert not tcp_open(up.endpoint)


def test_a_hand_picked_offer_is_rented(fake, provider):
    remote = provider.create(Request(name="x", offer="1009"), LABEL, "ssh-ed25519 AAAA x")
    assert remote.gpu_name == "RTX 3090" and fake.calls("PUT", r"/asks/1009/$")
    with pytest.raises(NoCapacity, match="1009"):  # rented now
        provider.create(Request(name="y", offer="1009"), label_for("0123456789ac", "y"), "ssh-ed25519 AAAA x")


# -- create errors never duplicate nor orphan --------------------------------------------------
def test_the_sdks_own_resend_after_a_502_hides_a_billing_instance(fake):
    """Why the provider looks before it retries: the fake reproduces the SDK's trap."""
    import requests

    fake.create_fails_after_creating()
    with pytest.raises(requests.HTTPError) as err:
        sdk(fake).create_instance(1001, image="img", disk=20, label=LABEL)
    assert err.value.response.status_code == 404 and err.value.response.json()["error"] == "no_such_ask"
    assert len(fake.live()) == 1


def test_a_create_that_errors_after_creating_returns_the_one_instance(fake, provider):
    fake.create_fails_after_creating()
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert [i["id"] for i in fake.live()] == [int(remote.provider_id)]
    assert len(fake.calls("PUT", r"/asks/")) == 1
    assert fake.calls("POST", rf"/instances/{remote.provider_id}/ssh/$")


def test_a_create_that_errors_before_creating_is_retried_once_checked(fake, provider):
    fake.inject(503, "Service Unavailable", method="PUT", path=r"/asks/")
    provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert len(fake.live()) == 1
    methods = [(r.method, r.path) for r in fake.requests]
    first, second = [i for i, m in enumerate(methods) if m[1].startswith("/api/v0/asks/")]
    assert ("GET", "/api/v1/instances/") in methods[first:second]  # looked before re-sending


def test_an_offer_taken_meanwhile_moves_to_the_next_cheapest(fake, provider):
    fake.inject(404, {"success": False, "error": "no_such_ask", "msg": "Instance type by id 1001 is not available."},
                method="PUT", path=r"/asks/1001/")
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert remote.raw["machine_id"] == 1507 and len(fake.live()) == 1


def test_a_create_error_with_a_failing_listing_does_not_retry_blind(fake, provider):
    fake.create_fails_after_creating()
    fake.fail_listing(times=10)
    with pytest.raises(ProviderError, match="created anyway"):
        provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert len(fake.calls("PUT", r"/asks/")) == 1


# -- listing, errors ---------------------------------------------------------------------------
def test_a_failed_listing_raises_where_the_sdk_shows_an_empty_fleet(fake, provider):
    provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    fake.fail_listing(times=1)
    assert sdk(fake).show_instances() == []  # the SDK's trap
    fake.fail_listing(times=1)
    with pytest.raises(ProviderError):
        provider.list()
    assert [r.label for r in provider.list()] == [LABEL]


def test_listing_follows_every_page_and_keeps_only_orch_labels(tmp_path):
    with FakeVast(tmp_path, page_limit=1) as fake:
        client = sdk(fake)
        client.create_instance(1001, image="img", disk=20, label=label_for("0123456789aa", "one"))
        client.create_instance(1007, image="img", disk=20, label="someone-elses")
        client.create_instance(1009, image="img", disk=20, label=label_for("0123456789bb", "two"))
        labels = [r.label for r in make_provider(fake, tmp_path).list()]
        assert labels == [label_for("0123456789aa", "one"), label_for("0123456789bb", "two")]
        assert len(fake.calls("GET", r"^/api/v1/instances/$")) == 3


def test_a_refused_start_says_the_disk_is_safe(fake, provider):
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    provider.wait_ssh(remote.provider_id, timeout=30, interval=0.05)
    provider.stop(remote.provider_id)
    fake.refuse_start()
    with pytest.raises(StartRefused, match="disk is kept"):
        provider.start(remote.provider_id)
    assert provider.get(remote.provider_id).status == Status.STOPPED


def test_key_and_url_from_the_environment_after_the_sdk_was_imported(fake, tmp_path, monkeypatch):
    import vastai  # noqa: F401 - imported before VAST_URL is set, which the SDK alone would miss

    monkeypatch.setenv("VAST_API_KEY", fake.key)
    monkeypatch.setenv("VAST_URL", fake.url)
    assert [o.offer_id for o in VastAIProvider({}).offers(Request(name="x", gpu="4090"))] == ["1001", "1007"]


def test_a_bad_key_is_an_auth_error(fake, tmp_path):
    bad = make_provider(fake, tmp_path, api_key="not-the-key")
    with pytest.raises(AuthError):
        bad.offers(Request(name="x"))
    with pytest.raises(AuthError):
        bad.list()


def test_no_key_anywhere_is_an_auth_error_before_any_request(fake, tmp_path, monkeypatch):
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    with pytest.raises(AuthError, match="VAST_API_KEY"):
        VastAIProvider({"server_url": fake.url}).offers(Request(name="x"))
    assert fake.requests == []


def test_rate_limits_and_server_errors_are_retried(fake, provider):
    fake.rate_limit(2)  # plain text, no Retry-After
    assert provider.offers(Request(name="x", gpu="4090"))
    assert len(fake.calls("POST", r"/bundles/$")) == 3
    fake.rate_limit(1, quota=True, retry_after=0)
    assert provider.offers(Request(name="x", gpu="4090"))
    fake.server_error(1, status=502, path=r"/api/v1/instances/")
    assert provider.list() == []


def test_a_search_quota_without_retry_after_is_not_hammered(fake, provider):
    fake.rate_limit(1, quota=True)
    with pytest.raises(ProviderError, match="quota"):
        provider.offers(Request(name="x", gpu="4090"))
    assert len(fake.calls("POST", r"/bundles/$")) == 1


def test_cpu_only_is_refused_before_anything_is_created(fake, provider):
    assert provider.capabilities.cpu_only is False
    with pytest.raises(UsageError, match="CPU-only"):
        provider.validate(Request(name="x", cpu=True))
    with pytest.raises(UsageError):
        provider.create(Request(name="x", cpu=True), LABEL, "ssh-ed25519 AAAA x")
    assert fake.requests == []


# -- inside the instance -----------------------------------------------------------------------
@pytest.mark.parametrize("destroy", [False, True])
def test_the_instance_stops_or_destroys_itself_with_its_own_key(fake, provider, keypair, destroy):
    key, public = keypair
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, public)
    up = provider.wait_ssh(remote.provider_id, timeout=30, interval=0.05)
    command = provider.self_stop_command(up.provider_id, destroy)
    assert fake.container_key(remote.provider_id) not in command and fake.key not in command
    try:
        ssh(up, key, command)
    except Exception:  # noqa: BLE001 - the session dies with its instance, mid-answer perhaps
        pass
    want = Status.GONE if destroy else Status.STOPPED
    deadline = time.monotonic() + 10  # Vast may show a destroyed instance for a poll or two
    while provider.get(remote.provider_id).status != want and time.monotonic() < deadline:
        time.sleep(0.05)
    assert provider.get(remote.provider_id).status == want


def test_a_container_key_reaches_its_own_instance_only(fake, provider):
    import requests

    a = provider.create(Request(name="a", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    b = provider.create(Request(name="b", gpu="3090"), label_for("0123456789ac", "b"), "ssh-ed25519 AAAA x")
    headers = {"Authorization": "Bearer " + fake.container_key(a.provider_id)}
    assert requests.get(f"{fake.url}/api/v0/instances/{a.provider_id}/", headers=headers).status_code == 200
    assert requests.get(f"{fake.url}/api/v0/instances/{b.provider_id}/", headers=headers).status_code == 401


# -- packaging ---------------------------------------------------------------------------------
def test_importing_the_provider_does_not_import_the_sdk():
    code = ("import sys, providers.vastai; "
            "sys.exit(any(m == 'vastai' or m.startswith('vastai.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_provider_registers_itself():
    from providers.vastai import register_providers

    found = []
    register_providers(register=found.append)
    assert found == [VastAIProvider] and VastAIProvider.name == "vastai"
    assert Endpoint("h", 1).user == "root" and VastAIProvider().ssh_user == "root"
