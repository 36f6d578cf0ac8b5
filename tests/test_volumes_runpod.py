"""RunPod network volumes through the provider, against the fake RunPod's REST API v2 (its GraphQL
mutations retired) and real sshd pods: made in a data center, never twice, listed (orch's only, with
the pods that mount each), mounted by a pod deployed there at the path asked on Secure Cloud at its
price, shared by the pods that mount it, deleted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.ssh import reach
from orchestrator.ssh import remote as ssh
from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider import Offer, Request, label_for
from orchestrator.provider.model import Mount
from playbooks import volumes as mounting
from providers.runpod import RunPodProvider
from tests.fakes.hosts import sshd_available
from tests.fakes.runpod_api import fake_runpod  # noqa: F401,F811 - a fixture


@pytest.fixture
def provider(fake_runpod) -> RunPodProvider:
    return RunPodProvider(fake_runpod.settings())


@pytest.fixture
def key(tmp_path) -> tuple[Path, str]:
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, (tmp_path / "id_ed25519.pub").read_text().strip()


def test_a_volume_is_made_in_its_data_center_listed_as_orchs_and_deleted_once(provider, fake_runpod):
    made = provider.create_volume("cache", 50, "US-KS-2")
    assert (made.name, made.provider, made.where, made.size_gb) == ("cache", "runpod", "US-KS-2", 50)
    assert made.price_gb_month == pytest.approx(0.07)  # the first TB's price (RunPod docs, "Network volumes")
    assert fake_runpod.network_volumes[made.volume_id]["name"] == "orch-vol-cache"
    fake_runpod.network_volumes["someone"] = {"id": "someone", "name": "my-own-data", "size": 10,
                                              "dataCenterId": "EU-RO-1"}
    assert [(v.name, v.volume_id, v.where) for v in provider.list_volumes()] == [("cache", made.volume_id, "US-KS-2")]

    provider.delete_volume(made)
    provider.delete_volume(made)  # already gone: no error
    assert provider.list_volumes() == [] and set(fake_runpod.network_volumes) == {"someone"}


def test_without_a_place_the_volume_goes_where_network_storage_has_the_most_gpus_in_stock(provider, fake_runpod):
    assert provider.create_volume("cache", 10, None).where == "EU-RO-1"
    assert provider.create_volume("big", 2000, None).price_gb_month == pytest.approx((1000 * 0.07 + 1000 * 0.05) / 2000)


def test_a_data_center_without_network_storage_is_refused_and_nothing_is_made(provider, fake_runpod):
    with pytest.raises(UsageError, match="EU-SE-1.*EU-RO-1, US-KS-2"):
        provider.create_volume("cache", 10, "EU-SE-1")
    assert fake_runpod.network_volumes == {} and fake_runpod.sent("POST", "/v2/network-volumes") == []


def test_a_failed_listing_is_an_error_never_no_volumes(provider, fake_runpod):
    provider.create_volume("cache", 10, "EU-RO-1")
    fake_runpod.fail_listing = 50
    with pytest.raises(ProviderError):
        provider.list_volumes()


def test_only_secure_offers_in_stock_in_the_volumes_data_center_reach_it(provider, fake_runpod):
    """A pod that mounts a network volume runs on Secure Cloud in the volume's data center (RunPod docs,
    "Network volumes"): only those offers reach it, at the Secure Cloud price, so a plan and
    --max-price see what the pod will cost (not the lowest price over every cloud)."""
    volume = provider.create_volume("cache", 10, "EU-RO-1")
    offers = {(o.gpu_name, o.raw["cloud"]): o for o in provider.offers(Request(name="x", gpu=None))}
    secure = offers["RTX 4090", "SECURE"]
    assert provider.offer_reaches(secure, volume) and secure.price_hr == pytest.approx(0.69)
    assert not provider.offer_reaches(offers["RTX 4090", "COMMUNITY"], volume)  # cheaper, but not where it can mount
    assert not provider.offer_reaches(offers["RTX 3090", "SECURE"], volume)  # in stock in US-KS-2 only
    elsewhere = Offer(provider="vastai", offer_id="1", gpu_name="RTX 4090", gpus=1, vram_gb=24, price_hr=0.3)
    assert not provider.offer_reaches(elsewhere, volume)
    # A pod of a type out of stock there is refused before anything is asked: it never lands elsewhere
    # without its volume.
    with pytest.raises(NoCapacity, match="out of stock on Secure Cloud in EU-RO-1"):
        provider.create(Request(name="x", gpu="RTX 3090", mounts=(Mount(volume, "/data"),)),
                        label_for("0123456789ab", "x"), "ssh-ed25519 AAAA")
    assert fake_runpod.sent("POST", "/v2/pods") == [] and fake_runpod.live() == []
    # Without a plan, the pod with the volume is made at the Secure Cloud price, in the volume's data center.
    made = provider.create(Request(name="x", gpu="RTX 4090", mounts=(Mount(volume, "/data"),)),
                           label_for("0123456789ab", "x"), "ssh-ed25519 AAAA")
    [sent] = fake_runpod.sent("POST", "/v2/pods")
    assert (sent["cloud"], sent["dataCenterIds"]) == ("SECURE", ["EU-RO-1"]) and made.price_hr == pytest.approx(0.69)
    # The volume's listing names the pod that mounts it (RunPod's names none: read from the pods').
    assert provider.list_volumes()[0].attached_to == (made.provider_id,)
    provider.destroy(made.provider_id)


@pytest.mark.parametrize("lag", [0, 2])
def test_a_volume_create_that_errors_is_looked_for_and_made_once(provider, fake_runpod, lag):
    """RunPod allows two volumes of one name, and orch knows its own by name: a create whose answer
    is a 500 (the volume made all the same, and maybe missing from the next listings) is looked for,
    never sent again. One volume bills, and it is the one orch holds."""
    fake_runpod.fail_volume_create_after, fake_runpod.volume_listing_lag = 1, lag
    made = provider.create_volume("cache", 20, "EU-RO-1")
    assert [v["name"] for v in fake_runpod.network_volumes.values()] == ["orch-vol-cache"]
    assert made.volume_id in fake_runpod.network_volumes
    assert len(fake_runpod.sent("POST", "/v2/network-volumes")) == 1
    # A volume of that name already there (a create that raced, an interrupted orch): it is that one.
    again = provider.create_volume("cache", 20, "EU-RO-1")
    assert again.volume_id == made.volume_id and len(fake_runpod.network_volumes) == 1


def test_a_volume_create_whose_volume_never_shows_sends_no_second_create(fake_runpod):
    provider = RunPodProvider(fake_runpod.settings(create_lookup_seconds=0.3))
    fake_runpod.fail_volume_create_after = 1
    fake_runpod.volume_listing_lag = 10**6  # and the listing never shows it
    with pytest.raises(ProviderError, match="no second create"):
        provider.create_volume("cache", 20, "EU-RO-1")
    assert len(fake_runpod.sent("POST", "/v2/network-volumes")) == 1 and len(fake_runpod.network_volumes) == 1


def test_the_volume_size_is_v2s_10_to_4096_gb(provider, fake_runpod):
    """v2's CreateNetworkVolumeRequest takes 10 to 4096 GB (GraphQL took 1): orch's bounds are v2's,
    and the fake refuses what v2 refuses."""
    assert (provider.min_volume_gb, provider.max_volume_gb) == (10, 4096)
    from providers.runpod.api import RunPodError

    with pytest.raises(RunPodError, match="422.*size: 5 is less than the minimum of 10"):
        provider.api.once("POST", "/network-volumes", {"name": "orch-vol-x", "size": 5, "dataCenter": "EU-RO-1"})
    assert provider.create_volume("big", 4096, "EU-RO-1").size_gb == 4096


def test_two_volumes_on_one_pod_are_refused_before_anything_is_asked(provider, fake_runpod):
    a, b = provider.create_volume("a", 10, "EU-RO-1"), provider.create_volume("b", 10, "EU-RO-1")
    with pytest.raises(UsageError, match="one network volume"):
        provider.create(Request(name="x", gpu="RTX 4090", mounts=(Mount(a, "/a"), Mount(b, "/b"))),
                        label_for("0123456789ab", "x"), "ssh-ed25519 AAAA")
    assert fake_runpod.sent("POST", "/v2/pods") == []


@pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")
def test_pods_deployed_with_the_volume_mount_it_at_the_path_asked_and_share_its_files(provider, fake_runpod, key):
    key_path, public_key = key
    volume = provider.create_volume("cache", 20, "EU-RO-1")
    mounts = (Mount(volume, "/data"),)
    writer = provider.create(Request(name="w", gpu="RTX 4090", disk_gb=30, mounts=mounts),
                             label_for("0123456789ab", "w"), public_key)
    sent = fake_runpod.sent("POST", "/v2/pods")[0]
    assert (sent["mounts"], sent["dataCenterIds"], sent["cloud"]) == \
        ({"network": [{"volumeId": volume.volume_id, "path": "/data"}]}, ["EU-RO-1"], "SECURE")
    # (the network volume takes the volume disk's place: ``mounts`` holds it alone)

    def shell(remote, command: str) -> tuple[str, dict]:
        up = reach.wait_ssh(provider, remote.provider_id, timeout=30, interval=0.05)
        conn = ssh.connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key_path, None)
        try:
            done = mounting.prepare(conn, provider.mount_steps(mounts))  # before anything runs there
            return ssh.run(conn, command), done
        finally:
            conn.close()

    out, done = shell(writer, "echo weights > /data/w.txt && echo ok")
    assert out.strip() == "ok" and done == {"/data": "present"}
    provider.destroy(writer.provider_id)
    reader = provider.create(Request(name="r", cpu=True, mounts=mounts), label_for("0123456789ac", "r"), public_key)
    assert fake_runpod.sent("POST", "/v2/pods")[1]["mounts"]["network"][0]["volumeId"] == volume.volume_id
    assert shell(reader, "cat /data/w.txt")[0].strip() == "weights"  # another pod, the same files
    assert [v.name for v in provider.list_volumes()] == ["cache"]  # the pod's end left the volume
