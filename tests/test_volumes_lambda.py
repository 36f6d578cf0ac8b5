"""Lambda Cloud filesystems through the provider, against the fake of Lambda's API v1 and real sshd
hosts on port 22 (so the module runs in a network namespace of its own: tests/netns.py): made in a
region, listed (orch's only), attached at launch (at the path asked where Lambda mounts there, else
linked to by the playbook), shared by the instances that mount it, deleted once none does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.ssh import reach
from orchestrator.ssh import remote as ssh
from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider import Request, label_for
from orchestrator.provider.model import Mount
from playbooks import volumes as mounting
from providers.lambda_cloud import LambdaProvider
from tests import netns
from tests.clouds import configure
from tests.conftest import run_orch
from tests.fakes.hosts import sshd_available
from tests.fakes.lambda_api import FakeLambda

pytestmark = pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")


@pytest.fixture
def lam(tmp_path, monkeypatch):
    with FakeLambda(tmp_path, launch_interval=0) as fake:
        monkeypatch.setenv("LAMBDA_API_BASE_URL", fake.url)
        monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
        yield fake, LambdaProvider({"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "retries": 2})


@pytest.fixture
def key(tmp_path) -> tuple[Path, str]:
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, (tmp_path / "id_ed25519.pub").read_text().strip()


def _launch(provider, name: str, public_key: str, mounts) -> tuple:
    """A launched instance, up: (its Remote, an open connection)."""
    made = provider.create(Request(name=name, gpu="A10", mounts=mounts), label_for("0123456789ab", name), public_key)
    return made, reach.wait_ssh(provider, made.provider_id, 30, interval=0.05)


def test_a_filesystem_is_made_in_its_region_listed_as_orchs_and_deleted_once(lam):
    fake, provider = lam
    made = provider.create_volume("cache", 100, "us-east-1")
    assert (made.name, made.provider, made.where, made.size_gb) == ("cache", "lambda", "us-east-1", 100)
    assert made.price_gb_month == pytest.approx(0.20) and made.created_at
    assert [f["name"] for f in fake.filesystems.values()] == ["orch-vol-cache"]
    fake._add_filesystem({"name": "someone-else", "region": "us-east-1"})
    (fake.filesystem_dir(made.volume_id) / "blob").write_bytes(b"x" * 2048)  # any byte used bills a GB
    listed = provider.list_volumes()
    assert [(v.name, v.where, v.size_gb, v.attached_to) for v in listed] == [("cache", "us-east-1", 1, ())]

    provider.delete_volume(made)
    provider.delete_volume(made)  # already gone: no error
    assert provider.list_volumes() == [] and [f["name"] for f in fake.filesystems.values()] == ["someone-else"]


def test_without_a_region_it_goes_where_most_types_have_capacity(lam):
    fake, provider = lam
    assert provider.create_volume("cache", 10, None).where == "us-west-1"  # A10 and A6000 there


def test_a_failed_listing_is_an_error_never_no_volumes(lam):
    fake, provider = lam
    provider.create_volume("cache", 10, "us-east-1")
    fake.inject(500, {"error": {"code": "global/unknown", "message": "Internal server error."}}, method="GET",
                path=r"^/file-systems$", times=5)
    with pytest.raises(ProviderError):
        provider.list_volumes()


def test_a_launch_goes_to_the_volumes_region_only(lam, key):
    fake, provider = lam
    south = provider.create_volume("south", 10, "us-south-1")
    a10 = next(o for o in provider.offers(Request(name="x", gpu="A10")))
    assert not provider.offer_reaches(a10, south) and provider.offer_reaches(
        a10, provider.create_volume("east", 10, "us-east-1"))
    with pytest.raises(NoCapacity, match="us-south-1"):  # no A10 there: nothing launched elsewhere
        provider.create(Request(name="x", gpu="A10", mounts=(Mount(south, "/data/x"),)), label_for("0123456789ab", "x"),
                        key[1])
    pinned = LambdaProvider({**provider.settings, "region": "us-east-1"})
    with pytest.raises(UsageError, match="one Lambda region"):
        pinned.create(Request(name="x", gpu="A10", mounts=(Mount(south, "/data/x"),)), label_for("0123456789ab", "x"),
                      key[1])
    assert fake.calls("POST", r"^/instance-operations/launch$") == []


def test_instances_mount_it_at_the_path_asked_or_through_a_link_and_share_its_files(lam, key):
    fake, provider = lam
    key_path, public_key = key
    volume = provider.create_volume("cache", 10, "us-west-1")
    at_data, elsewhere = (Mount(volume, "/data/cache"),), (Mount(volume, "/opt/cache"),)

    first, up = _launch(provider, "a", public_key, at_data)
    sent = fake.calls("POST", r"^/instance-operations/launch$")[-1].body
    assert sent["region_name"] == "us-west-1" and sent["file_system_names"] == ["orch-vol-cache"]
    assert sent["file_system_mounts"] == [{"mount_point": "/data/cache", "file_system_id": volume.volume_id}]
    conn = ssh.connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key_path, None)
    try:
        assert mounting.prepare(conn, provider.mount_steps(at_data)) == {"/data/cache": "present"}
        ssh.run(conn, "echo weights > /data/cache/w.txt")
    finally:
        conn.close()
    assert [v.attached_to for v in provider.list_volumes()] == [(first.provider_id,)]
    with pytest.raises(ProviderError, match="still mounts it"):
        provider.delete_volume(volume)

    # /opt is no folder Lambda mounts under: the default mount, and a link from the path asked.
    second, up = _launch(provider, "b", public_key, elsewhere)
    assert "file_system_mounts" not in fake.calls("POST", r"^/instance-operations/launch$")[-1].body
    conn = ssh.connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key_path, None)
    try:
        steps = provider.mount_steps(elsewhere)
        assert mounting.prepare(conn, steps) == {"/opt/cache": "linked"}
        assert mounting.prepare(conn, steps) == {"/opt/cache": "linked"}  # again after a restart: the same
        assert ssh.run(conn, "cat /opt/cache/w.txt; readlink /opt/cache").split() == [
            "weights", "/lambda/nfs/orch-vol-cache"]  # the first instance's file, through the share
    finally:
        conn.close()
    for made in (first, second):
        provider.destroy(made.provider_id)
    provider.delete_volume(volume)
    assert fake.filesystems == {}


def test_each_node_of_a_group_mounts_its_own_volume(lam, key):
    """Per-node volumes (``data-0`` for node 0, ``data-1`` for node 1): each node's launch names its
    own filesystem, and node 1 finds data-1's files at the path, not data-0's."""
    fake, provider = lam
    key_path, public_key = key
    vols = [provider.create_volume(f"data-{r}", 10, "us-east-1") for r in range(2)]
    for r, vol in enumerate(vols):
        (fake.filesystem_dir(vol.volume_id) / "whose").write_text(f"data-{r}\n")
    reqs = [Request(name=f"n-{r}", gpu="A10", group="g" * 12, node_rank=r, nodes=2,
                    mounts=(Mount(vols[r], "/data/d"),)) for r in range(2)]
    labels = [label_for(f"gggggggggg{r:02d}", f"n-{r}") for r in range(2)]
    provider.open_group("g" * 12, reqs[0])
    made = provider.create_nodes(reqs, labels, public_key)
    sent = fake.calls("POST", r"^/instance-operations/launch$")
    assert [c.body["file_system_names"] for c in sent] == [["orch-vol-data-0"], ["orch-vol-data-1"]]
    assert [fake.instances[r.provider_id]["file_system_names"] for r in made] == [["orch-vol-data-0"],
                                                                                  ["orch-vol-data-1"]]
    up = reach.wait_ssh(provider, made[1].provider_id, 30, interval=0.05)
    conn = ssh.connect(up.endpoint.host, up.endpoint.port, up.endpoint.user, key_path, None)
    try:
        assert mounting.prepare(conn, provider.mount_steps(reqs[1].mounts)) == {"/data/d": "present"}
        assert ssh.run(conn, "cat /data/d/whose").strip() == "data-1"
    finally:
        conn.close()
    for remote in made:
        provider.destroy(remote.provider_id)
    provider.close_group("g" * 12)
    assert fake.live() == []


def test_an_instance_shown_with_another_volume_than_asked_is_terminated(lam, key):
    """Should Lambda show a new instance mounting another filesystem than its launch named, the launch
    fails and the instance is terminated: a node never writes another node's volume."""
    fake, provider = lam
    mine = provider.create_volume("mine", 10, "us-east-1")
    provider.create_volume("other", 10, "us-east-1")
    label = label_for("0123456789ab", "w")
    fake.inject(200, {"data": {"id": "0" * 32, "name": label, "status": "booting",
                               "file_system_names": ["orch-vol-other"]}}, method="GET", path=r"^/instances/[0-9a-f]+$")
    with pytest.raises(ProviderError, match="orch-vol-mine"):
        provider.create(Request(name="w", gpu="A10", mounts=(Mount(mine, "/data/w"),)), label, key[1])
    [made] = fake.instances.values()
    assert made["file_system_names"] == ["orch-vol-mine"] and fake.live() == []


