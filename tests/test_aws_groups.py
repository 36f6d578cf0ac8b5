"""A group on AWS (`orch up NAME --nodes 2 --provider aws`): moto's EC2 made to behave as AWS does
(tests/moto_ec2.py), each node a real sshd host. Runs in a network namespace of its own (tests/netns.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from orchestrator import config
from orchestrator.errors import NoCapacity, ProviderError
from orchestrator.provider import Request, label_for
from tests import netns
from tests.test_aws import SETTINGS, ec2, runs  # noqa: F401  (the moto EC2 fixture)
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



def _group(group: str, nodes: int, **request) -> tuple[list[Request], list[str]]:
    """A group's requests and labels, rank order, as the core passes them to ``create_nodes``."""
    reqs = [Request(name=f"n-{r}", cpu=True, group=group, node_rank=r, nodes=nodes, **request) for r in range(nodes)]
    return reqs, [label_for(f"{group[:10]}{r:02d}", f"n-{r}") for r in range(nodes)]


def _tags(inst) -> dict:
    return {t["key"]: t["value"] for t in inst.get_tags()}


def test_a_groups_nodes_are_one_run_instances_all_or_none_each_then_named_as_its_node(ec2):  # noqa: F811
    m, _ = ec2
    provider = open_orch().provider("aws")
    pub = config.ssh_key()[1]
    reqs, labels = _group("a" * 12, 3)
    provider.open_group("a" * 12, reqs[0])
    made = provider.create_nodes(reqs, labels, pub)
    [sent] = runs(m)  # one launch for the three
    assert (sent["MinCount"], sent["MaxCount"]) == ("3", "3") and sent["Placement.GroupName"] == "orch-" + "a" * 12
    assert [r.label for r in made] == labels
    instances = [m.instance(r.provider_id.split("@")[0]) for r in made]
    assert len({i.placement.zone for i in instances}) == 1, "one zone, one cluster placement group"
    for rank, (remote, inst) in enumerate(zip(made, instances)):
        tags = _tags(inst)
        assert (tags["orch:label"], tags["Name"], tags["orch:rank"], tags["orch:group"]) == \
            (labels[rank], labels[rank], str(rank), "a" * 12)
        assert provider.find(labels[rank]).provider_id == remote.provider_id, "each node found by its own label"
    assert len(m.billing()) == 3

    # EC2 has two more m6i.large: a launch of three is refused whole, in every zone; nothing more bills.
    m.capacity["m6i.large"] = 2
    reqs, labels = _group("b" * 12, 3)
    with pytest.raises(NoCapacity, match="3 x m6i.large"):
        provider.create_nodes(reqs, labels, pub)
    assert {(r["MinCount"], r["MaxCount"]) for r in runs(m)[1:]} == {("3", "3")} and len(m.billing()) == 3

    # Launched, then a node cannot be named: every instance of that launch is terminated before the error.
    m.capacity.clear()
    reqs, labels = _group("c" * 12, 2)
    m.fail("CreateTags")
    with pytest.raises(ProviderError, match="create_tags"):
        provider.create_nodes(reqs, labels, pub)
    assert len(m.instances()) == 5 and len(m.billing()) == 3, "the two just launched were terminated"
    for remote in made:
        provider.destroy(remote.provider_id)
    for group in ("a" * 12, "b" * 12, "c" * 12):
        provider.close_group(group)
    assert m.billing() == [] and m.placement_groups == {}


