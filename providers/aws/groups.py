"""A group's nodes (`--nodes N`): what they share at EC2, made by the first node that asks, each
carrying orch's tag so that nothing of a group outlives it.

A group's nodes reach each other on every TCP port at their private addresses (a rendezvous,
NCCL's and gloo's sockets), through one rule of a security group of the group's own that
admits its members: the group as the source (EC2 User Guide, "Security group rules":
"Security group referencing"; SkyPilot and dstack do the same). orch's SSH group stays port
22 only. Where the type allows it (not the burstable t families), a cluster placement group
puts the nodes close together, in one zone (EC2 User Guide, "Placement groups").

Both are tagged ``orch:group`` (the group) and ``orch:made-at`` (epoch seconds). ``close_group``
removes them once the nodes are gone; ``sweep`` (every reconcile) removes those whose group has no
live node, in every region orch looks in, however the nodes ended (the reaper, the watchdog, a
preemption, one by one). EC2 refuses to delete a security group an instance still holds, one
that is shutting down included (EC2 API DeleteSecurityGroup: ``DependencyViolation``), and a
placement group with instances in it (DeletePlacementGroup: "You must terminate all instances in
the placement group"; ``InvalidPlacementGroup.InUse``): both are tried again, with a backoff.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

from orchestrator.errors import ProviderError
from orchestrator.provider import Request, http
from providers.aws.network import authorize, security_group
from providers.aws.session import AWSError, Session, aws

# One group's shared parts are made once, however many of its nodes ask at the same moment.
# Module-wide: each node of a group is made through a provider object of its own.
GROUP_LOCK = threading.Lock()
GROUP_TAG = "orch:group"
MADE_TAG = "orch:made-at"
# What a group's parts are named; a part made before they were tagged is known by its name alone.
_SG_NAME = re.compile(r"orch-group-(?P<group>[0-9a-f]{12})")
_PG_NAME = re.compile(r"orch-(?P<group>[0-9a-f]{12})")
# Deletes refused while instances still hold the part: worth another try once they are gone.
IN_USE = {"DependencyViolation", "InvalidPlacementGroup.InUse"}
# A group's parts younger than this are left to the bring-up that is making them: its rows may not
# be visible to another orch's reconcile yet.
SWEEP_GRACE_S = 600.0


def security_group_name(group: str) -> str:
    return f"orch-group-{group}"


def placement_group_name(group: str) -> str:
    return f"orch-{group}"


def _tags(group: str) -> dict[str, str]:
    return {GROUP_TAG: group, MADE_TAG: str(int(time.time()))}


def node_of_group(session: Session, region: str, itype: str, request: Request,
                  tags: dict) -> tuple[list[str], str | None]:
    """(the group's security group, its placement group or None) for a node; tags it with its
    group and rank. Idempotent, and safe when every node of a group asks at once."""
    if not request.group:
        return [], None
    tags.update({GROUP_TAG: request.group, "orch:rank": str(request.node_rank), "orch:nodes": str(request.nodes)})
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
    """The group's security group, made where missing (another orch making it at the same moment is
    ``InvalidGroup.Duplicate``: looked up again), with its one rule: the group's own members, every
    TCP port. A rule lost (a failed authorize after the create, a deletion by hand) is added back,
    as ``orch-ssh``'s port 22 is; a group that admits anything more is refused."""
    name = security_group_name(group)
    found = security_group(session, region, name, f"orch: the nodes of group {group} reach each other on every "
                                                  "TCP port", tags=_tags(group))
    gid = found["GroupId"]
    members = [p for p in found.get("IpPermissions", []) if p.get("IpProtocol") == "tcp"
               and p.get("FromPort") == 0 and p.get("ToPort") == 65535 and not p.get("IpRanges")
               and not p.get("Ipv6Ranges") and [g.get("GroupId") for g in p.get("UserIdGroupPairs") or []] == [gid]]
    if len(members) != len(found.get("IpPermissions", [])):
        raise ProviderError(f"security group {name} ({gid}) in {region} admits more than the members of group "
                            f"{group}: its nodes would be reachable from elsewhere; delete it and try again")
    if not members:
        authorize(session.ec2(region), region, name, gid, {
            "IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
            "UserIdGroupPairs": [{"GroupId": gid, "Description": f"the members of orch group {group}"}]})
    return gid


def placement_group(session: Session, region: str, group: str) -> str:
    name = placement_group_name(group)
    try:
        with aws(f"create_placement_group {name} in {region}"):
            session.ec2(region).create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[
                {"ResourceType": "placement-group", "Tags": [{"Key": k, "Value": v} for k, v in _tags(group).items()]}])
    except AWSError as e:
        if e.code != "InvalidPlacementGroup.Duplicate":
            raise
    return name


# -- giving them back --------------------------------------------------------------------------------
def _retried(session: Session, what: str, call, attempts: int) -> None:
    """``call()``, again while EC2 says the part is still in use, waits growing from ``poll_seconds``."""
    base = float(session.settings.get("poll_seconds") or 2.0)

    def once():
        try:
            call()
        except AWSError as e:
            if e.code in IN_USE:
                raise http.Transient(f"AWS refused {what}: {e}", code=e.code) from None
            raise

    http.call(once, attempts=attempts, base=base, cap=20.0)


