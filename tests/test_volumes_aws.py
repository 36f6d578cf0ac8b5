"""EBS volumes through the `aws` provider and boto3 against moto's server (tests/moto_ec2.py), each
instance a real sshd host, each attached volume a real block device: made gp3 in one zone and tagged,
listed (orch's only), the instance that mounts it placed in its zone, attached once it runs,
formatted on first use only, kept when the instance ends (an `up` that failed included), refused in
one line when another instance holds it. The module runs in a network namespace of its own
(tests/netns.py), as test_aws.py does.

What moto's EBS lacks, this module supplies for its own tests, each as EC2 does it (EC2 API
reference, AttachVolume and its errors): a volume attached elsewhere answers ``VolumeInUse``, one
in another zone ``InvalidVolume.ZoneMismatch``, an instance neither running nor stopped
``IncorrectState``; and an attached volume becomes a block device on the instance, a loop device
over a sparse file, linked where udev links an EBS volume on a Nitro instance
(``/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol...``, EC2 User Guide "Amazon EBS and NVMe").
That link lives in a tmpfs over ``/dev/disk`` inside the instance's own mount namespace: only the
instance it is attached to sees it. (The folder ``/dev/disk`` is made on this machine, empty, as
udev would have it, so that the tmpfs has a place to go.)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.ssh import reach
from orchestrator.ssh import remote as ssh
from orchestrator.errors import ProviderError, UsageError
from orchestrator.provider import Request, label_for
from orchestrator.provider.model import Mount
from playbooks import volumes as mounting
from providers.aws import AWSProvider
from tests import netns
from tests.fakes.hosts import sshd_available
from tests.moto_ec2 import MotoEC2

pytestmark = pytest.mark.skipif(not sshd_available() or not os.path.exists("/dev/loop-control"),
                                reason="fake hosts need root, sshd and unshare; volumes need loop devices")
SETTINGS = {"region": "us-east-1", "ssh_user": "root", "poll_seconds": 0.05, "stop_timeout": 20,
            "destroy_timeout": 20, "retries": 1}
ZONE = "us-east-1b"


class Disks:
    """The block devices behind moto's volumes: one sparse file and loop device per volume, made at
    its first attach and kept until the end (a volume's data outlives its instances)."""

    def __init__(self, root: Path):
        self.root, self.loops = root, {}

    def device(self, vid: str, size_gb: int) -> str:
        if vid not in self.loops:
            backing = self.root / f"{vid}.img"
            with open(backing, "wb") as f:
                f.truncate(size_gb * 1024 ** 3)
            self.loops[vid] = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True,
                                             capture_output=True, text=True).stdout.strip()
        return self.loops[vid]

    def close(self) -> None:
        for loop in self.loops.values():
            subprocess.run(["losetup", "-d", loop], capture_output=True)


@pytest.fixture
def ec2(tmp_path, monkeypatch):
    pytest.importorskip("moto")
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.elastic_block_store import EBSBackend
    from moto.ec2.responses.elastic_block_store import ElasticBlockStore

    os.makedirs("/dev/disk", exist_ok=True)
    disks = Disks(tmp_path)
    with MotoEC2(tmp_path) as m:
        for k, v in m.env.items():
            monkeypatch.setenv(k, v)
        m.add_dlami()
        attach = EBSBackend.attach_volume

        def attach_as_ec2(backend, volume_id, instance_id, device_path, delete_on_termination=False):
            volume, inst = backend.get_volume(volume_id), backend.get_instance(instance_id)
            if volume.attachment is not None:
                raise EC2ClientError("VolumeInUse", f"{volume_id} is already attached to an instance")
            if volume.zone.name != inst._placement.zone:
                raise EC2ClientError("InvalidVolume.ZoneMismatch", f"The volume '{volume_id}' is not in the same "
                                     "availability zone as instance '{instance_id}'")
            if inst.state not in ("running", "stopped"):
                raise EC2ClientError("IncorrectState", f"Instance '{instance_id}' is not 'running'.")
            done = attach(backend, volume_id, instance_id, device_path, delete_on_termination)
            host = m.hosts.get(instance_id)
            if host is not None and device_path != "/dev/sda1":  # a data volume: its device shows on the host
                loop = disks.device(volume_id, volume.size)
                host.run("mountpoint -q /dev/disk || mount -t tmpfs tmpfs /dev/disk; mkdir -p /dev/disk/by-id; "
                         f"ln -sfn {loop} /dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '')}")
            return done

        monkeypatch.setattr(EBSBackend, "attach_volume", attach_as_ec2)
        create = ElasticBlockStore.create_volume

        def create_as_ec2(response):
            # EC2 takes a ClientToken of at most 64 ASCII characters ("Ensure idempotency in Amazon EC2
            # API requests"); moto takes any. The code is the one EC2 gives a malformed parameter
            # (EC2 API reference, "Error codes": InvalidParameterValue); the message is ours.
            token = response._get_param("ClientToken") or ""
            if len(token) > 64:
                raise EC2ClientError("InvalidParameterValue", f"Value ({token}) for parameter clientToken is "
                                     "invalid: longer than 64 characters")
            return create(response)

        monkeypatch.setattr(ElasticBlockStore, "create_volume", create_as_ec2)
        try:
            yield m, AWSProvider(dict(SETTINGS), home=tmp_path)
        finally:
            monkeypatch.undo()
    disks.close()


