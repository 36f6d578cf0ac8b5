"""The Vast.ai provider, driven through the real vastai SDK against tests/fakes/vast_api.py."""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.ssh import reach
from orchestrator.errors import AuthError, NoCapacity, ProviderError, SSHError, UsageError
from orchestrator.provider import Endpoint, Request, label_for
from orchestrator.ssh.reach import tcp_open
from orchestrator.provider import Status
from orchestrator.ssh.remote import connect, run
from providers.vastai import VastAIProvider, vast_gpu_name
from tests.fakes.vast_api import PROXY_HOST, FakeVast

ROOT = Path(__file__).resolve().parents[1]
LABEL = label_for("0123456789ab", "train")
# Offer 1001's storage for the default 20 GB, per hour: Vast's month is 720 hours (the OpenAPI
# show_instance example: storage_cost x GB / 720 = dph_total - dph_base).
DISK_HR = 0.15 * 20 / 720


@pytest.fixture
def fake(tmp_path):
    with FakeVast(tmp_path) as f:
        yield f


def make_provider(fake, tmp_path, **settings):
    base = {"api_key": fake.key, "server_url": fake.url, "ssh_user": getpass.getuser(), "poll_seconds": 0.02,
            "direct_ssh_grace": 0.3}
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
    assert best.stopped_hr == pytest.approx(DISK_HR, abs=1e-6)  # the disk alone, over 720 hours
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
    assert remote.label == LABEL and remote.status in (Status.PENDING, Status.RUNNING)  # booting, or just up
    create = fake.calls("PUT", r"^/api/v0/asks/1001/$")[0].body
    assert create["price"] is None and create["label"] == LABEL and create["disk"] == 20.0
    assert create["image"].startswith("pytorch/pytorch:") and create["runtype"] == "ssh_direc ssh_proxy"
    assert create["cancel_unavail"] is True  # else a just-taken offer makes a stopped instance
    # The key is attached by create itself, before anyone could wait for SSH.
    attach = fake.calls("POST", rf"/instances/{remote.provider_id}/ssh/$")
    assert [a.body["ssh_key"] for a in attach] == [public]

    notes = []
    up = reach.wait_ssh(provider, remote.provider_id, timeout=30, progress=notes.append, interval=0.05)
    proxy = Endpoint(PROXY_HOST, up.raw["ssh_port"], getpass.getuser())
    assert up.status == Status.RUNNING and up.spot is False
    # The direct route (public_ipaddr + HostPort) is firewalled, as it often is: the proxy answers.
    assert up.endpoint == proxy and any("proxy" in n for n in notes)
    assert up.routes[0].host == up.raw["public_ipaddr"] and not tcp_open(up.routes[0], timeout=0.3)
    assert up.price_hr == pytest.approx(0.40 + DISK_HR, abs=1e-5)
    assert up.stopped_price_hr == pytest.approx(DISK_HR, abs=1e-6) == up.raw["storage_total_cost"]
    assert ssh(up, key, "echo hi").strip() == "hi"
    ssh(up, key, f'echo {remote.provider_id} > "$HOME/keep.txt"')
    assert [r.label for r in provider.list()] == [LABEL]

    provider.stop(remote.provider_id)
    stopped = provider.get(remote.provider_id)
    assert stopped.status == Status.STOPPED and stopped.endpoint is None
    assert not tcp_open(proxy)
    assert (fake.home(remote.provider_id) / "keep.txt").exists()

    # A start is accepted, then waits for its GPU (scheduling) before it runs.
    assert provider.start(remote.provider_id).status == Status.SCHEDULING
    again = reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
    assert again.endpoint == proxy  # the proxy endpoint is the instance's for good
    assert ssh(again, key, 'cat "$HOME/keep.txt"').strip() == remote.provider_id

    provider.destroy(remote.provider_id)
    assert provider.get(remote.provider_id).status == Status.GONE
    assert fake.live() == [] and provider.list() == []
    assert not tcp_open(again.endpoint)
    provider.destroy(remote.provider_id)  # already gone: fine


