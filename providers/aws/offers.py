"""Offers: the GPU instance types of each configured region (``describe_instance_types``' GpuInfo:
NVIDIA GPUs, count, memory), those the AMI runs, each with its on-demand price from the table and its
live spot price per zone. Every offer says where its price comes from, and keeps its zones' spot
prices: a create that rents it as listed (``Request.quote``) asks for neither again."""

from __future__ import annotations

import re
from datetime import timezone
from typing import Any

from orchestrator import gpus as gpu_names
from orchestrator.errors import UsageError
from orchestrator.provider import Offer, Request
from providers.aws.prices import EBS_GB_MONTH, Zones, ebs_gb_month, price_table, spot_prices
from providers.aws.session import REGION, Session, aws, family

# The families the default Deep Learning AMI (OSS Nvidia driver, PyTorch 2.9, Ubuntu 24.04) runs: G4dn,
# G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en and P6-B200 (its release notes: "Supported EC2 instances").
# Only those are offered unless ``ami`` (or ``--image``) names another AMI.
DLAMI_FAMILIES = {"g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"}
TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+")


def offer_type(offer: str) -> tuple[str | None, str] | None:
    """(region or None, instance type) from 'g5.xlarge' or 'us-east-1:g5.xlarge'."""
    region, _, itype = offer.rpartition(":")
    if not TYPE.fullmatch(itype) or (region and not REGION.fullmatch(region)):
        return None
    return region or None, itype


def check_request(settings: dict[str, Any], request: Request) -> None:
    """Refuse an --image that is no AMI id, an --offer that is no instance type, and a type the
    default AMI does not run, before anything is asked of EC2."""
    if request.image is not None and not re.fullmatch(r"ami-[0-9a-f]{8,17}", request.image):
        raise UsageError(f"--image on aws is an AMI id (ami-...), not {request.image!r}")
    if request.offer is not None and offer_type(request.offer) is None:
        raise UsageError(f"--offer on aws is an instance type (g5.xlarge) or region:type, not {request.offer!r}")
    if request.offer is not None and not request.cpu and not (request.image or settings.get("ami")):
        fam = family(offer_type(request.offer)[1])
        if fam not in DLAMI_FAMILIES:
            raise UsageError(f"{fam} instances do not run orch's default Deep Learning AMI (it supports "
                             f"{', '.join(sorted(DLAMI_FAMILIES))}): name one that does, or an AMI for it "
                             "(--image ami-..., or ami under [providers.aws])")


# -- GpuInfo (botocore's GpuDeviceInfo) ------------------------------------------------------------
def fractional(t: dict) -> bool:
    """A type whose GPUs are fractions of one (GpuPartitionSize < 1, botocore's GpuDeviceInfo): never offered."""
    return any(float(g.get("GpuPartitionSize") or 1) < 1 for g in (t.get("GpuInfo") or {}).get("Gpus") or [])


def gpu_count(t: dict) -> int:
    return sum(int(g.get("Count") or 0) for g in (t.get("GpuInfo") or {}).get("Gpus") or [])


def gpu_name(t: dict) -> str:
    gpus = (t.get("GpuInfo") or {}).get("Gpus") or [{}]
    return str(gpus[0].get("Name") or "?")


def gpu_types(session: Session, region: str) -> list[dict]:
    ec2 = session.ec2(region)
    found = []
    with aws(f"describe_instance_types in {region}"):
        pages = ec2.get_paginator("describe_instance_types").paginate(Filters=[
            # Every NVIDIA GPU family is g* or p* (g4dn, g5, g6, g6e, gr6, p3, p4d, p5...).
            {"Name": "instance-type", "Values": ["g*", "p*"]},
            {"Name": "processor-info.supported-architecture", "Values": ["x86_64"]}])
        for page in pages:
            for t in page.get("InstanceTypes", []):
                gpus = (t.get("GpuInfo") or {}).get("Gpus") or []
                if gpus and all(g.get("Manufacturer") == "NVIDIA" for g in gpus):
                    found.append(t)
    return found


# -- the listing ---------------------------------------------------------------------------------
def offer(t: dict, region: str, price: float | None, source: str, zones: Zones,
          gb_month: float = EBS_GB_MONTH) -> Offer | None:
    """One row: a type in a region. Its ``raw`` keeps what a create renting it as listed needs (the
    type, and the spot price of every zone, cheapest first), so it need not ask EC2 again."""
    itype, count = t["InstanceType"], gpu_count(t)
    spot = min(zones.items(), key=lambda z: z[1][0]) if zones else None
    if price is None and spot is None:
        return None
    first = ((t.get("GpuInfo") or {}).get("Gpus") or [{}])[0]
    memory = (first.get("MemoryInfo") or {}).get("SizeInMiB") or 0  # per GPU
    notes = [f"on-demand: {source}" if price is not None else "on-demand: not in orch's price table"]
    if spot:
        notes.append(f"spot: live, {spot[0]} at {spot[1][1].astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC")
    return Offer(
        provider="aws", offer_id=f"{region}:{itype}", gpu_name=gpu_name(t), gpus=count,
        vram_gb=round(memory / 1024, 1), price_hr=price,
        spot_hr=spot[1][0] if spot else None, min_bid_per_gpu=spot[1][0] / max(count, 1) if spot else None,
        # The root volume (EBS gp3) bills on top of the instance, running and stopped.
        disk_gb_month=gb_month, disk_gb_month_stopped=gb_month, disk_included=False,
        location=region, stock=f"spot cheapest in {spot[0]}" if spot else None, note="; ".join(notes),
        raw={"type": itype, "spot_zone": spot[0] if spot else None,
             "spot_zones": {z: p for z, (p, _) in sorted(zones.items(), key=lambda z: (z[1][0], z[0]))}},
    )


def list_offers(session: Session, request: Request, regions: list[str]) -> list[Offer]:
    found = []
    for region in regions:
        any_ami = bool(request.image or session.settings.get("ami"))
        types = [t for t in gpu_types(session, region) if gpu_count(t) == int(request.gpus)
                 and (not request.gpu or gpu_names.matches(request.gpu, gpu_name(t)))
                 and (any_ami or family(t["InstanceType"]) in DLAMI_FAMILIES) and not fractional(t)]
        if request.offer:
            types = [t for t in types if t["InstanceType"] == offer_type(request.offer)[1]]
        spot = spot_prices(session, region, [t["InstanceType"] for t in types
                                             if "spot" in (t.get("SupportedUsageClasses") or ["spot"])])
        table, source = price_table(session.settings, region)
        for t in types:
            row = offer(t, region, table.get(t["InstanceType"]), source, spot.get(t["InstanceType"], {}),
                        ebs_gb_month(session.settings, region))
            if row is not None:
                found.append(row)
    found.sort(key=lambda o: (o.spot_hr if request.spot else o.price_hr) or float("inf"))
    return found