@pytest.fixture
def with_orch(orch_home, tmp_path, monkeypatch):
    """The fake, and orch's config pointing at it: (fake, env for run_orch)."""
    with FakeLambda(tmp_path, launch_interval=0) as fake:
        monkeypatch.setenv("LAMBDA_API_BASE_URL", fake.url)
        monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
        configure(orch_home, "lambda", {"api_key": fake.key, "retries": 2}, volume_idle_days=0)
        yield fake, {"LAMBDA_API_BASE_URL": fake.url}


def test_a_filesystem_is_costed_at_the_bytes_it_holds_not_the_size_typed(with_orch):
    """Lambda bills a filesystem per GB used: typed 10 GB, holding 5 TB, it costs 5 TB's $1,000 a month
    in `volume ls`, `orch cost` and the idle report once a reconcile (every reaper pass) has read
    ``bytes_used``."""
    fake, env = with_orch
    run_orch("volume", "create", "big", "--provider", "lambda", "--size", 10, "--region", "us-east-1", env=env, check=0)
    [fs] = fake.filesystems.values()
    fake.bytes_used[fs["id"]] = 5 * 10**12
    assert "big: 10 GB -> 5000 GB" in run_orch("reconcile", env=env, check=0).stdout
    [row] = json.loads(run_orch("volume", "ls", "--json", env=env, check=0).stdout)
    assert (row["size_gb"], row["usd_month"]) == (5000, pytest.approx(1000.0))
    [cost] = json.loads(run_orch("cost", "--json", env=env, check=0).stdout)["volumes"]
    assert (cost["size_gb"], cost["usd_month"]) == (5000, pytest.approx(1000.0))
    assert "billing $1000.00/month" in run_orch("reap", env=env, check=0).stdout
    fake.bytes_used[fs["id"]] = 10**9  # emptied: the row keeps what it billed at, never less
    run_orch("reconcile", env=env, check=0)
    assert json.loads(run_orch("volume", "ls", "--json", env=env, check=0).stdout)[0]["size_gb"] == 5000


netns.isolate(globals())
