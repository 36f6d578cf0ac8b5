"""RunPod network volumes through the provider, against the fake RunPod GraphQL API (the runpod SDK's
GraphQL call) and real sshd pods: made in a data center, listed (orch's only), mounted by a pod
deployed there at the path asked, shared by the pods that mount it, deleted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator import reach
from orchestrator import remote as ssh
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
    assert fake_runpod.network_volumes == {} and fake_runpod.inputs("createNetworkVolume") == []


def test_a_failed_listing_is_an_error_never_no_volumes(provider, fake_runpod):
    provider.create_volume("cache", 10, "EU-RO-1")
    fake_runpod.fail_listing = 50
    with pytest.raises(ProviderError):
        provider.list_volumes()


def test_only_gpu_types_in_stock_in_the_volumes_data_center_reach_it(provider, fake_runpod):
    volume = provider.create_volume("cache", 10, "EU-RO-1")
    offers = {o.gpu_name: o for o in provider.offers(Request(name="x", gpu=None))}
    assert provider.offer_reaches(offers["RTX 4090"], volume)
    assert not provider.offer_reaches(offers["RTX 3090"], volume)  # in stock in US-KS-2 only
    elsewhere = Offer(provider="vastai", offer_id="1", gpu_name="RTX 4090", gpus=1, vram_gb=24, price_hr=0.3)
    assert not provider.offer_reaches(elsewhere, volume)
    # A pod of a type out of stock there is refused for capacity: it never lands elsewhere without its volume.
    with pytest.raises(NoCapacity):
        provider.create(Request(name="x", gpu="RTX 3090", mounts=(Mount(volume, "/data"),)),
                        label_for("0123456789ab", "x"), "ssh-ed25519 AAAA")
    assert fake_runpod.live() == []


def test_two_volumes_on_one_pod_are_refused_before_anything_is_asked(provider, fake_runpod):
    a, b = provider.create_volume("a", 10, "EU-RO-1"), provider.create_volume("b", 10, "EU-RO-1")
    with pytest.raises(UsageError, match="one network volume"):
        provider.create(Request(name="x", gpu="RTX 4090", mounts=(Mount(a, "/a"), Mount(b, "/b"))),
                        label_for("0123456789ab", "x"), "ssh-ed25519 AAAA")
    assert fake_runpod.inputs("podFindAndDeployOnDemand") == []


@pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")
def test_pods_deployed_with_the_volume_mount_it_at_the_path_asked_and_share_its_files(provider, fake_runpod, key):
    key_path, public_key = key
    volume = provider.create_volume("cache", 20, "EU-RO-1")
    mounts = (Mount(volume, "/data"),)
    writer = provider.create(Request(name="w", gpu="RTX 4090", disk_gb=30, mounts=mounts),
                             label_for("0123456789ab", "w"), public_key)
    sent = fake_runpod.inputs("podFindAndDeployOnDemand")[0]
    assert (sent["networkVolumeId"], sent["dataCenterId"], sent["volumeMountPath"], sent["cloudType"]) == \
        (volume.volume_id, "EU-RO-1", "/data", "SECURE")
    assert "volumeInGb" not in sent  # the network volume takes the volume disk's place

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
    assert fake_runpod.inputs("deployCpuPod")[0]["networkVolumeId"] == volume.volume_id
    assert shell(reader, "cat /data/w.txt")[0].strip() == "weights"  # another pod, the same files
    assert [v.name for v in provider.list_volumes()] == ["cache"]  # the pod's end left the volume
