"""A group's nodes (`--nodes N`): what they share at EC2, made by the first node that asks.

A group's nodes reach each other on every TCP port at their private addresses (a rendezvous,
NCCL's and gloo's sockets), through one rule of a security group of the group's own that
admits its members: the group as the source (EC2 User Guide, "Security group rules":
"Security group referencing"; SkyPilot and dstack do the same). orch's SSH group stays port
22 only. Where the type allows it (not the burstable t families), a cluster placement group
puts the nodes close together, in one zone (EC2 User Guide, "Placement groups").
"""

from __future__ import annotations

import threading

from orchestrator.provider import Request
from providers.aws.network import default_vpc
from providers.aws.session import AWSError, Session, aws

# One group's shared parts are made once, however many of its nodes ask at the same moment.
# Module-wide: each node of a group is made through a provider object of its own.
GROUP_LOCK = threading.Lock()


def security_group_name(group: str) -> str:
    return f"orch-group-{group}"


def placement_group_name(group: str) -> str:
    return f"orch-{group}"


def node_of_group(session: Session, region: str, itype: str, request: Request,
                  tags: dict) -> tuple[list[str], str | None]:
    """(the group's security group, its placement group or None) for a node; tags it with its
    group and rank. Idempotent, and safe when every node of a group asks at once."""
    if not request.group:
        return [], None
    tags.update({"orch:group": request.group, "orch:rank": str(request.node_rank),
                 "orch:nodes": str(request.nodes)})
    with GROUP_LOCK:
        sg = group_rule(session, region, request.group)
        placement = None
        if request.nodes > 1 and not itype.startswith("t"):
            placement = placement_group(session, region, request.group)
    return [sg], placement


def _found(session: Session, region: str, group: str) -> list[dict]:
    with aws(f"describe_security_groups in {region}"):
        return session.ec2(region).describe_security_groups(Filters=[
            {"Name": "group-name", "Values": [security_group_name(group)]}]).get("SecurityGroups", [])


def group_rule(session: Session, region: str, group: str) -> str:
    found = _found(session, region, group)
    if found:
        return found[0]["GroupId"]
    vpc = default_vpc(session, region)
    name = security_group_name(group)
    ec2 = session.ec2(region)
    with aws(f"create_security_group {name} in {region}"):
        gid = ec2.create_security_group(GroupName=name, VpcId=vpc, Description=(
            f"orch: the nodes of group {group} reach each other on every TCP port"))["GroupId"]
        ec2.authorize_security_group_ingress(GroupId=gid, IpPermissions=[{
            "IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
            "UserIdGroupPairs": [{"GroupId": gid, "Description": f"the members of orch group {group}"}]}])
    return gid


def placement_group(session: Session, region: str, group: str) -> str:
    name = placement_group_name(group)
    try:
        with aws(f"create_placement_group {name} in {region}"):
            session.ec2(region).create_placement_group(GroupName=name, Strategy="cluster")
    except AWSError as e:
        if e.code != "InvalidPlacementGroup.Duplicate":
            raise
    return name


def close_group(session: Session, group: str) -> None:
    """The group's security group and placement group, once its nodes are terminated."""
    for region in session.regions:
        ec2 = session.ec2(region)
        for sg in _found(session, region, group):
            with aws(f"delete_security_group {sg['GroupId']} in {region}"):
                ec2.delete_security_group(GroupId=sg["GroupId"])
        name = placement_group_name(group)
        try:
            with aws(f"delete_placement_group {name} in {region}"):
                ec2.delete_placement_group(GroupName=name)
        except AWSError as e:
            if e.code != "InvalidPlacementGroup.Unknown":
                raise
