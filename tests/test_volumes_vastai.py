"""Vast.ai local volumes through the provider and the real vastai SDK, against tests/fakes/vast_api.py
and real containers: rented on one machine, listed (orch's only), linked by an instance created on
that machine (its offers searched there only), shared by the instances that link it one after the
other, deleted once none uses it."""

from __future__ import annotations

import getpass
import subprocess

import pytest

from orchestrator.ssh import reach
from orchestrator.errors import ProviderError, UsageError
from orchestrator.provider import Request, label_for
from orchestrator.provider.model import HOURS_PER_MONTH, Mount
from orchestrator.ssh.remote import connect, run
from playbooks import volumes as mounting
from providers.vastai import VastAIProvider
from tests.fakes.hosts import sshd_available
from tests.fakes.vast_api import FakeVast

MACHINE = "1507"  # offer 1007's machine: an RTX 4090 in Texas, $0.20/GB-month storage


@pytest.fixture
def fake(tmp_path):
    with FakeVast(tmp_path) as f:
        yield f


@pytest.fixture
def provider(fake, tmp_path):
    return VastAIProvider({"api_key": fake.key, "server_url": fake.url, "ssh_user": getpass.getuser(),
                           "poll_seconds": 0.02, "direct_ssh_grace": 0.3, "retries": 2}, home=tmp_path)


def test_a_volume_is_rented_on_its_machine_listed_as_orchs_and_deleted_once(fake, provider):
    made = provider.create_volume("cache", 40, MACHINE)
    assert (made.name, made.provider, made.where, made.size_gb) == ("cache", "vastai", MACHINE, 40)
    # The host's $0.20 per GB over Vast's 720-hour month, in orch's 730-hour one.
    assert made.price_gb_month == pytest.approx(0.20 * HOURS_PER_MONTH / 720, rel=1e-3)
    rented = fake.calls("PUT", r"^/api/v0/volumes/$")[0].body
    assert rented["name"] == "orch_vol_cache" and rented["size"] == 40
    fake._rent_volume({"id": 1001 + 8000, "size": 10, "name": "my_own"})  # someone's own volume
    assert [(v.name, v.volume_id) for v in provider.list_volumes()] == [("cache", made.volume_id)]

    provider.delete_volume(made)
    provider.delete_volume(made)  # already gone: no error
    assert provider.list_volumes() == [] and [v["label"] for v in fake.volumes.values()] == ["my_own"]


def test_a_volume_needs_its_machine_named_and_nothing_is_rented_without(fake, provider):
    with pytest.raises(UsageError, match="one machine"):
        provider.create_volume("cache", 10, None)
    with pytest.raises(ProviderError, match="offers no volume of 5000 GB"):
        provider.create_volume("cache", 5000, MACHINE)
    assert fake.calls("PUT", r"^/api/v0/volumes/$") == [] and fake.volumes == {}


def test_a_failed_listing_is_an_error_never_no_volumes(fake, provider):
    provider.create_volume("cache", 10, MACHINE)
    fake.server_error(times=10, path=r"^/api/v0/volumes$")
    with pytest.raises(ProviderError):
        provider.list_volumes()


def test_offers_for_an_instance_that_mounts_it_are_searched_on_its_machine_only(fake, provider):
    volume = provider.create_volume("cache", 10, MACHINE)
    everywhere = provider.offers(Request(name="x", gpu="RTX 4090"))
    assert {o.raw["machine_id"] for o in everywhere} == {1501, 1507}
    assert [provider.offer_reaches(o, volume) for o in everywhere] == [o.raw["machine_id"] == 1507 for o in everywhere]
    there = provider.offers(Request(name="x", gpu="RTX 4090", mounts=(Mount(volume, "/data"),)))
    assert [o.offer_id for o in there] == ["1007"]
    assert fake.calls("POST", r"^/api/v0/bundles/$")[-1].body["machine_id"] == {"eq": 1507}


@pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")
def test_instances_on_its_machine_link_it_at_the_path_asked_one_after_the_other(fake, provider, tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text().strip()
    volume = provider.create_volume("cache", 10, MACHINE)
    mounts = (Mount(volume, "/data"),)

    def up_and_run(name: str, command: str) -> str:
        made = provider.create(Request(name=name, gpu="RTX 4090", mounts=mounts), label_for("0123456789ab", name),
                               public)
        up = reach.wait_ssh(provider, made.provider_id, timeout=30, interval=0.05)
        conn = connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key, None)
        try:
            assert mounting.prepare(conn, provider.mount_steps(mounts)) == {"/data": "present"}
            return made.provider_id, run(conn, command)
        finally:
            conn.close()

    first, _ = up_and_run("a", "echo weights > /data/w.txt")
    body = fake.calls("PUT", r"^/api/v0/asks/1007/$")[-1].body
    assert body["volume_info"] == {"mount_path": "/data", "create_new": False, "volume_id": int(volume.volume_id)}
    assert provider.list_volumes()[0].attached_to == (first,)
    with pytest.raises(ProviderError, match="Destroy every instance"):
        provider.delete_volume(volume)
    provider.destroy(first)

    second, out = up_and_run("b", "cat /data/w.txt")
    assert out.strip() == "weights"  # another instance on the machine, the same volume
    provider.destroy(second)
    provider.delete_volume(volume)
    assert fake.volumes == {}