def _delete_sg(session: Session, region: str, gid: str, attempts: int) -> None:
    def call():
        try:
            with aws(f"delete_security_group {gid} in {region}"):
                session.ec2(region).delete_security_group(GroupId=gid)
        except AWSError as e:
            if e.code != "InvalidGroup.NotFound":  # gone already: what was wanted
                raise

    _retried(session, f"delete_security_group {gid} in {region}", call, attempts)


def _delete_pg(session: Session, region: str, name: str, attempts: int) -> None:
    def call():
        try:
            with aws(f"delete_placement_group {name} in {region}"):
                session.ec2(region).delete_placement_group(GroupName=name)
        except AWSError as e:
            if e.code != "InvalidPlacementGroup.Unknown":
                raise

    _retried(session, f"delete_placement_group {name} in {region}", call, attempts)


def close_group(session: Session, group: str, attempts: int = 8) -> None:
    """The group's security group and placement group, once its nodes are terminated, in every
    region orch looks in (``listed_regions``: a group made where its offer was, outside ``regions``)."""
    for region in session.listed_regions:
        for sg in _found(session, region, group):
            _delete_sg(session, region, sg["GroupId"], attempts)
        _delete_pg(session, region, placement_group_name(group), attempts)


def _tagged(item: dict) -> dict[str, str]:
    return {t.get("Key"): t.get("Value") for t in item.get("Tags") or [] if isinstance(t, dict)}


def _young(tags: dict[str, str], now: float) -> bool:
    try:
        return now - float(tags.get(MADE_TAG) or 0) < SWEEP_GRACE_S
    except ValueError:
        return False


def leftovers(session: Session, region: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({group: its security group ids}, {group: its placement group names}) that orch made in
    ``region``: tagged with ``orch:group`` (or named as orch names them, from before they were
    tagged), old enough that no bring-up is still making them."""
    ec2, now = session.ec2(region), time.time()
    sgs: dict[str, list[str]] = {}
    pgs: dict[str, list[str]] = {}
    with aws(f"describe_security_groups in {region}"):
        pages = ec2.get_paginator("describe_security_groups").paginate(
            Filters=[{"Name": "group-name", "Values": ["orch-group-*"]}])
        for page in pages:
            for sg in page.get("SecurityGroups", []):
                tags, m = _tagged(sg), _SG_NAME.fullmatch(str(sg.get("GroupName")))
                group = tags.get(GROUP_TAG) or (m["group"] if m else None)
                if group and m and m["group"] == group and not _young(tags, now):
                    sgs.setdefault(group, []).append(sg["GroupId"])
    with aws(f"describe_placement_groups in {region}"):
        for pg in ec2.describe_placement_groups().get("PlacementGroups", []):
            tags, m = _tagged(pg), _PG_NAME.fullmatch(str(pg.get("GroupName")))
            group = tags.get(GROUP_TAG) or (m["group"] if m else None)
            if group and m and m["group"] == group and not _young(tags, now):
                pgs.setdefault(group, []).append(pg["GroupName"])
    return sgs, pgs


def _held(session: Session, region: str, groups: list[str]) -> set[str]:
    """Which of ``groups`` EC2 still shows a live instance of (tagged ``orch:group``): a node this
    ledger does not hold (another orch's, not adopted yet) keeps its group's parts."""
    if not groups:
        return set()
    found = set()
    with aws(f"describe_instances in {region}"):
        pages = session.ec2(region).get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{GROUP_TAG}", "Values": groups},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]}])
        for page in pages:
            for r in page.get("Reservations", []):
                for inst in r.get("Instances", []):
                    found.add(_tagged(inst).get(GROUP_TAG))
    return found


def sweep(session: Session, live_groups: Callable[[], set[str]], attempts: int = 3) -> list[str]:
    """Delete the security groups and placement groups of orch's groups that have no live node
    (``live_groups()``: the groups the ledger holds a live node of, asked only where some are
    found), in every region orch looks in. Returns what was deleted; raises after trying them all
    when one could not be (the next reconcile tries again)."""
    done, failed = [], []
    for region in session.listed_regions:
        sgs, pgs = leftovers(session, region)
        ended = sorted(g for g in {*sgs, *pgs} if g not in live_groups()) if sgs or pgs else []
        held = _held(session, region, ended)
        for group in (g for g in ended if g not in held):
            for what, delete, items in (("security group", _delete_sg, sgs.get(group, [])),
                                        ("placement group", _delete_pg, pgs.get(group, []))):
                for item in items:
                    try:
                        delete(session, region, item, attempts)
                        done.append(f"{what} {item} of group {group} in {region}")
                    except ProviderError as e:
                        failed.append(f"{what} {item} of group {group} in {region}: {e}")
    if failed:
        raise ProviderError(f"could not delete {'; '.join(failed)}; the next reconcile tries again")
    return done
