"""A group on AWS (`orch up NAME --nodes 2 --provider aws`): moto's EC2 made to behave as AWS does
(tests/moto_ec2.py), each node a real sshd host. Runs in a network namespace of its own (tests/netns.py)."""

from __future__ import annotations

import json

import pytest

from tests import netns
from tests.test_aws import ec2, runs  # noqa: F401  (the moto EC2 fixture)
from tests.clouds import open_orch
from tests.conftest import run_orch
from tests.fakes.hosts import sshd_available

pytestmark = pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")


def test_a_group_on_aws_shares_a_rule_a_placement_and_is_tagged_by_rank(ec2):  # noqa: F811
    m, env = ec2
    up = run_orch("up", "grp", "--provider", "aws", "--cpu", "--nodes", "2", "--json", env=env, check=0)
    group = json.loads(up.stdout)
    assert [n["name"] for n in group["nodes"]] == ["grp-0", "grp-1"] and {n["state"] for n in group["nodes"]} == \
        {"ready"}, up.stderr
    made = {i.id: i for i in m.billing()}
    assert len(made) == 2
    by_rank = {}
    for inst in made.values():
        tags = {t["key"]: t["value"] for t in inst.get_tags()}
        by_rank[int(tags["orch:rank"])] = (inst, tags)
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0][1]["orch:group"] == by_rank[1][1]["orch:group"] and by_rank[0][1]["orch:nodes"] == "2"
    # Each node's row records its private address (where the others reach it), not its public one.
    for n in group["nodes"]:
        inst = by_rank[n["node_rank"]][0]
        assert n["private_ip"] == inst.private_ip and n["ssh"].endswith(f"@{inst.public_ip}:22")
    # One rule of the group's own security group admits its members on every TCP port; SSH's stays 22 only.
    sgs = {g.id: g for g in m.backend().describe_security_groups()}
    shared = set.intersection(*({g.id for g in inst.security_groups} for inst, _ in by_rank.values()))
    [mine] = [sgs[g] for g in shared if sgs[g].name.startswith("orch-group-")]
    [rule] = mine.ingress_rules
    assert (rule.ip_protocol, rule.from_port, rule.to_port) == ("tcp", 0, 65535)
    assert rule.source_group.get("GroupId") == mine.id and not rule.ip_range, "the group's own members, no CIDR"
    [ssh] = [g for g in sgs.values() if g.name == "orch-ssh"]
    assert [(r.ip_protocol, r.from_port, r.to_port) for r in ssh.ingress_rules] == [("tcp", 22, 22)]
    # A cluster placement group for the type (m6i: not a burstable t type), both launched into it.
    placed = {r.get("Placement.GroupName") for r in runs(m)}
    assert len(placed) == 1 and list(m.placement_groups.items()) == [(placed.pop(), "cluster")]

    run_orch("down", "grp", env=env, check=0)
    assert m.billing() == []
    assert m.placement_groups == {} and not any(g.name.startswith("orch-group-")
                                                for g in m.backend().describe_security_groups())


def test_no_capacity_for_the_second_node_leaves_nothing_running(ec2):  # noqa: F811
    m, env = ec2
    m.capacity["m6i.large"] = 1  # EC2 has one more m6i.large: the second node's launch is refused
    proc = run_orch("up", "grp", "--provider", "aws", "--cpu", "--nodes", "2", env=env)
    assert proc.returncode == 1, proc.stderr
    assert "could not be had" in proc.stderr and "InsufficientInstanceCapacity" in proc.stderr, proc.stderr
    assert m.billing() == [], "the node that came up is terminated: nothing of the group runs"
    rows = {i.name: i.state for i in open_orch().ledger.instances()}
    assert set(rows) == {"grp-0", "grp-1"} and set(rows.values()) <= {"failed", "destroyed"}, rows
    assert m.placement_groups == {}
    assert json.loads(run_orch("status", "--json", env=env, check=0).stdout) == []


netns.isolate(globals())