def test_a_direct_route_that_answers_is_preferred(tmp_path, keypair):
    key, public = keypair
    with FakeVast(tmp_path, direct_works=True) as fake:
        provider = make_provider(fake, tmp_path)
        remote = provider.create(Request(name="x", gpu="4090"), LABEL, public)
        up = reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
        assert up.endpoint.host == up.raw["public_ipaddr"] and up.endpoint.host != PROXY_HOST
        assert Endpoint(PROXY_HOST, up.raw["ssh_port"], getpass.getuser()) in up.routes  # offered too
        assert ssh(up, key, "echo hi").strip() == "hi"


def test_the_route_is_chosen_afresh_each_time_nothing_is_kept_in_memory(fake, tmp_path, keypair):
    """Each orch process is a new provider object: the ledger keeps the route, not the provider."""
    remote = make_provider(fake, tmp_path).create(Request(name="x", gpu="4090"), LABEL, keypair[1])
    first = reach.wait_ssh(make_provider(fake, tmp_path), remote.provider_id, timeout=30, interval=0.05)
    later = make_provider(fake, tmp_path)
    chosen = reach.reachable(later.get(remote.provider_id))
    assert chosen.endpoint == first.endpoint and chosen.endpoint.host == PROXY_HOST
    assert set(vars(later)) <= {"settings", "home", "_sdk"}, vars(later)  # no route state


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
    up = reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
    fake.outbid(remote.provider_id)
    now = provider.get(remote.provider_id)
    assert now.status == Status.STOPPED and now.spot is True and now.endpoint is None
    assert now.stopped_price_hr == pytest.approx(DISK_HR, abs=1e-5)
    assert not tcp_open(up.endpoint)
    # A start without a winning bid waits in scheduling while the higher bid holds the GPU ...
    assert provider.start(remote.provider_id).status == Status.SCHEDULING
    assert provider.get(remote.provider_id).status == Status.SCHEDULING
    # ... and raising the bid above it (the SDK's change_bid) wins the GPU back.
    sdk(fake).change_bid(int(remote.provider_id), price=1.0)
    assert reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05).status == Status.RUNNING


def test_a_hand_picked_offer_is_rented(fake, provider):
    remote = provider.create(Request(name="x", offer="1009"), LABEL, "ssh-ed25519 AAAA x")
    assert remote.gpu_name == "RTX 3090" and fake.calls("PUT", r"/asks/1009/$")
    with pytest.raises(NoCapacity, match="1009"):  # rented now
        provider.create(Request(name="y", offer="1009"), label_for("0123456789ac", "y"), "ssh-ed25519 AAAA x")



def test_a_quoted_offer_is_rented_as_listed_without_another_search(fake, provider):
    """Plan once: the offer a plan chose (from this provider's own listing) is rented with the
    live minimum bid its row holds; the create searches nothing."""
    asked = Request(name="x", gpu="4090", spot=True)
    quote = provider.offers(asked)[0]
    searches = len(fake.calls("POST", r"/bundles/$"))
    remote = provider.create(Request(name="x", gpu="4090", spot=True, offer=quote.offer_id, quote=quote), LABEL,
                             "ssh-ed25519 AAAA x")
    assert len(fake.calls("POST", r"/bundles/$")) == searches == 1  # the plan's listing only
    [create] = fake.calls("PUT", r"/asks/")
    assert create.path == f"/api/v0/asks/{quote.offer_id}/" and create.body["price"] == pytest.approx(0.21)
    assert remote.spot is True and [i["id"] for i in fake.live()] == [int(remote.provider_id)]