def _age(m, region: str, minutes: float) -> None:
    """Every group part in ``region`` made ``minutes`` ago (its orch:made-at tag)."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region, endpoint_url=m.url)
    then = str(int(time.time() - minutes * 60))
    for sg in ec2.describe_security_groups(Filters=[{"Name": "tag-key", "Values": ["orch:group"]}])["SecurityGroups"]:
        ec2.create_tags(Resources=[sg["GroupId"]], Tags=[{"Key": "orch:made-at", "Value": then}])
    for tags in m.placement_group_tags.values():
        tags["orch:made-at"] = then


def test_a_groups_parts_are_tagged_and_reconcile_sweeps_them_once_no_node_lives(ec2):  # noqa: F811
    """Nodes ended one by one (the reaper, the watchdog, a preemption: no ``close_group``), in a region
    outside ``regions`` (an --offer elsewhere): the next reconcile deletes the group's security group and
    placement group there, waiting out EC2's DependencyViolation; a live group's parts stay."""
    from orchestrator.instances import reconcile as rec

    m, env = ec2
    m.add_dlami("us-west-2")
    orch = open_orch()
    for name in ("gone", "kept"):
        up = run_orch("up", name, "--provider", "aws", "--cpu", "--offer", "us-west-2:m6i.large", "--nodes", "2",
                      "--json", env=env)
        assert up.returncode == 0, up.stderr
    nodes = {n.name: n for n in orch.ledger.instances(live_only=True)}
    gone, kept = nodes["gone-0"].group_id, nodes["kept-0"].group_id
    west = m.backend("us-west-2")
    sgs = {g.name: g for g in west.describe_security_groups()}
    for group in (gone, kept):
        assert _tags(sgs[f"orch-group-{group}"])["orch:group"] == group, "the security group carries orch's tag"
        assert m.placement_group_tags[f"orch-{group}"]["orch:group"] == group, "so does the placement group"
    assert "us-west-2" not in SETTINGS.get("regions", [SETTINGS["region"]])

    for name in ("gone-0", "gone-1"):  # one by one, as the reaper ends them
        orch.down(orch.ledger.get(nodes[name].id), "idle (the reaper)")
    assert f"orch-{gone}" in m.placement_groups, "nothing closed the group"
    report = {p.provider: p for p in rec.reconcile(orch).providers}["aws"]
    assert report.swept == [] and f"orch-{gone}" in m.placement_groups, "parts younger than the grace are left"

    _age(m, "us-west-2", 20)
    m.fail("DeleteSecurityGroup", times=2, code="DependencyViolation",  # a just-terminated node still holds it
           message=f"resource {sgs[f'orch-group-{gone}'].id} has a dependent object")
    report = {p.provider: p for p in rec.reconcile(orch).providers}["aws"]
    assert report.ok, report.problems
    assert report.swept == [f"security group {sgs[f'orch-group-{gone}'].id} of group {gone} in us-west-2",
                            f"placement group orch-{gone} of group {gone} in us-west-2"]
    assert [r["GroupId"] for r in m.requests("DeleteSecurityGroup")] == [sgs[f"orch-group-{gone}"].id] * 3
    left = {g.name for g in m.backend("us-west-2").describe_security_groups()}
    assert f"orch-group-{gone}" not in left and f"orch-group-{kept}" in left, "the live group's parts stay"
    assert list(m.placement_groups) == [f"orch-{kept}"]
    assert {p.provider: p for p in rec.reconcile(orch).providers}["aws"].swept == []
    run_orch("down", "kept", env=env, check=0)
    assert m.billing("us-west-2") == [] and m.placement_groups == {}


def test_the_groups_security_group_is_made_once_by_racing_nodes_and_gets_its_rule_back(ec2):  # noqa: F811
    """Four orch processes make the same group's security group at once (each looked, none found it):
    one creates it, the others' ``InvalidGroup.Duplicate`` and ``InvalidPermission.Duplicate`` are no
    error. A rule lost by hand comes back; a rule admitting more than the members is refused."""
    import boto3

    from providers.aws import groups
    from providers.aws.session import Session

    m, _ = ec2
    sessions = [Session(dict(SETTINGS)) for _ in range(4)]
    looked = threading.Barrier(len(sessions))
    for session in sessions:
        first = [True]

        def together(first=first, **_):
            if first[0]:  # each one's first look, taken before anyone creates it
                first[0] = False
                looked.wait(timeout=30)

        session.ec2("us-east-1").meta.events.register("after-call.ec2.DescribeSecurityGroups", together)
    found, errors = [], []

    def make(session):
        try:
            found.append(groups.group_rule(session, "us-east-1", "d" * 12))
        except Exception as e:  # noqa: BLE001 - gathered, then asserted
            errors.append(e)

    threads = [threading.Thread(target=make, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(set(found)) == 1 and len(found) == 4, errors
    assert len(m.requests("CreateSecurityGroup")) == 4, "every one tried: the race happened"
    [sg] = [g for g in m.backend().describe_security_groups() if g.name == "orch-group-" + "d" * 12]
    [rule] = sg.ingress_rules
    assert rule.source_group.get("GroupId") == sg.id and (rule.from_port, rule.to_port) == (0, 65535)

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=m.url)
    ec2.revoke_security_group_ingress(GroupId=sg.id, IpPermissions=ec2.describe_security_groups(  # by hand
        GroupIds=[sg.id])["SecurityGroups"][0]["IpPermissions"])
    assert m.backend().get_security_group_from_id(sg.id).ingress_rules == []
    assert groups.group_rule(sessions[0], "us-east-1", "d" * 12) == sg.id
    [rule] = m.backend().get_security_group_from_id(sg.id).ingress_rules
    assert rule.source_group.get("GroupId") == sg.id, "the members' rule is back"
    ec2.authorize_security_group_ingress(GroupId=sg.id, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    with pytest.raises(ProviderError, match="admits more than the members"):
        groups.group_rule(sessions[0], "us-east-1", "d" * 12)


def test_the_regions_file_is_written_under_a_lock_by_many_threads_at_once(tmp_path):
    """A group's nodes remember their region at the same moment (each node a thread): no
    FileNotFoundError, no region lost to another writer, and a reader never finds no file."""
    from providers.aws.session import REGIONS_FILE, Session

    home = tmp_path / "home"
    home.mkdir()
    regions = [f"xx-test-{i}" for i in range(48)]
    errors, start = [], threading.Barrier(len(regions) + 1)

    def remember(region: str) -> None:
        session = Session({"region": "us-east-1"}, home)
        start.wait(timeout=30)
        try:
            for _ in range(3):
                session.remember_region(region)
        except Exception as e:  # noqa: BLE001 - gathered, then asserted
            errors.append(e)

    threads = [threading.Thread(target=remember, args=(r,)) for r in regions]
    for t in threads:
        t.start()
    start.wait(timeout=30)
    seen = []
    while any(t.is_alive() for t in threads):
        seen.append(len(Session({"region": "us-east-1"}, home).created_in()))
    for t in threads:
        t.join(60)
    assert errors == [], errors[:3]
    assert sorted(json.loads((home / REGIONS_FILE).read_text())) == sorted(regions)
    assert seen == sorted(seen), "a reader saw the list shrink: a writer lost another's region"
    assert sorted(Session({"region": "us-east-1"}, home).created_in()) == sorted(regions)


netns.isolate(globals())
