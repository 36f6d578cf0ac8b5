"""EC2's instances as orch sees them: orch's id for one (``i-...@region``), and a ``Remote`` from
what ``describe_instances`` says of it, its price and disk read back from the tags orch set."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.errors import ProviderError
from orchestrator.provider import Endpoint, Remote, Status, parse_label, stopped_rate
from providers.aws.prices import EBS_GB_MONTH
from providers.aws.session import AWSError, Session, aws

LABEL_TAG = "orch:label"
STATES = {"pending": Status.PENDING, "running": Status.RUNNING, "stopping": Status.PENDING,
          "stopped": Status.STOPPED, "shutting-down": Status.PENDING, "terminated": Status.GONE}
_ID = re.compile(r"(?P<iid>i-[0-9a-f]{8,17})@(?P<region>[a-z]{2}(-[a-z]+)+-\d+)")
# What ``list`` asks for: every state but terminated.
_LIVE = ["pending", "running", "stopping", "stopped", "shutting-down"]


def provider_id(instance_id: str, region: str) -> str:
    return f"{instance_id}@{region}"


def split_id(pid: str) -> tuple[str, str]:
    m = _ID.fullmatch(str(pid))
    if not m:
        raise ProviderError(f"{pid!r} is not an AWS instance id of orch's (i-...@region)")
    return m["iid"], m["region"]


def number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value and value >= 0 else None


def remote(inst: dict, region: str, ssh_user: str, private: bool = False, gb_month: float = EBS_GB_MONTH) -> Remote:
    """``inst`` (one of describe_instances' or run_instances' Instances) as a ``Remote``; its route is
    its public address, or its private one (``private``: over a VPN)."""
    state = (inst.get("State") or {}).get("Name")
    status = STATES.get(state, Status.PENDING)
    reason = (inst.get("StateReason") or {}).get("Code") or ""
    tags = {t.get("Key"): t.get("Value") for t in inst.get("Tags") or [] if isinstance(t, dict)}
    label = tags.get(LABEL_TAG) or tags.get("Name") or ""
    ip = inst.get("PrivateIpAddress" if private else "PublicIpAddress")
    endpoint = Endpoint(ip, 22, ssh_user) if status == Status.RUNNING and isinstance(ip, str) and ip else None
    disk, price = number(tags.get("orch:disk-gb")), number(tags.get("orch:price-hr"))
    disk_hr = stopped_rate(disk, gb_month) if disk else None
    gpus = int(number(tags.get("orch:gpus")) or 0)
    zone = (inst.get("Placement") or {}).get("AvailabilityZone") or region
    return Remote(
        provider_id=provider_id(inst["InstanceId"], region), label=label, status=status, endpoint=endpoint,
        price_hr=(price or 0.0) + (disk_hr or 0.0) if price is not None else None, stopped_price_hr=disk_hr,
        gpu_name=tags.get("orch:gpu") or None, gpus=gpus, spot=inst.get("InstanceLifecycle") == "spot",
        private_ip=inst.get("PrivateIpAddress") or None,  # where the other nodes of its group reach it
        # A spot instance that EC2 takes back carries a state reason ``Server.SpotInstanceTermination``
        # (or ``Server.SpotInstanceShutdown``, stopped): it is reported preempted, not lost.
        preempted=reason.startswith("Server.Spot"),
        detail=f"{state}" + (f" ({reason})" if reason else "") + f" in {zone}",
        raw={"InstanceType": inst.get("InstanceType"), "State": state, "StateReason": reason,
             "InstanceLifecycle": inst.get("InstanceLifecycle"), "ImageId": inst.get("ImageId")},
    )


def describe(session: Session, pid: str) -> dict | None:
    """The instance as EC2 shows it now; None where EC2 does not show it."""
    iid, region = split_id(pid)
    try:
        with aws(f"describe_instances {iid} in {region}"):
            reservations = session.ec2(region).describe_instances(InstanceIds=[iid]).get("Reservations", [])
    except AWSError as e:
        if e.code == "InvalidInstanceID.NotFound":
            return None
        raise
    found = [i for r in reservations for i in r.get("Instances", []) if i.get("InstanceId") == iid]
    return found[0] if found else None


def tagged(session: Session, ssh_user: str, private: bool = False) -> list[Remote]:
    """Every instance carrying orch's label in every region orch looks in, terminated ones aside."""
    remotes = []
    for region in session.listed_regions:
        with aws(f"describe_instances in {region}"):
            pages = session.ec2(region).get_paginator("describe_instances").paginate(Filters=[
                {"Name": "tag-key", "Values": [LABEL_TAG]}, {"Name": "instance-state-name", "Values": _LIVE}])
            for page in pages:
                for r in page.get("Reservations", []):
                    for inst in r.get("Instances", []):
                        found = remote(inst, region, ssh_user, private)
                        if parse_label(found.label) and found.status != Status.GONE:
                            remotes.append(found)
    return remotes
