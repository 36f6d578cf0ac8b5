"""A group on Lambda Cloud: every node in one region, each with its private address (the fake of
Lambda's REST API, tests/fakes/lambda_api.py, in a network namespace of its own: tests/netns.py)."""

from __future__ import annotations

import pytest

from orchestrator import config
from orchestrator.errors import NoCapacity
from orchestrator.provider import Request, RentsGroups, label_for
from tests import netns
from tests.clouds import open_orch
from tests.fakes.hosts import sshd_available
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


netns.isolate(globals())