def test_a_quoted_offer_taken_meanwhile_fails_naming_it_without_listing_afresh(fake, provider):
    quote = provider.offers(Request(name="x", gpu="4090"))[0]
    fake.take_after_search(int(quote.offer_id))
    provider.offers(Request(name="x", gpu="4090"))  # someone else's plan: its search, then the offer goes
    searches = len(fake.calls("POST", r"/bundles/$"))
    with pytest.raises(NoCapacity, match=rf"offer {quote.offer_id} was taken"):
        provider.create(Request(name="x", gpu="4090", offer=quote.offer_id, quote=quote), LABEL, "ssh-ed25519 AAAA x")
    assert len(fake.calls("POST", r"/bundles/$")) == searches  # the job engine plans again, not the provider
    assert len(fake.calls("PUT", r"/asks/")) == 1 and fake.live() == []

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


def test_when_every_offer_tried_was_taken_a_fresh_listing_gives_the_next(fake, provider):
    """Concurrent ups race for the same cheapest offers: losing three is no reason to give up while
    the market has more (and no Vast failure counts against the retries)."""
    fake.offers += [dict(fake.offers[0], id=2000 + i, ask_contract_id=2000 + i, machine_id=3000 + i,
                         dph_base=0.41 + i / 100) for i in range(3)]
    for offer in (1001, 2000, 2001, 2002):
        fake.inject(404, {"success": False, "error": "no_such_ask", "msg": f"Instance type by id {offer} is not available."},
                    method="PUT", path=rf"/asks/{offer}/")
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert remote.raw["machine_id"] == 1507 and len(fake.live()) == 1  # offer 1007, from the second listing
    assert len(fake.calls("PUT", r"/asks/")) == 5


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


def test_a_start_is_accepted_then_waits_for_the_gpu_until_it_is_given_up(fake, provider):
    """Vast sends no resources_unavailable: the start is accepted and the instance schedules."""
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
    provider.stop(remote.provider_id)
    fake.gpu_taken(remote.provider_id)  # someone else rents the host's GPU meanwhile, for good
    shown = provider.start(remote.provider_id)
    assert shown.status == Status.SCHEDULING and "scheduling" in shown.detail
    assert all(provider.get(remote.provider_id).status == Status.SCHEDULING for _ in range(5))
    assert shown.stopped_price_hr == pytest.approx(DISK_HR, abs=1e-6) and shown.endpoint is None
    with pytest.raises(SSHError, match="did not answer"):  # a wait for SSH does not run it either
        reach.wait_ssh(provider, remote.provider_id, timeout=0.3, interval=0.05)
    provider.stop(remote.provider_id)  # the way to give up
    assert provider.get(remote.provider_id).status == Status.STOPPED and fake.live()

    fake.gpu_taken(remote.provider_id, polls=3)  # this time it frees after a while
    assert provider.start(remote.provider_id).status == Status.SCHEDULING
    assert reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05).status == Status.RUNNING


@pytest.mark.parametrize("state", ["exited", "offline", "unknown", "frozen"])
def test_states_that_will_not_run_by_themselves_are_broken_and_priced_running(fake, provider, keypair, state):
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, keypair[1])
    up = reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
    fake.crash(remote.provider_id, state)
    now = provider.get(remote.provider_id)
    assert now.status == Status.BROKEN and now.detail.startswith(state) and now.endpoint is None
    assert now.price_hr == up.price_hr  # billed as running (frozen: "GPU charges apply")
    with pytest.raises(SSHError, match=state):
        reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)  # at once, not after the timeout
    assert [r.status for r in provider.list()] == [Status.BROKEN]
    provider.destroy(remote.provider_id)
    assert fake.live() == []


def test_a_stopped_price_without_storage_total_cost_uses_vasts_720_hour_month(fake, provider):
    remote = provider.create(Request(name="x", gpu="4090", disk_gb=36), LABEL, "ssh-ed25519 AAAA x")
    row = fake.instances[int(remote.provider_id)]
    assert provider.get(remote.provider_id).stopped_price_hr == pytest.approx(0.15 * 36 / 720, abs=1e-6)
    row["storage_total_cost"] = 0.0123  # the instance's own figure wins where it is given
    assert provider.get(remote.provider_id).stopped_price_hr == 0.0123
    del row["storage_total_cost"]
    assert provider.get(remote.provider_id).stopped_price_hr == pytest.approx(0.15 * 36 / 720)


