"""EBS volumes as orch's volumes: gp3, in one availability zone, tagged as orch's, attached to an
instance once it runs, kept when it ends.

- ``CreateVolume(AvailabilityZone, Size, VolumeType=gp3, TagSpecifications, ClientToken)`` (EC2 API
  reference; the token makes botocore's retries of one create idempotent); tags ``Name`` (the
  provider-side name, ``model.volume_label``) and ``orch:volume`` (orch's name), the tag a listing
  filters on. An instance's root volume carries ``orch:label`` instead, so it is never one of these.
- A volume and the instance that mounts it share the zone (``AttachVolume``: ``InvalidVolume.ZoneMismatch``
  otherwise): a create that mounts one is placed in its zone (``place``), and the volume is attached
  once the instance runs (an instance that is ``pending`` answers ``IncorrectState``), at
  ``/dev/sdf``, ``/dev/sdg``... A volume attached after launch has ``DeleteOnTermination`` false
  (EC2 User Guide, "Preserve data when an instance is terminated": true for the root volume, false
  for every other): it outlives the instance, an ``orch up`` that failed included.
- On the instance the volume is found by its id (Nitro instances show EBS volumes as NVMe devices
  whose serial is the volume id, linked at ``/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol...``:
  EC2 User Guide, "Amazon EBS and NVMe"), else by the device name asked (``/dev/sdf``, which Xen
  instances show as ``/dev/xvdf``), formatted when blank and mounted (``playbooks.volumes.Block``).
- An attach that fails ends the instance (never a machine that bills without its data), keeps the
  volume, and says why in one line.
- Price: gp3 at $0.08 per GB-month in us-east-1 (aws.amazon.com/ebs/pricing), ``prices.EBS_GB_MONTH``;
  in another region the setting ``ebs_prices`` gives that region's rate, else it is costed at the
  us-east-1 rate (``prices.ebs_gb_month``).
- Moving a volume to another zone is a snapshot and a restore: orch does not.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from dataclasses import replace
from typing import Any

from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider.model import Mount, Offer, Request, Volume, volume_label
from playbooks.volumes import Block
from providers.aws.instances import provider_id
from providers.aws.prices import EBS_GB_MONTH, ebs_gb_month
from providers.aws.session import AWSError, Session, aws

VOLUME_TAG = "orch:volume"
DEVICES = "fghijklmnop"  # /dev/sdf ... /dev/sdp: the names EC2 recommends for EBS data volumes
_ID = re.compile(r"(?P<vid>vol-[0-9a-f]{8,17})@(?P<region>[a-z]{2}(-[a-z]+)+-\d+)")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
# The codes that blame the zone itself (EC2 API reference, "Error codes": InvalidAvailabilityZone,
# InvalidZone.NotFound); InvalidParameterValue blames the zone only when its message names it.
ZONE_ERRORS = ("InvalidAvailabilityZone", "InvalidZone.NotFound")
GOING = ("deleting", "deleted")
WAIT_S = 600.0  # how long a new volume may take to be available, an instance to run, an attach to finish


def split(volume_id: str) -> tuple[str, str]:
    """(vol-..., region) of orch's id of an EBS volume (``vol-...@region``)."""
    m = _ID.fullmatch(volume_id)
    if not m:
        raise ProviderError(f"{volume_id!r} is not an EBS volume id of orch's (vol-...@region)")
    return m["vid"], m["region"]


def region_of(zone: str) -> str:
    """The region of an availability zone (us-east-1a, us-west-2-lax-1a: us-east-1, us-west-2)."""
    m = _REGION.match(zone or "")
    if not m or m.end() == len(zone):
        raise UsageError(f"{zone!r} is not an AWS availability zone (such as us-east-1a)")
    return m[0]


def volume(row: dict, region: str, gb_month: float = EBS_GB_MONTH) -> Volume | None:
    """A ``describe_volumes`` row as orch's ``Volume``; None when it carries no orch name, or is on its
    way out: EC2 lists a deleted volume as ``deleting``, then ``deleted``, for a while (EC2 API
    reference, Volume ``State``: creating | available | in-use | deleting | deleted | error), and a
    volume listed so is no volume to adopt again or to mount."""
    tags = {t.get("Key"): t.get("Value") for t in row.get("Tags") or [] if isinstance(t, dict)}
    name = tags.get(VOLUME_TAG)
    if not name or row.get("State") in GOING:
        return None
    created = row.get("CreateTime")
    attached = tuple(provider_id(a["InstanceId"], region) for a in row.get("Attachments") or []
                     if a.get("State") in ("attaching", "attached") and a.get("InstanceId"))
    return Volume(name=name, provider="aws", volume_id=f"{row['VolumeId']}@{region}",
                  where=str(row.get("AvailabilityZone") or ""), size_gb=int(row.get("Size") or 0),
                  price_gb_month=gb_month, attached_to=attached,
                  created_at=created.timestamp() if hasattr(created, "timestamp") else None,
                  raw={"State": row.get("State"), "VolumeType": row.get("VolumeType")})


