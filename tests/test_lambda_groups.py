"""A group on Lambda Cloud: every node in one region, each with its private address (the fake of
Lambda's REST API, tests/fakes/lambda_api.py, in a network namespace of its own: tests/netns.py)."""

from __future__ import annotations

import time

import pytest

from orchestrator import config
from orchestrator.errors import NoCapacity, ProviderError
from orchestrator.provider import Request, RentsGroups, label_for
from tests import netns
from tests.clouds import configure, open_orch
from tests.fakes.hosts import sshd_available
from tests.fakes.lambda_api import _type
from tests.test_lambda import lam, launches  # noqa: F401  (the fake Lambda fixture)

pytestmark = pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")


def test_a_groups_nodes_launch_in_one_region_or_not_at_all(lam):  # noqa: F811
    fake, _ = lam
    provider = open_orch().provider("lambda")
    assert isinstance(provider, RentsGroups)
    pub = config.ssh_key()[1]
    req = Request(name="lg", gpu="A10", group="g" * 12, nodes=2)
    provider.open_group(req.group, req)
    head = provider.create(Request(**{**req.__dict__, "node_rank": 0}), label_for("a" * 12, "lg-0"), pub)
    region = fake.instances[head.provider_id]["region"]["name"]
    assert head.private_ip, "where the other nodes reach it"
    # The last A10 of that region is taken after the group chose it: the second node does not go
    # elsewhere (the group would span regions with no private network between them); it fails.
    fake.take_capacity("gpu_1x_a10", region)
    with pytest.raises(NoCapacity):
        provider.create(Request(**{**req.__dict__, "node_rank": 1}), label_for("b" * 12, "lg-1"), pub)
    assert {c.body["region_name"] for c in launches(fake)} == {region}
    provider.destroy(head.provider_id)
    provider.close_group(req.group)
    assert fake.live() == []



def _group(group: str, nodes: int, gpu: str = "A10") -> tuple[list[Request], list[str]]:
    """A group's requests and labels, rank order, as the core passes them to ``create_nodes``."""
    reqs = [Request(name=f"n-{r}", gpu=gpu, group=group, node_rank=r, nodes=nodes) for r in range(nodes)]
    return reqs, [label_for(f"{group[:10]}{r:02d}", f"n-{r}") for r in range(nodes)]


def test_a_group_is_one_launch_with_quantity_each_node_renamed_to_its_label(lam):  # noqa: F811
    fake, _ = lam
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    reqs, labels = _group("a" * 12, 3)
    provider.open_group("a" * 12, reqs[0])
    made = provider.create_nodes(reqs, labels, pub)
    [launch] = launches(fake)
    assert launch.body["quantity"] == 3 and launch.body["name"] == labels[0] and launch.status == 200
    assert [r.label for r in made] == labels and len(fake.live()) == 3
    rows = [fake.instances[r.provider_id] for r in made]
    assert [row["name"] for row in rows] == labels, "each instance renamed to its own node's label"
    assert {row["region"]["name"] for row in rows} == {"us-east-1"}
    assert {row["instance_type"]["name"] for row in rows} == {"gpu_1x_a10"}
    renames = fake.calls("POST", r"^/instances/[0-9a-f]+$")
    assert [c.body for c in renames] == [{"name": label} for label in labels[1:]]
    for remote, label in zip(made, labels):
        assert provider.find(label).provider_id == remote.provider_id
    for remote in made:
        provider.destroy(remote.provider_id)
    provider.close_group("a" * 12)
    assert fake.live() == []


def test_a_group_launch_is_all_or_nothing(lam):  # noqa: F811
    """Short of capacity for all three in the group's region, the whole launch moves to the next
    region (nothing of it was made); short everywhere, nothing is made. A node that cannot be renamed
    after the launch: every instance it made is terminated before the error."""
    fake, _ = lam
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    fake.capacity[("gpu_1x_a10", "us-east-1")] = 2
    reqs, labels = _group("b" * 12, 3)
    provider.open_group("b" * 12, reqs[0])
    made = provider.create_nodes(reqs, labels, pub)
    assert [(c.body["region_name"], c.body["quantity"], c.status) for c in launches(fake)] == \
        [("us-east-1", 3, 400), ("us-west-1", 3, 200)]
    assert {fake.instances[r.provider_id]["region"]["name"] for r in made} == {"us-west-1"}
    for remote in made:
        provider.destroy(remote.provider_id)

    fake.capacity[("gpu_1x_a10", "us-west-1")] = 2
    reqs, labels = _group("c" * 12, 3)
    with pytest.raises(NoCapacity):
        provider.create_nodes(reqs, labels, pub)
    assert fake.live() == [] and all(c.status == 400 for c in launches(fake)[2:])

    fake.capacity.clear()
    fake.inject(500, {"error": {"code": "global/unknown", "message": "Internal error."}}, method="POST",
                path=r"^/instances/[0-9a-f]+$", times=100)
    reqs, labels = _group("d" * 12, 2)
    with pytest.raises(ProviderError):
        provider.create_nodes(reqs, labels, pub)
    assert len(fake.instances) == 5 and fake.live() == [], "the two launched were terminated"


def test_group_launches_keep_within_the_rate_limit_and_a_lost_answer_is_looked_for(lam, orch_home):  # noqa: F811
    """Lambda allows one launch per interval (12 s there): two groups back to back are two launches,
    spaced so the limiter refuses neither. A launch whose answer was lost is not sent again: its
    instances are found by the name it gave them."""
    fake, _ = lam
    fake.launch_interval = 1.0
    configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "launch_interval": 1.0, "launch_lookup_seconds": 5})
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    reqs, labels = _group("e" * 12, 2)
    first = provider.create_nodes(reqs, labels, pub)
    t = time.monotonic()
    fake.lose_launch_answers, fake.visibility_lag = 1, 2  # made, answered 500, not listed at first
    reqs, labels = _group("f" * 12, 3)
    second = provider.create_nodes(reqs, labels, pub)
    assert [(c.body["quantity"], c.status) for c in launches(fake)] == [(2, 200), (3, 500)], "no 429, no relaunch"
    assert time.monotonic() - t >= 0.9, "the second launch waited out the interval"
    assert [r.label for r in second] == labels and len(fake.live()) == 5
    assert sorted(fake.instances[r.provider_id]["name"] for r in second) == sorted(labels)
    for remote in first + second:
        provider.destroy(remote.provider_id)
    assert fake.live() == []


def test_a_groups_nodes_are_never_of_two_instance_types(lam):  # noqa: F811
    """Another type with the same GPU, dearer, in the group's region: a node launched on its own (a
    replacement, say) after the group's type is taken there fails; it does not take the other type."""
    fake, _ = lam
    fake.types["gpu_1x_a10_pro"] = _type("gpu_1x_a10_pro", "1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 90, 1, 30,
                                         200, 1400, ["us-east-1"])
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    reqs, labels = _group("0" * 12, 2)
    provider.open_group("0" * 12, reqs[0])
    head = provider.create(reqs[0], labels[0], pub)
    fake.take_capacity("gpu_1x_a10", "us-east-1")
    with pytest.raises(NoCapacity, match="gpu_1x_a10 in region us-east-1, the group's"):
        provider.create(reqs[1], labels[1], pub)
    assert {c.body["instance_type_name"] for c in launches(fake)} == {"gpu_1x_a10"}
    provider.destroy(head.provider_id)
    provider.close_group("0" * 12)
    assert fake.live() == []


netns.isolate(globals())