@pytest.fixture
def key(tmp_path) -> tuple[Path, str]:
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, (tmp_path / "id_ed25519.pub").read_text().strip()


def _label(name: str) -> str:
    return label_for("0123456789ab", name)


def test_a_volume_is_gp3_in_its_zone_tagged_listed_as_orchs_and_deleted_once(ec2):
    m, provider = ec2
    made = provider.create_volume("cache", 1, ZONE)
    assert (made.name, made.provider, made.where, made.size_gb) == ("cache", "aws", ZONE, 1)
    assert made.price_gb_month == pytest.approx(0.08) and made.volume_id.endswith("@us-east-1")
    sent = m.requests("CreateVolume")[0]
    assert (sent["VolumeType"], sent["Size"], sent["AvailabilityZone"]) == ("gp3", "1", ZONE)
    import boto3

    raw = boto3.client("ec2", region_name="us-east-1")
    raw.create_volume(AvailabilityZone=ZONE, Size=1, TagSpecifications=[
        {"ResourceType": "volume", "Tags": [{"Key": "Name", "Value": "someone-elses"}]}])
    assert [(v.name, v.volume_id) for v in provider.list_volumes()] == [("cache", made.volume_id)]

    provider.delete_volume(made)
    provider.delete_volume(made)  # already gone: no error
    assert provider.list_volumes() == []


def test_a_long_name_makes_its_volume_and_a_refusal_is_reported_as_aws_says_it(ec2):
    """A 40-character name (the longest orch takes): the create's idempotency token stays within
    EC2's 64 characters, and a refusal that is not the zone's is not reported as a bad zone."""
    m, provider = ec2
    name = "a-forty-character-volume-name-for-a-test"
    made = provider.create_volume(name, 1, ZONE)
    assert made.name == name and len(m.requests("CreateVolume")[0]["ClientToken"]) <= 64
    from providers.aws import volumes

    short = volumes.client_token
    try:
        volumes.client_token = lambda n: "x" * 65  # a refusal of a parameter that is not the zone
        with pytest.raises(UsageError) as refused:
            provider.create_volume("other", 1, ZONE)
    finally:
        volumes.client_token = short
    assert "zone" not in str(refused.value).split(":")[0] and "clientToken" in str(refused.value)
    assert [v.name for v in provider.list_volumes()] == [name]


def test_a_volume_ec2_still_lists_as_deleting_is_not_orchs_any_more(ec2, monkeypatch):
    """EC2 lists a deleted volume as ``deleting`` for a while (moto drops it at once): it is not
    listed as orch's, so a reconcile never adopts what the user just deleted."""
    from moto.ec2.models.elastic_block_store import EBSBackend, Volume

    m, provider = ec2
    made = provider.create_volume("gone", 1, ZONE)

    class Deleting(Volume):
        status = property(lambda self: "deleting")

    def delete_as_ec2(backend, volume_id):
        backend.volumes[volume_id].__class__ = Deleting
        return backend.volumes[volume_id]

    monkeypatch.setattr(EBSBackend, "delete_volume", delete_as_ec2)
    provider.delete_volume(made)
    import boto3

    states = [v["State"] for v in boto3.client("ec2", region_name="us-east-1").describe_volumes()["Volumes"]]
    assert "deleting" in states and provider.list_volumes() == []