# -- create: a just-taken offer, an error that made an instance, a slow create ------------------
def test_without_cancel_unavail_a_just_taken_offer_makes_a_stopped_instance(fake):
    """Why the provider always sends cancel_unavail: the fake reproduces Vast's default."""
    fake.take_after_search(1001)
    client = sdk(fake)
    client.search_offers(query={"id": {"eq": 1001}}, no_default=True)
    answer = client.create_instance(1001, image="img", disk=20, label=LABEL)
    assert answer["success"] is True
    [made] = fake.live()
    assert (made["id"], made["intended_status"], made["actual_status"]) == (answer["new_contract"], "stopped",
                                                                           "stopped")


def test_a_just_taken_offer_creates_nothing_and_the_next_offer_is_rented(fake, provider):
    fake.take_after_search(1001)
    remote = provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert [c.path for c in fake.calls("PUT", r"/asks/")] == ["/api/v0/asks/1001/", "/api/v0/asks/1007/"]
    assert [i["machine_id"] for i in fake.live()] == [1507] and remote.provider_id == str(fake.live()[0]["id"])


def test_a_just_taken_hand_picked_offer_creates_nothing(fake, provider):
    fake.take_after_search(1001)
    with pytest.raises(NoCapacity, match="taken"):
        provider.create(Request(name="x", offer="1001"), LABEL, "ssh-ed25519 AAAA x")
    assert fake.live() == [] and len(fake.calls("PUT", r"/asks/")) == 1


def test_an_error_that_carries_new_contract_is_an_instance_destroyed_not_dropped(fake, provider):
    fake.min_bid_rises_after_search(1001, 0.50)  # the bid made from the search is now too low
    remote = provider.create(Request(name="x", gpu="4090", spot=True), LABEL, "ssh-ed25519 AAAA x")
    first, second = fake.calls("PUT", r"/asks/")
    assert first.path == "/api/v0/asks/1001/" and second.path == "/api/v0/asks/1007/"
    made = [iid for iid, row in fake.instances.items() if row["machine_id"] == 1501]
    assert len(made) == 1 and fake.calls("DELETE", rf"/instances/{made[0]}/$"), "the id was dropped"
    assert [i["id"] for i in fake.live()] == [int(remote.provider_id)]


def test_a_create_error_that_made_an_instance_and_cannot_destroy_it_names_it(fake, provider):
    fake.min_bid_rises_after_search(1001, 0.50)
    fake.inject(500, "<html>500</html>", method="DELETE", times=100)
    with pytest.raises(ProviderError, match=r"7000001.*still bills") as err:
        provider.create(Request(name="x", offer="1001", spot=True), LABEL, "ssh-ed25519 AAAA x")
    assert "vastai destroy instance 7000001" in str(err.value)
    assert [i["id"] for i in fake.live()] == [7000001]  # still there: the caller's lookup by label finds it


def test_a_create_is_allowed_the_sdks_120_s_not_the_ordinary_timeout(fake, tmp_path):
    provider = make_provider(fake, tmp_path, http_timeout=0.3)
    real = fake.handle

    def slow(method, path, *rest):
        if method == "PUT" and path.startswith("/api/v0/asks/"):
            time.sleep(1.0)  # longer than http_timeout, well inside create_timeout
        return real(method, path, *rest)

    fake.handle = slow
    provider.create(Request(name="x", gpu="4090"), LABEL, "ssh-ed25519 AAAA x")
    assert len(fake.calls("PUT", r"/asks/")) == 1 and len(fake.live()) == 1
    assert provider._sdk.client.timeout == 0.3  # and the ordinary calls keep theirs


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
    up = reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
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
