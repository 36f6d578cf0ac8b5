"""A group on Lambda Cloud: every node in one region, each with its private address (the fake of
Lambda's REST API, tests/fakes/lambda_api.py, in a network namespace of its own: tests/netns.py)."""

from __future__ import annotations

import pytest

from orchestrator import config
from orchestrator.errors import NoCapacity
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


def test_a_group_is_one_launch_per_node_each_named_with_its_label(lam):  # noqa: F811
    """Lambda's launch (v1.10.0) has no ``quantity``: each node is its own launch, under its own label,
    all of one type in one region."""
    fake, _ = lam
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    reqs, labels = _group("a" * 12, 3)
    provider.open_group("a" * 12, reqs[0])
    made = provider.create_nodes(reqs, labels, pub)
    sent = launches(fake)
    assert [(c.body["name"], c.status) for c in sent] == [(label, 200) for label in labels]
    assert all("quantity" not in c.body for c in sent)
    assert [r.label for r in made] == labels and len(fake.live()) == 3
    rows = [fake.instances[r.provider_id] for r in made]
    assert [row["name"] for row in rows] == labels
    assert {row["region"]["name"] for row in rows} == {"us-east-1"}
    assert {row["instance_type"]["name"] for row in rows} == {"gpu_1x_a10"}
    for remote, label in zip(made, labels):
        assert provider.find(label).provider_id == remote.provider_id
    for remote in made:
        provider.destroy(remote.provider_id)
    provider.close_group("a" * 12)
    assert fake.live() == []


def test_a_group_launch_is_all_or_nothing(lam):  # noqa: F811
    """The group's region runs out after two of three nodes: the third is not launched elsewhere (no
    private network spans regions); the group fails and the two made are terminated. Short of
    capacity for the first node, the group goes to the next region with capacity."""
    fake, _ = lam
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    fake.capacity[("gpu_1x_a10", "us-east-1")] = 2
    reqs, labels = _group("b" * 12, 3)
    provider.open_group("b" * 12, reqs[0])
    with pytest.raises(NoCapacity) as failed:
        provider.create_nodes(reqs, labels, pub)
    assert failed.value.node_rank == 2
    assert [(c.body["region_name"], c.status) for c in launches(fake)] == \
        [("us-east-1", 200), ("us-east-1", 200), ("us-east-1", 400)]
    assert len(fake.instances) == 2 and fake.live() == [], "the two launched were terminated"

    fake.capacity[("gpu_1x_a10", "us-east-1")] = 0
    reqs, labels = _group("c" * 12, 2)
    provider.open_group("c" * 12, reqs[0])
    made = provider.create_nodes(reqs, labels, pub)
    assert [(c.body["region_name"], c.status) for c in launches(fake)[3:]] == \
        [("us-east-1", 400), ("us-west-1", 200), ("us-west-1", 200)]
    for remote in made:
        provider.destroy(remote.provider_id)
    assert fake.live() == []


def test_group_launches_keep_within_the_rate_limit_and_a_lost_answer_is_looked_for(lam, orch_home):  # noqa: F811
    """Lambda allows one launch per interval (12 s there): a group's launches, node after node, are
    spaced so the limiter refuses none. A node whose launch answer was lost is not launched again:
    it is found by its label, and the next node follows."""
    fake, _ = lam
    fake.launch_interval = 0.5
    configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "launch_interval": 0.5, "launch_lookup_seconds": 5})
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    reqs, labels = _group("e" * 12, 2)
    first = provider.create_nodes(reqs, labels, pub)
    fake.lose_launch_answers, fake.visibility_lag = 1, 2  # made, answered 500, not listed at first
    reqs, labels = _group("f" * 12, 3)
    second = provider.create_nodes(reqs, labels, pub)
    assert [c.status for c in launches(fake)] == [200, 200, 500, 200, 200], "no 429, no relaunch"
    assert [r.label for r in second] == labels and len(fake.live()) == 5
    assert [fake.instances[r.provider_id]["name"] for r in second] == labels
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
