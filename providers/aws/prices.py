"""What EC2 charges: on-demand from the table below (the Pricing API is another service, with
other permissions), spot live from ``describe_spot_price_history``, the root volume by the GB-month."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from orchestrator.errors import NoCapacity
from providers.aws.session import Session, aws

# On-demand $/hr, Linux, US East (N. Virginia), as AWS publishes them on
# https://aws.amazon.com/ec2/pricing/on-demand/ (checked against a copy of June 2026: g5.xlarge
# $1.006). Other regions have other prices: add them with the ``on_demand_prices`` setting.
ON_DEMAND_SOURCE = "AWS's on-demand price list for us-east-1, Linux (aws.amazon.com/ec2/pricing/on-demand, 2026-06)"
ON_DEMAND = {"us-east-1": {
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352, "g4dn.metal": 7.824,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448, "g5.12xlarge": 5.672,
    "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144, "g6.12xlarge": 4.6016,
    "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "g6e.8xlarge": 4.52856,
    "g6e.12xlarge": 10.49264, "g6e.16xlarge": 7.57719, "g6e.24xlarge": 15.06559, "g6e.48xlarge": 30.13118,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "m6i.large": 0.096, "m6i.xlarge": 0.192, "c6i.large": 0.085, "c6i.xlarge": 0.17, "t3.medium": 0.0416,
}}
# gp3 $/GB-month in us-east-1 (aws.amazon.com/ebs/pricing): a root volume bills while the instance runs
# and while it is stopped, until it is terminated; a data volume from its create to its delete. Other
# regions charge other rates, and orch holds no dated list of them: there, this is the us-east-1 rate
# unless ``ebs_prices`` (a table of region = $/GB-month) names the region's own (``ebs_gb_month``).
EBS_GB_MONTH = 0.08
EBS_REGION = "us-east-1"
LINUX = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]

Zones = dict[str, tuple[float, datetime]]  # zone: (latest spot price, since)


def price_table(settings: dict[str, Any], region: str) -> tuple[dict[str, float], str]:
    """({instance type: on-demand $/hr}, where those prices come from) for ``region``."""
    table = dict(ON_DEMAND.get(region, {}))
    source = ON_DEMAND_SOURCE if table else ""
    mine = settings.get("on_demand_prices") or {}
    if mine:
        table.update({k: float(v) for k, v in mine.items()})
        source = "[providers.aws] on_demand_prices" + (f", else {ON_DEMAND_SOURCE}" if source else "")
    return table, source


def ebs_gb_month(settings: dict[str, Any], region: str) -> float:
    """gp3 $/GB-month in ``region``: the ``ebs_prices`` setting's for it, else the us-east-1 rate."""
    mine = settings.get("ebs_prices") or {}
    return float(mine[region]) if region in mine else EBS_GB_MONTH


def spot_prices(session: Session, region: str, types: list[str]) -> dict[str, Zones]:
    """{type: {zone: (price, since)}}: the latest price per type and availability zone."""
    latest: dict[str, Zones] = {}
    if not types:
        return latest
    ec2 = session.ec2(region)
    with aws(f"describe_spot_price_history in {region}"):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=types, ProductDescriptions=LINUX, StartTime=datetime.now(timezone.utc))
        for page in pages:
            for row in page.get("SpotPriceHistory", []):
                try:
                    price, at = float(row["SpotPrice"]), row["Timestamp"]
                    zone, itype = row["AvailabilityZone"], row["InstanceType"]
                except (KeyError, TypeError, ValueError):
                    continue
                have = latest.setdefault(itype, {}).get(zone)
                if have is None or at > have[1]:
                    latest[itype][zone] = (price, at)
    return latest


def by_price(zones: dict[str, float], itype: str, region: str) -> list[tuple[str, float]]:
    """[(zone, spot $/hr)], cheapest first; no zone at all is no spot market there now."""
    if not zones:
        raise NoCapacity(f"AWS shows no spot price for {itype} in {region}: no spot market for it there now")
    return sorted(zones.items(), key=lambda zp: (zp[1], zp[0]))


def zones_by_price(session: Session, region: str, itype: str) -> list[tuple[str, float]]:
    """The zones of ``itype``'s spot market in ``region``, cheapest first, asked live."""
    zones = spot_prices(session, region, [itype]).get(itype) or {}
    return by_price({z: p for z, (p, _) in zones.items()}, itype, region)