def test_a_volume_is_priced_at_its_regions_rate_where_one_is_given(ec2):
    """gp3 costs $0.08/GB-month in us-east-1 (aws.amazon.com/ebs/pricing) and more elsewhere: a region's
    own rate comes from ``ebs_prices``; without one it is the us-east-1 rate, as the README says."""
    m, provider = ec2
    priced = AWSProvider({**SETTINGS, "regions": ["us-east-1", "us-west-2"], "ebs_prices": {"us-west-2": 0.096}})
    west = priced.create_volume("west", 1, "us-west-2a")
    east = priced.create_volume("east", 1, ZONE)
    assert (west.price_gb_month, east.price_gb_month) == (pytest.approx(0.096), pytest.approx(0.08))
    assert {v.name: v.price_gb_month for v in priced.list_volumes()} == {"west": pytest.approx(0.096),
                                                                         "east": pytest.approx(0.08)}
    with pytest.raises(UsageError, match="ebs_prices"):
        AWSProvider({**SETTINGS, "ebs_prices": {"us-west-2": "cheap"}}).list_volumes()


def test_without_a_zone_it_goes_to_the_regions_first(ec2):
    m, provider = ec2
    assert provider.create_volume("cache", 1, None).where == "us-east-1a"
    with pytest.raises(UsageError, match="availability zone"):
        provider.create_volume("other", 1, "us-east-1")  # a region is no zone
    assert len(m.requests("CreateVolume")) == 1


def test_a_failed_listing_is_an_error_never_no_volumes(ec2):
    m, provider = ec2
    provider.create_volume("cache", 1, ZONE)
    m.fail("DescribeVolumes", times=10)
    with pytest.raises(ProviderError):
        provider.list_volumes()


def test_an_offer_of_another_region_is_refused_before_anything_is_launched(ec2, key):
    m, provider = ec2
    volume = provider.create_volume("cache", 1, ZONE)
    with pytest.raises(UsageError, match="us-east-1b"):
        provider.create(Request(name="x", cpu=True, offer="us-west-2:m6i.large", mounts=(Mount(volume, "/data"),)),
                        _label("x"), key[1])
    assert m.requests("RunInstances") == []


def test_the_instance_is_placed_in_the_zone_its_volume_is_formatted_once_and_outlives_it(ec2, key):
    m, provider = ec2
    key_path, public_key = key
    volume = provider.create_volume("cache", 1, ZONE)
    mounts = (Mount(volume, "/data"),)

    def up(name: str, command: str) -> tuple[str, dict, str]:
        made = provider.create(Request(name=name, cpu=True, mounts=mounts), _label(name), public_key)
        ready = reach.wait_ssh(provider, made.provider_id, 60, interval=0.1)
        conn = ssh.connect(ready.endpoint.host, ready.endpoint.port, ready.endpoint.user, key_path, None)
        try:
            done = mounting.prepare(conn, provider.mount_steps(mounts))
            again = mounting.prepare(conn, provider.mount_steps(mounts))  # after a restart: nothing more
            assert again == {"/data": "present"}
            return made.provider_id, done, ssh.run(conn, command)
        finally:
            conn.close()

    first, done, _ = up("a", "echo weights > /data/w.txt && grep -c ' /data ' /etc/fstab")
    assert done == {"/data": "formatted"}
    assert m.requests("RunInstances")[0]["Placement.AvailabilityZone"] == ZONE
    assert m.requests("AttachVolume")[0]["Device"] == "/dev/sdf"
    iid = first.split("@")[0]
    mapping = {d: b for d, b in m.instance(iid).block_device_mapping.items()}
    assert mapping["/dev/sdf"].delete_on_termination is False  # kept when the instance ends
    assert provider.list_volumes()[0].attached_to == (first,)

    provider.destroy(first)  # as an `orch up` that failed after the attach gives its instance back
    kept = provider.list_volumes()
    assert [(v.name, v.attached_to, v.raw["State"]) for v in kept] == [("cache", (), "available")]

    second, done, out = up("b", "cat /data/w.txt")
    assert done == {"/data": "mounted"} and out.strip() == "weights"  # never formatted again
    provider.destroy(second)


def test_a_volume_another_instance_holds_ends_the_new_instance_and_is_kept(ec2, key):
    m, provider = ec2
    volume = provider.create_volume("cache", 1, ZONE)
    mounts = (Mount(volume, "/data"),)
    holder = provider.create(Request(name="a", cpu=True, mounts=mounts), _label("a"), key[1])
    with pytest.raises(ProviderError) as refused:
        provider.create(Request(name="b", cpu=True, mounts=mounts), _label("b"), key[1])
    line = str(refused.value)
    assert "\n" not in line and "another instance has it attached" in line and "the volume is kept" in line
    second = [i for i in m.instances() if i.id != holder.provider_id.split("@")[0]]
    assert [i.state for i in second] == ["terminated"]  # never a machine billing without its data
    assert provider.list_volumes()[0].attached_to == (holder.provider_id,)
    provider.destroy(holder.provider_id)


netns.isolate(globals())