def default_zone(session: Session, region: str) -> str:
    with aws(f"describe_availability_zones in {region}"):
        zones = session.ec2(region).describe_availability_zones(
            Filters=[{"Name": "state", "Values": ["available"]}]).get("AvailabilityZones", [])
    names = sorted(z["ZoneName"] for z in zones if z.get("ZoneType", "availability-zone") == "availability-zone")
    if not names:
        raise ProviderError(f"AWS shows no available zone in {region}")
    return names[0]


def client_token(name: str) -> str:
    """``CreateVolume``'s idempotency token, within EC2's 64 characters ("Ensure idempotency in Amazon
    EC2 API requests": "a unique, case-sensitive string of up to 64 ASCII characters"; botocore's
    model leaves the length unchecked): ``orch-vol-`` (9), 12 hex of the name's SHA-256, a dash, 32
    random hex: 54 characters for any name. The name is hashed, not written out: a 40-character
    name made an 81-character token, which EC2 refused."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"orch-vol-{digest}-{uuid.uuid4().hex}"


def create(session: Session, name: str, size_gb: int, where: str | None, poll: float) -> Volume:
    zone = where or default_zone(session, session.region)
    region = region_of(zone)
    session.remember_region(region)  # intent first: a listing looks there even if we crash now
    label = volume_label(name)
    tags = [{"Key": "Name", "Value": label}, {"Key": VOLUME_TAG, "Value": name}]
    try:
        with aws(f"create_volume {label} in {zone}"):
            made = session.ec2(region).create_volume(
                AvailabilityZone=zone, Size=int(size_gb), VolumeType="gp3", ClientToken=client_token(name),
                TagSpecifications=[{"ResourceType": "volume", "Tags": tags}])
    except AWSError as e:
        zone_named = "zone" in str(e).lower()
        if e.code in ZONE_ERRORS or (e.code == "InvalidParameterValue" and zone_named):
            raise UsageError(f"AWS refused zone {zone!r} for a volume: {e}") from None
        if e.code == "InvalidParameterValue":  # a refusal of what was asked, made nothing: said as AWS says it
            raise UsageError(f"AWS refused to create volume {name} ({size_gb} GB gp3 in {zone}): {e}") from None
        raise
    vid = made["VolumeId"]
    row = _await(session, region, vid, lambda r: r.get("State") == "available", poll, "available")
    return volume(row, region, ebs_gb_month(session.settings, region))


def list_all(session: Session) -> list[Volume]:
    found = []
    for region in session.listed_regions:
        with aws(f"describe_volumes in {region}"):
            pages = session.ec2(region).get_paginator("describe_volumes").paginate(
                Filters=[{"Name": "tag-key", "Values": [VOLUME_TAG]}])
            for page in pages:
                found += [v for v in (volume(r, region, ebs_gb_month(session.settings, region))
                                      for r in page.get("Volumes", [])) if v is not None]
    return found


def delete(session: Session, found: Volume) -> None:
    vid, region = split(found.volume_id)
    try:
        with aws(f"delete_volume {vid} in {region}"):
            session.ec2(region).delete_volume(VolumeId=vid)
    except AWSError as e:
        if e.code == "InvalidVolume.NotFound":
            return  # already gone
        if e.code == "VolumeInUse":
            raise AWSError(f"AWS refuses to delete volume {found.name} ({vid}): an instance still has it attached "
                           "(end that instance first)", code=e.code) from None
        raise


def reaches(offer: Offer, found: Volume) -> bool:
    """An offer of the volume's region: the create places the instance in the volume's zone."""
    return bool(found.where) and offer.provider == "aws" and offer.location == region_of(found.where)


def place(chosen, request: Request):
    """The plan (``launch.Plan``) kept to the zone of the request's volumes: every mount's zone must
    be one, in the plan's region; a place that is EC2's choice becomes that zone."""
    if not request.mounts:
        return chosen
    zones = {m.volume.where for m in request.mounts}
    for m in request.mounts:
        if m.volume.provider != "aws":
            raise UsageError(f"volume {m.volume.name} is {m.volume.provider}'s: an AWS instance cannot mount it")
    if len(zones) > 1:
        raise UsageError(f"an AWS instance mounts volumes of one zone only, not {', '.join(sorted(zones))}")
    zone = zones.pop()
    if region_of(zone) != chosen.region:
        raise UsageError(f"volume {request.mounts[0].volume.name} is in {zone}; this {chosen.itype} offer is in "
                         f"{chosen.region}: rent in {region_of(zone)}")
    places = [(zone, price) for z, price in chosen.places if z in (zone, None)]
    if not places:
        raise NoCapacity(f"AWS offers no {chosen.itype} {'spot price' if request.spot else 'capacity'} in {zone}, "
                         f"where volume {request.mounts[0].volume.name} is")
    return replace(chosen, places=places[:1])


def attach(provider, made: dict, region: str, mounts: tuple[Mount, ...]) -> None:
    """Attach every mount's volume to the instance EC2 just made (``provider``'s), once it runs, and
    wait until each is attached. When one cannot be, the instance is ended (it would bill without its
    data) and the error says why in one line; the volumes are kept."""
    if not mounts:
        return
    session, poll, iid = provider.session, provider.poll_seconds, made["InstanceId"]
    ec2 = session.ec2(region)
    for i, m in enumerate(mounts):
        vid = split(m.volume.volume_id)[0]
        try:
            if i == 0:
                _await_running(session, region, iid, poll)
            with aws(f"attach_volume {vid} to {iid}"):
                ec2.attach_volume(VolumeId=vid, InstanceId=iid, Device=f"/dev/sd{DEVICES[i]}")
            _await(session, region, vid, lambda r: any(a.get("InstanceId") == iid and a.get("State") == "attached"
                                                       for a in r.get("Attachments") or []), poll, f"attached to {iid}")
        except AWSError as e:
            line = refused(m.volume, iid, e)
            try:
                provider.destroy(provider_id(iid, region))
            except ProviderError as e2:
                raise ProviderError(f"{line}; but ending the instance failed ({e2}): it may bill, "
                                    "`orch down` it") from None
            raise ProviderError(line) from None


def mount_steps(mounts) -> list[Block]:
    """Each volume found by its id (or the device name it was attached at), formatted when blank, mounted."""
    steps = []
    for i, m in enumerate(mounts):
        serial = split(m.volume.volume_id)[0].replace("-", "")
        steps.append(Block(m.path, (f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{serial}",
                                    f"/dev/sd{DEVICES[i]}", f"/dev/xvd{DEVICES[i]}"), label=m.volume.name[:16]))
    return steps


def refused(found: Volume, iid: str, error: AWSError) -> str:
    """The one line for an attach that failed (the instance ended, the volume kept)."""
    why = {"InvalidVolume.ZoneMismatch": "it is in another zone",
           "VolumeInUse": "another instance has it attached",
           "InvalidVolume.NotFound": "it no longer exists",
           "IncorrectState": "it or the instance is in a state that cannot attach"}.get(error.code or "", str(error))
    return (f"volume {found.name} could not be attached to {iid} ({why}): the instance was ended, "
            f"the volume is kept ({error.code or 'error'})")


def _await_running(session: Session, region: str, iid: str, poll: float) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        with aws(f"describe_instances {iid} in {region}"):
            found = [i for r in session.ec2(region).describe_instances(InstanceIds=[iid]).get("Reservations", [])
                     for i in r.get("Instances", [])]
        state = ((found[0].get("State") or {}).get("Name")) if found else None
        if state == "running":
            return
        if state in ("shutting-down", "terminated", "stopping", "stopped") or time.monotonic() >= deadline:
            raise AWSError(f"AWS instance {iid} is {state or 'not shown'}, not running: its volumes cannot be "
                           "attached", code="IncorrectState")
        time.sleep(poll)


def _await(session: Session, region: str, vid: str, ok, poll: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        with aws(f"describe_volumes {vid} in {region}"):
            rows = session.ec2(region).describe_volumes(VolumeIds=[vid]).get("Volumes", [])
        if rows and ok(rows[0]):
            return rows[0]
        if (rows and rows[0].get("State") == "error") or time.monotonic() >= deadline:
            raise AWSError(f"AWS volume {vid} did not become {what} ({rows[0].get('State') if rows else 'not shown'})",
                           code="IncorrectState")
        time.sleep(poll)
