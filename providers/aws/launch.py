"""A create, in two steps: the plan (which type, in which region, tried in which zones at which
price) and the launch (the AMI, key pair and security groups there, then ``run_instances`` in each
place in turn until one has capacity). Spot and on-demand alike walk the zones: EC2 does not move a
launch refused for capacity in one zone to another by itself.

A group's nodes are one ``run_instances`` with ``MinCount=MaxCount=N`` (botocore's EC2 model,
RunInstances MinCount: "If you specify a value that is more capacity than Amazon EC2 can provide in
the target Availability Zone, Amazon EC2 does not launch any instances"): all or none, in one zone; and
one request for all the instances a cluster placement group needs, as the EC2 User Guide recommends
("Placement strategies", cluster), so the group lands on hardware that has room for all of them.
SkyPilot's AWS provisioner (github.com/skypilot-org/skypilot, sky/provision/aws/instance.py, ``_create_instances``)
launches a cluster's nodes the same way, trying each zone in turn, and then tags each node for its role.

A plan's offer, where it chose one (``Request.quote``), is rented as it was listed: its type, its
region, its prices and its zones by spot price come from that listing, and nothing is listed again.
Without one, the request's offers are listed here and the cheapest is taken.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider import Offer, Request
from providers.aws.groups import GROUP_LOCK, node_of_group
from providers.aws.images import image as find_image
from providers.aws.images import snapshot_gb
from providers.aws.instances import LABEL_TAG
from providers.aws.network import ensure_key, ensure_ssh_group
from providers.aws.offers import list_offers, offer_type
from providers.aws.prices import by_price, price_table, zones_by_price
from providers.aws.session import QUOTA, UNSUPPORTED, AWSError, QuotaExceeded, Session, aws, quota_line

DEFAULT_CPU_TYPE = "m6i.large"


@dataclass
class Plan:
    region: str
    itype: str
    gpu_name: str | None
    gpus: int
    # Where to try, cheapest first: (zone, $/hr) for each zone with a live spot price; on demand, each
    # zone that offers the type at the on-demand price (None: EC2's choice, where none is known).
    places: list[tuple[str | None, float | None]]
    max_price: float | None = None  # the user's --bid for the whole machine, spot only


def _short(zone: str | None) -> str:
    return hashlib.sha256(str(zone).encode()).hexdigest()[:4]


def _no_price(request: Request, what: str, regions: list[str]) -> NoCapacity:
    market = "spot" if request.spot else "on-demand"
    return NoCapacity(f"AWS has no {market} price for {what} in {', '.join(regions)}" +
                      ("" if request.spot else " (an instance type missing from orch's price table needs "
                                               "[providers.aws] on_demand_prices)"))


def choose(session: Session, request: Request) -> tuple[str, str, str | None, int]:
    """(region, instance type, GPU name, GPU count) for a request without a quote."""
    if request.cpu:
        itype = str(session.settings.get("cpu_instance_type") or DEFAULT_CPU_TYPE)
        region, wanted = offer_type(request.offer) if request.offer else (None, itype)
        return region or session.region, wanted, None, 0
    if not request.gpu and not request.offer:
        raise UsageError("say which GPU to rent on AWS (--gpu, e.g. A10G) or which instance type "
                         "(--offer g5.xlarge)")
    region = offer_type(request.offer)[0] if request.offer else None
    regions = [region] if region else [session.region]
    candidates = [o for o in list_offers(session, request, regions) if (o.spot_hr if request.spot else o.price_hr)]
    if not candidates:
        raise _no_price(request, request.offer or f"{request.gpus}x {request.gpu}", regions)
    best = candidates[0]
    return best.location or regions[0], best.raw["type"], best.gpu_name, best.gpus


def _quoted(session: Session, request: Request, quote: Offer) -> tuple[str, str, str | None, int]:
    """(region, instance type, GPU name, GPU count) of the offer a plan chose, as it was listed."""
    parsed = offer_type(quote.offer_id) if quote.provider == "aws" else None
    if parsed is None:
        raise ProviderError(f"{quote.provider} offer {quote.offer_id!r} is not an AWS offer: it cannot be rented here")
    region = quote.location or parsed[0] or session.region
    if not (quote.spot_hr if request.spot else quote.price_hr):
        raise _no_price(request, quote.offer_id, [region])
    return region, str(quote.raw.get("type") or parsed[1]), quote.gpu_name, quote.gpus


def plan(session: Session, request: Request) -> Plan:
    """What to rent, and the places to try it, cheapest first."""
    quote = request.quote
    region, itype, gpu_name, gpus = _quoted(session, request, quote) if quote else choose(session, request)
    if not request.spot:
        price = quote.price_hr if quote else price_table(session.settings, region)[0].get(itype)
        return Plan(region, itype, gpu_name, gpus, [(z, price) for z in zones_offering(session, region, itype)]
                    or [(None, price)])
    zones = (quote.raw or {}).get("spot_zones") if quote else None
    if isinstance(zones, dict):  # the quote's listing read them: no second look at the market
        places: list[tuple[str | None, float | None]] = list(by_price(
            {str(z): float(p) for z, p in zones.items()}, itype, region))
    else:
        places = list(zones_by_price(session, region, itype))
    per_gpu = places[0][1] / max(gpus, 1)
    max_price = None
    if request.bid is not None:
        if request.bid < per_gpu:
            raise UsageError(f"bid {request.bid:.4f} $/h per GPU is below {itype}'s live spot price "
                             f"{per_gpu:.4f} $/h per GPU in {places[0][0]}: EC2 would not start it")
        max_price = request.bid * max(gpus, 1)
        places = [(z, p) for z, p in places if p <= max_price]
    return Plan(region, itype, gpu_name, gpus, places, max_price)


def zones_offering(session: Session, region: str, itype: str) -> list[str]:
    """The zones of ``region`` where EC2 offers ``itype`` (DescribeInstanceTypeOfferings, location type
    availability-zone), in name order: where an on-demand create tries, one after another."""
    zones = set()
    with aws(f"describe_instance_type_offerings of {itype} in {region}"):
        pages = session.ec2(region).get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [itype]}])
        for page in pages:
            zones.update(o["Location"] for o in page.get("InstanceTypeOfferings", []) if o.get("Location"))
    return sorted(zones)


def launch(session: Session, chosen: Plan, requests: list[Request], labels: list[str], public_key: str) -> list[dict]:
    """The instances EC2 made (run_instances' answer, in launch-index order), all ``len(requests)`` of
    them in one request, in the first of the plan's places that has capacity for them all. A group's
    instances are labelled and ranked as its first node until ``label_nodes`` names each."""
    request, label, count = requests[0], labels[0], len(requests)
    region = chosen.region
    session.remember_region(region)
    image = find_image(session, region, request.image)
    disk = max(int(request.disk_gb), snapshot_gb(image))
    if request.group:  # a group's nodes come at once: what every instance shares is made once, in turn
        with GROUP_LOCK:
            ensure_key(session, region, public_key)
            ensure_ssh_group(session, region)
    key = ensure_key(session, region, public_key)
    group = ensure_ssh_group(session, region)
    full, unsupported = [], []
    # A create goes to the first zone (a spot one: the cheapest), and on a capacity error (or a zone
    # that does not support the request) to the next (as dstack's AWS backend moves on through its offers).
    for i, (zone, price) in enumerate(chosen.places):
        # ``run_instances`` carries the orch label as its ClientToken: a create repeated after an error
        # returns the instances the first one made instead of more (EC2 API, "Ensuring idempotency").
        args = run_args(session, chosen, request, label, image, disk, key, group, zone, price,
                        token=label if i == 0 else f"{label}-{_short(zone)}")
        args["MinCount"] = args["MaxCount"] = count
        try:
            return run(session, chosen, request, zone, args)
        except NoCapacity as e:  # that zone is out: the next one
            full.append(f"{zone or region}: {e}")
        except AWSError as e:
            if e.code != UNSUPPORTED:
                raise
            unsupported.append(f"{zone or region}: {e}")
    what = f"{count} x {chosen.itype}" if count > 1 else chosen.itype
    if full:
        raise NoCapacity(f"AWS has no capacity for {what} in {region} now ({'; '.join(full + unsupported)})")
    raise AWSError(f"AWS does not support this request for {what} in any zone of {region} "
                   f"({'; '.join(unsupported)})", code=UNSUPPORTED)


def label_nodes(session: Session, region: str, made: list[dict], labels: list[str]) -> list[dict]:
    """Each instance of a group's one launch named as its node: its own label (``find`` finds it by
    that) and rank, in launch-index order. Returns the instances as they are tagged now."""
    ec2 = session.ec2(region)
    named = []
    for rank, (inst, label) in enumerate(zip(made, labels)):
        tags = {"Name": label, LABEL_TAG: label, "orch:rank": str(rank)}
        if rank:  # the first keeps the tags it was launched with
            with aws(f"create_tags on {inst['InstanceId']} in {region}"):
                ec2.create_tags(Resources=[inst["InstanceId"]], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
        kept = [t for t in inst.get("Tags") or [] if t.get("Key") not in tags]
        named.append({**inst, "Tags": kept + [{"Key": k, "Value": v} for k, v in tags.items()]})
    return named


def run_args(session: Session, chosen: Plan, request: Request, label: str, image: dict, disk: int, key: str,
             group: str, zone: str | None, price: float | None, token: str) -> dict[str, Any]:
    """run_instances' arguments in ``zone`` (None: EC2 picks). ``token`` keeps a repeat in the same
    zone idempotent; each zone gets its own, so a refused zone's token never stands for another."""
    itype = chosen.itype
    tags = {"Name": label, LABEL_TAG: label, "orch:gpu": chosen.gpu_name or "", "orch:gpus": str(chosen.gpus),
            "orch:disk-gb": str(disk), "orch:price-hr": f"{price:.6f}" if price is not None else ""}
    members, placement = node_of_group(session, chosen.region, itype, request, tags)
    args: dict[str, Any] = dict(
        ImageId=image["ImageId"], InstanceType=itype, MinCount=1, MaxCount=1, KeyName=key,
        SecurityGroupIds=[group, *members], ClientToken=token,
        BlockDeviceMappings=[{"DeviceName": image.get("RootDeviceName") or "/dev/sda1",
                              "Ebs": {"VolumeSize": disk, "VolumeType": "gp3", "DeleteOnTermination": True}}],
        # A one-time spot instance cannot stop: a power-off ends it.
        InstanceInitiatedShutdownBehavior="terminate" if request.spot else
        session.settings.get("shutdown_behavior", "stop"),
        TagSpecifications=[{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                           for kind in ("instance", "volume")])
    if request.spot:
        options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        # No ``MaxPrice`` unless the user gave ``--bid`` (botocore's EC2 model, SpotMarketOptions: "We do
        # not recommend using this parameter because it can lead to increased interruptions. If you do
        # not specify this parameter, you will pay the current Spot price"); the plan's cost is still
        # the live price.
        if chosen.max_price is not None:  # only the user's --bid: a ceiling of orch's own only ends it sooner
            options["MaxPrice"] = f"{chosen.max_price:.4f}"
        args["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    if zone:
        args["Placement"] = {"AvailabilityZone": zone}
    if placement:
        args["Placement"] = {**args.get("Placement", {}), "GroupName": placement}
    return args


def run(session: Session, chosen: Plan, request: Request, zone: str | None, args: dict[str, Any]) -> list[dict]:
    """One run_instances, its instances in launch-index order; a quota refusal is one line naming the quota."""
    try:
        count = int(args["MinCount"])
        with aws(f"run_instances of {f'{count} x ' if count > 1 else ''}{chosen.itype} in {zone or chosen.region}"):
            made = session.ec2(chosen.region).run_instances(**args)["Instances"]
        return sorted(made, key=lambda i: int(i.get("AmiLaunchIndex") or 0))
    except AWSError as e:
        if e.code in QUOTA:
            raise QuotaExceeded(quota_line(e.code, chosen.itype, chosen.region, request.spot), code=e.code) from None
        raise
