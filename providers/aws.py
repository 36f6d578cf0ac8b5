"""AWS EC2, on-demand and spot, through boto3 (``orch-gpu[aws]``; imported only inside the verbs).

Credentials and region are read the way every AWS tool reads them (environment, ``~/.aws``, a
profile); ``AWS_ENDPOINT_URL`` (boto3's own) points it elsewhere. Settings (``[providers.aws]`` in
config.toml), all optional: ``profile``, ``region`` (where instances are made; default: the AWS
configuration's region, else us-east-1), ``regions`` (a list: where offers are looked for and
instances listed; default: ``region``), ``ami`` (an AMI id; default: the newest Deep Learning AMI
found by ``ami_name``/``ami_owner``), ``ssh_user`` ("ubuntu", the DLAMI's login), ``ssh_cidr``
("0.0.0.0/0": who may reach port 22), ``security_group`` ("orch-ssh"), ``cpu_instance_type``
("m6i.large", for --cpu), ``shutdown_behavior`` ("stop" or "terminate": what an on-demand
instance does when the watchdog powers it off), ``address`` ("public", or "private" over a VPN),
``on_demand_prices`` (a table of $/hr by instance type, for regions the
built-in table does not cover), ``poll_seconds`` (2), ``stop_timeout`` / ``destroy_timeout`` (600 s),
``retries`` (5, boto3's standard retry mode).

What EC2 is, and what this provider does about it:
- Offers: GPU instance types from ``describe_instance_types`` (GpuInfo: NVIDIA GPUs, count, memory)
  in each configured region; on-demand prices from the table below (the Pricing API is another
  service, with other permissions); live spot prices from ``describe_spot_price_history``, the
  latest per type and availability zone. Every offer says where its price comes from.
- A one-time spot instance cannot be stopped (EC2 User Guide, "Stop and start Spot Instances":
  only instances of a persistent request can): ``capabilities_for(spot=True)`` says so, and its
  shutdown behaviour is terminate. An on-demand instance stops when it powers off (or terminates,
  by ``shutdown_behavior``): the watchdog's self-stop is a power-off, no credentials on the
  instance. ``self_stop_command`` asks the instance's own attribute which one it is.
- A spot instance that EC2 takes back carries a state reason ``Server.SpotInstanceTermination``
  (or ``Server.SpotInstanceShutdown``, stopped): it is reported preempted, not lost.
- Spot: no ``MaxPrice`` is sent unless the user gave ``--bid`` (botocore's EC2 model, SpotMarketOptions:
  "We do not recommend using this parameter because it can lead to increased interruptions. If you
  do not specify this parameter, you will pay the current Spot price"); the plan's cost is still
  the live price. A spot create goes to the cheapest zone, and on a capacity error to the next
  zone by price (as dstack's AWS backend moves on through its offers).
- Errors by code: capacity ones (InsufficientInstanceCapacity, UnfulfillableCapacity, Unsupported
  in that zone, SpotMaxPriceTooLow, ...) are no capacity, so a job moves on; quota ones
  (VcpuLimitExceeded, MaxSpotInstanceCountExceeded, InstanceLimitExceeded) are one line naming the
  Service Quotas quota (by instance family and market) and how to raise it.
- Regions: an instance is made where its offer is (``--offer us-west-2:g5.xlarge``), which may be
  outside ``regions``: every region orch has created in is remembered in orch's home
  (``aws-regions.json``, written before the create), and listing, lookup and adoption look there too.
- orch's security group: an existing ``orch-ssh`` without its port-22 rule (a failed authorize, a
  rule deleted by hand) gets it back; a group or key pair made meanwhile by another orch
  (``InvalidGroup.Duplicate``, ``InvalidKeyPair.Duplicate``, ``InvalidPermission.Duplicate``) is
  looked up again, not an error.
- Catalogue: the default Deep Learning AMI (OSS Nvidia driver, PyTorch 2.9, Ubuntu 24.04) supports
  G4dn, G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en and P6-B200 (its release notes): only those are
  offered unless ``ami`` (or ``--image``) names another AMI; fractional-GPU types
  (GpuPartitionSize < 1, botocore's GpuDeviceInfo) are never offered.
- ``run_instances`` carries the orch label as its ClientToken: a create repeated after an error
  returns the instance the first one made instead of a second one (EC2 API, "Ensuring idempotency").
  Right after a create, an instance may not be visible yet (EC2 API, "Eventual consistency"):
  a lookup that misses an instance this process just made says pending, not gone.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from datetime import datetime, timezone
from typing import Any

from orchestrator import gpus as gpu_names
from orchestrator.errors import AuthError, NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import (Capabilities, Endpoint, Offer, Provider, Remote, Request, Status, parse_label,
                                   stopped_rate)
from orchestrator.remote import USER

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
# gp3 root volumes, us-east-1 (aws.amazon.com/ebs/pricing): billed while the instance runs and while
# it is stopped, until it is terminated.
EBS_GB_MONTH = 0.08

DEFAULT_REGION = "us-east-1"
DEFAULT_AMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu *) *"
DEFAULT_AMI_OWNER = "amazon"
DEFAULT_CPU_TYPE = "m6i.large"
SECURITY_GROUP = "orch-ssh"
LABEL_TAG = "orch:label"
LINUX = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]
# How long after our own create a "no such instance" means "not visible yet" (eventual consistency).
VISIBILITY_GRACE_S = 120.0
_STATES = {"pending": Status.PENDING, "running": Status.RUNNING, "stopping": Status.PENDING,
           "stopped": Status.STOPPED, "shutting-down": Status.PENDING, "terminated": Status.GONE}
_AUTH_CODES = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
               "ExpiredToken", "OptInRequired", "RequestExpired"}
# No machine for this request now, here (EC2 API "Error codes"): another zone, region or provider may have one.
_NO_CAPACITY = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                "InsufficientReservedInstanceCapacity", "UnfulfillableCapacity", "Unsupported", "SpotMaxPriceTooLow"}
# The account's limit, not the cloud's stock: named, with how to raise it (Service Quotas, EC2).
_QUOTA = {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded"}
# Service Quotas' EC2 quotas by instance family bucket: (on-demand name, code), (spot name, code).
QUOTAS = {
    "G": (("Running On-Demand G and VT instances", "L-DB2E81BA"), ("All G and VT Spot Instance Requests", "L-3819A6DF")),
    "P": (("Running On-Demand P instances", "L-417A185B"), ("All P Spot Instance Requests", "L-7212CCBC")),
    "Standard": (("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "L-1216C47A"),
                 ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "L-34B43A08")),
}
# The families the default Deep Learning AMI runs (its release notes: "Supported EC2 instances").
DLAMI_FAMILIES = {"g4dn", "g5", "g6", "gr6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"}
REGIONS_FILE = "aws-regions.json"  # in orch's home: every region orch has created an instance in
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")  # us-east-1, ap-southeast-2, us-gov-west-1
_ID = re.compile(r"(?P<iid>i-[0-9a-f]{8,17})@(?P<region>[a-z]{2}(-[a-z]+)+-\d+)")
_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+")

# One group's shared parts are made once, however many of its nodes ask at the same moment.
_GROUP_LOCK = threading.Lock()

# The watchdog's self-stop: power off, as root or through passwordless sudo (the DLAMI's ubuntu has it).
POWER_OFF = 'if [ "$(id -u)" = 0 ]; then shutdown -h now; else sudo -n shutdown -h now; fi'


def provider_id(instance_id: str, region: str) -> str:
    return f"{instance_id}@{region}"


def split_id(pid: str) -> tuple[str, str]:
    m = _ID.fullmatch(str(pid))
    if not m:
        raise ProviderError(f"{pid!r} is not an AWS instance id of orch's (i-...@region)")
    return m["iid"], m["region"]


def key_pair_name(public_key: str) -> str:
    """orch's key pair name: its fingerprint, so another key never collides with it."""
    try:
        blob = base64.b64decode(public_key.split()[1])
    except (IndexError, ValueError):
        blob = public_key.encode()
    return "orch-" + hashlib.sha256(blob).hexdigest()[:12]


class AWSProvider(Provider):
    name = "aws"
    capabilities = Capabilities(stop=True, spot=True, cpu_only=True, gpu=True, self_stop=True, self_destroy=True,
                                groups=True)
    env_keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
    cpu_offers = True  # --cpu --offer us-west-2:m6i.large: a CPU type, in the region named
    credentials = ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or ~/.aws/credentials, "
                   "or a [providers.aws] section in config.toml")
    login = "ubuntu"  # the Deep Learning AMI's user
    numeric_settings = {"spot_margin": 0, "poll_seconds": 0, "stop_timeout": 0, "destroy_timeout": 0, "retries": 1}

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        for key in ("profile", "region", "ami", "ami_name", "ami_owner", "ssh_user", "ssh_cidr", "security_group",
                    "cpu_instance_type"):
            value = self.settings.get(key)
            if value is not None and (not isinstance(value, str) or not value.strip() or not value.isprintable()):
                raise UsageError(f"[providers.aws] {key} must be a non-empty string, not {value!r}")
        # Checked here, before anything is rented: a user that is an ssh option or a region that is
        # no region name would otherwise fail only once the instance bills.
        if self.settings.get("ssh_user") is not None and not USER.fullmatch(self.settings["ssh_user"]):
            raise UsageError(f"[providers.aws] ssh_user must be a login name, not {self.settings['ssh_user']!r}")
        if self.settings.get("region") is not None and not _REGION.fullmatch(self.settings["region"]):
            raise UsageError(f"[providers.aws] region must be a region name (us-east-1), not {self.settings['region']!r}")
        regions = self.settings.get("regions")
        if regions is not None and (not isinstance(regions, list) or not regions or
                                    not all(isinstance(r, str) and _REGION.fullmatch(r) for r in regions)):
            raise UsageError(f"[providers.aws] regions must be a list of region names, not {regions!r}")
        if self.settings.get("shutdown_behavior", "stop") not in ("stop", "terminate"):
            raise UsageError("[providers.aws] shutdown_behavior must be stop or terminate")
        if self.settings.get("address", "public") not in ("public", "private"):
            raise UsageError("[providers.aws] address must be public or private")
        prices = self.settings.get("on_demand_prices", {})
        if not isinstance(prices, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")
                for v in prices.values()):
            raise UsageError("[providers.aws] on_demand_prices must be a table of instance type = $/hr")
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}

    # -- settings ------------------------------------------------------------------------


    def configured(self) -> bool:
        """Credentials as the AWS tools find them, looked for without importing boto3 (an instance
        role on EC2 is not seen here: name a profile or region in [providers.aws] to say it is there)."""
        env = os.environ
        if any(env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
            return True
        if any(k != "spot_margin" for k in self.settings):  # a [providers.aws] section (spot_margin is orch's)
            return True
        files = (env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials", env.get("AWS_CONFIG_FILE") or
                 "~/.aws/config")
        return any(os.path.exists(os.path.expanduser(f)) for f in files)

    @property
    def _session(self):
        import boto3

        with self._lock:
            if "_session" not in self.__dict__:
                from botocore.exceptions import ProfileNotFound

                try:
                    self.__dict__["_session"] = boto3.session.Session(profile_name=self.settings.get("profile"))
                except ProfileNotFound as e:
                    raise AuthError(f"AWS profile not found ({e}): check profile under [providers.aws] or "
                                    "AWS_PROFILE") from None
            return self.__dict__["_session"]

    @property
    def region(self) -> str:
        return self.settings.get("region") or self._session.region_name or DEFAULT_REGION

    @property
    def regions(self) -> list[str]:
        return list(dict.fromkeys([*(self.settings.get("regions") or []), self.region]))

    def _created_in(self) -> list[str]:
        """Regions orch has created instances in (remembered in orch's home), which may lie outside
        ``regions``: a listing that skipped them would never see, nor adopt, what is there."""
        import json

        if not self.home:
            return []
        try:
            found = json.loads((Path(self.home) / REGIONS_FILE).read_text())
        except (OSError, ValueError):
            return []
        return [r for r in found if isinstance(r, str) and re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", r)] \
            if isinstance(found, list) else []

    def _remember_region(self, region: str) -> None:
        """Written before the create (intent first): a crash right after it still leaves the region known."""
        import json

        if not self.home or region in self.regions or region in self._created_in():
            return
        path = Path(self.home) / REGIONS_FILE
        tmp = path.with_name(f".{REGIONS_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(sorted({*self._created_in(), region})))
        tmp.replace(path)

    @property
    def listed_regions(self) -> list[str]:
        """Where ``list`` looks: the configured regions and every one orch has created in."""
        return list(dict.fromkeys([*self.regions, *self._created_in()]))

    def _ec2(self, region: str):
        from botocore.config import Config

        session = self._session
        with self._lock:
            if region not in self._clients:
                self._clients[region] = session.client("ec2", region_name=region, config=Config(
                    retries={"mode": "standard", "max_attempts": int(self.number("retries", 5))},
                    connect_timeout=15, read_timeout=60))
            return self._clients[region]

    @contextmanager
    def _aws(self, what: str):
        """boto3's exceptions as orch's errors, each with what was being done."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

        try:
            yield
        except (NoCredentialsError, PartialCredentialsError) as e:
            raise AuthError(f"no usable AWS credentials ({what}): {e}; set them as the AWS CLI reads them "
                            "(environment, ~/.aws/credentials, a profile)") from None
        except ClientError as e:
            code = _code(e)
            message = e.response.get("Error", {}).get("Message") or str(e)
            if code in _AUTH_CODES:
                raise AuthError(f"AWS refused the credentials ({what}): {code}: {message}") from None
            if code in _NO_CAPACITY:
                raise NoCapacity(f"AWS has no capacity ({what}): {code}: {message}") from None
            if code in _QUOTA:
                raise AWSError(f"AWS refused {what}: {code}: {message}", code=code) from None
            raise AWSError(f"AWS refused {what}: {code}: {message}", code=code) from None
        except BotoCoreError as e:
            raise ProviderError(f"cannot reach AWS ({what}): {e}") from None

    # -- offers ---------------------------------------------------------------------------
    def _price_table(self, region: str) -> tuple[dict[str, float], str]:
        table = dict(ON_DEMAND.get(region, {}))
        source = ON_DEMAND_SOURCE if table else ""
        mine = self.settings.get("on_demand_prices") or {}
        if mine:
            table.update({k: float(v) for k, v in mine.items()})
            source = "[providers.aws] on_demand_prices" + (f", else {ON_DEMAND_SOURCE}" if source else "")
        return table, source

    def _gpu_types(self, region: str) -> list[dict]:
        ec2 = self._ec2(region)
        found = []
        with self._aws(f"describe_instance_types in {region}"):
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

    def spot_prices(self, region: str, types: list[str]) -> dict[str, dict[str, tuple[float, datetime]]]:
        """{type: {zone: (price, since)}}: the latest price per type and availability zone."""
        latest: dict[str, dict[str, tuple[float, datetime]]] = {}
        if not types:
            return latest
        ec2 = self._ec2(region)
        with self._aws(f"describe_spot_price_history in {region}"):
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

    def offers(self, request: Request) -> list[Offer]:
        self.validate(request)
        return self._offers(request, self.regions)

    def _offers(self, request: Request, regions: list[str]) -> list[Offer]:
        found = []
        for region in regions:
            any_ami = bool(request.image or self.settings.get("ami"))
            types = [t for t in self._gpu_types(region) if _gpu_count(t) == int(request.gpus)
                     and (not request.gpu or gpu_names.matches(request.gpu, _gpu_name(t)))
                     and (any_ami or _family(t["InstanceType"]) in DLAMI_FAMILIES) and not _fractional(t)]
            if request.offer:
                types = [t for t in types if t["InstanceType"] == _offer_type(request.offer)[1]]
            spot = self.spot_prices(region, [t["InstanceType"] for t in types
                                             if "spot" in (t.get("SupportedUsageClasses") or ["spot"])])
            table, source = self._price_table(region)
            for t in types:
                offer = _offer(t, region, table.get(t["InstanceType"]), source, spot.get(t["InstanceType"], {}))
                if offer is not None:
                    found.append(offer)
        found.sort(key=lambda o: (o.spot_hr if request.spot else o.price_hr) or float("inf"))
        return found

    # -- the verbs ------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        super().validate(request)
        if request.image is not None and not re.fullmatch(r"ami-[0-9a-f]{8,17}", request.image):
            raise UsageError(f"--image on aws is an AMI id (ami-...), not {request.image!r}")
        if request.offer is not None and _offer_type(request.offer) is None:
            raise UsageError(f"--offer on aws is an instance type (g5.xlarge) or region:type, not {request.offer!r}")
        if request.offer is not None and not request.cpu and not (request.image or self.settings.get("ami")):
            family = _family(_offer_type(request.offer)[1])
            if family not in DLAMI_FAMILIES:
                raise UsageError(f"{family} instances do not run orch's default Deep Learning AMI (it supports "
                                 f"{', '.join(sorted(DLAMI_FAMILIES))}): name one that does, or an AMI for it "
                                 "(--image ami-..., or ami under [providers.aws])")

    def capabilities_for(self, spot: bool) -> Capabilities:
        if not spot:
            return self.capabilities
        return Capabilities(stop=False, spot=True, cpu_only=True, gpu=True, self_stop=False, self_destroy=True)

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        region, itype, gpu_name, gpus = self._choose(request)
        # Where to try, cheapest first: each zone with a live spot price, or EC2's choice on demand.
        places: list[tuple[str | None, float | None]] = [(None, self._price_table(region)[0].get(itype))]
        max_price = None
        if request.spot:
            places = self._zones_by_price(region, itype)
            per_gpu = places[0][1] / max(gpus, 1)
            if request.bid is not None:
                if request.bid < per_gpu:
                    raise UsageError(f"bid {request.bid:.4f} $/h per GPU is below {itype}'s live spot price "
                                     f"{per_gpu:.4f} $/h per GPU in {places[0][0]}: EC2 would not start it")
                max_price = request.bid * max(gpus, 1)
                places = [(z, p) for z, p in places if p <= max_price]
        self._remember_region(region)
        image = self._image(region, request.image)
        disk = max(int(request.disk_gb), _snapshot_gb(image))
        if request.group:  # a group's nodes come at once: what every instance shares is made once, in turn
            with _GROUP_LOCK:
                self._ensure_key(region, public_key)
                self._ensure_group(region)
        key = self._ensure_key(region, public_key)
        group = self._ensure_group(region)
        refusals = []
        for i, (zone, price) in enumerate(places):
            try:
                return self._run(region, zone, itype, request, label, image, disk, key, group, gpu_name, gpus, price,
                                 max_price, token=label if i == 0 else f"{label}-{_short(zone)}")
            except NoCapacity as e:  # that zone is out: the next one by price
                refusals.append(f"{zone or region}: {e}")
        raise NoCapacity(f"AWS has no capacity for {itype} in {region} now ({'; '.join(refusals)})")

    def _run(self, region: str, zone: str | None, itype: str, request: Request, label: str, image: dict, disk: int,
             key: str, group: str, gpu_name: str | None, gpus: int, price: float | None, max_price: float | None,
             token: str) -> Remote:
        """One run_instances in ``zone`` (None: EC2 picks). ``token`` keeps a repeat in the same zone
        idempotent; each zone gets its own, so a refused zone's token never stands for another."""
        ec2 = self._ec2(region)
        tags = {"Name": label, LABEL_TAG: label, "orch:gpu": gpu_name or "", "orch:gpus": str(gpus),
                "orch:disk-gb": str(disk), "orch:price-hr": f"{price:.6f}" if price is not None else ""}
        members, placement = self._node_of_group(region, itype, request, tags)
        args: dict[str, Any] = dict(
            ImageId=image["ImageId"], InstanceType=itype, MinCount=1, MaxCount=1, KeyName=key,
            SecurityGroupIds=[group, *members], ClientToken=token,
            BlockDeviceMappings=[{"DeviceName": image.get("RootDeviceName") or "/dev/sda1",
                                  "Ebs": {"VolumeSize": disk, "VolumeType": "gp3", "DeleteOnTermination": True}}],
            # A one-time spot instance cannot stop: a power-off ends it.
            InstanceInitiatedShutdownBehavior="terminate" if request.spot else
            self.settings.get("shutdown_behavior", "stop"),
            TagSpecifications=[{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                               for kind in ("instance", "volume")])
        if request.spot:
            options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if max_price is not None:  # only the user's --bid: a ceiling of orch's own only ends it sooner
                options["MaxPrice"] = f"{max_price:.4f}"
            args["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        if zone:
            args["Placement"] = {"AvailabilityZone": zone}
        if placement:
            args["Placement"] = {**args.get("Placement", {}), "GroupName": placement}
        try:
            with self._aws(f"run_instances of {itype} in {zone or region}"):
                made = ec2.run_instances(**args)["Instances"][0]
        except AWSError as e:
            if e.code in _QUOTA:
                raise QuotaExceeded(_quota_line(e.code, itype, region, request.spot), code=e.code) from None
            raise
        pid = provider_id(made["InstanceId"], region)
        self.made(pid)
        return self._remote(made, region)

    def _choose(self, request: Request) -> tuple[str, str, str | None, int]:
        """(region, instance type, GPU name, GPU count) for the request."""
        if request.cpu:
            itype = str(self.settings.get("cpu_instance_type") or DEFAULT_CPU_TYPE)
            region, wanted = _offer_type(request.offer) if request.offer else (None, itype)
            return region or self.region, wanted, None, 0
        if not request.gpu and not request.offer:
            raise UsageError("say which GPU to rent on AWS (--gpu, e.g. A10G) or which instance type "
                             "(--offer g5.xlarge)")
        region = _offer_type(request.offer)[0] if request.offer else None
        regions = [region] if region else [self.region]
        candidates = [o for o in self._offers(request, regions) if (o.spot_hr if request.spot else o.price_hr)]
        if not candidates:
            what = request.offer or f"{request.gpus}x {request.gpu}"
            market = "spot" if request.spot else "on-demand"
            raise NoCapacity(f"AWS has no {market} price for {what} in {', '.join(regions)}" +
                             ("" if request.spot else " (an instance type missing from orch's price table needs "
                                                      "[providers.aws] on_demand_prices)"))
        best = candidates[0]
        return best.location or regions[0], best.raw["type"], best.gpu_name, best.gpus

    def _zones_by_price(self, region: str, itype: str) -> list[tuple[str, float]]:
        zones = self.spot_prices(region, [itype]).get(itype) or {}
        if not zones:
            raise NoCapacity(f"AWS shows no spot price for {itype} in {region}: no spot market for it there now")
        return sorted(((z, p) for z, (p, _) in zones.items()), key=lambda zp: (zp[1], zp[0]))

    def _image(self, region: str, wanted: str | None) -> dict:
        ec2 = self._ec2(region)
        ami = wanted or self.settings.get("ami")
        with self._aws(f"describe_images in {region}"):
            if ami:
                images = ec2.describe_images(ImageIds=[ami]).get("Images", [])
            else:
                images = ec2.describe_images(Owners=[self.settings.get("ami_owner") or DEFAULT_AMI_OWNER], Filters=[
                    {"Name": "name", "Values": [self.settings.get("ami_name") or DEFAULT_AMI_NAME]},
                    {"Name": "state", "Values": ["available"]},
                    {"Name": "architecture", "Values": ["x86_64"]}]).get("Images", [])
        if not images:
            what = ami or f"named {self.settings.get('ami_name') or DEFAULT_AMI_NAME!r}"
            raise ProviderError(f"no AMI {what} in {region}: set ami under [providers.aws] (or --image ami-...)")
        return max(images, key=lambda i: i.get("CreationDate") or "")

    def _ensure_key(self, region: str, public_key: str) -> str:
        name = key_pair_name(public_key)
        ec2 = self._ec2(region)
        try:
            with self._aws(f"describe_key_pairs in {region}"):
                ec2.describe_key_pairs(KeyNames=[name])
            return name
        except AWSError as e:
            if e.code != "InvalidKeyPair.NotFound":
                raise
        try:
            with self._aws(f"import_key_pair {name} in {region}"):
                ec2.import_key_pair(KeyName=name, PublicKeyMaterial=" ".join(public_key.split()[:2]).encode())
        except AWSError as e:
            if e.code != "InvalidKeyPair.Duplicate":  # another orch imported it meanwhile: the same key, by name
                raise
        return name

    def _ensure_group(self, region: str) -> str:
        """orch's security group in the default VPC: port 22 open to ``ssh_cidr``, nothing else."""
        ec2 = self._ec2(region)
        name = str(self.settings.get("security_group") or SECURITY_GROUP)
        cidr = str(self.settings.get("ssh_cidr") or "0.0.0.0/0")
        with self._aws(f"describe_vpcs in {region}"):
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
        if not vpcs:
            raise ProviderError(f"{region} has no default VPC for orch's instances: create one "
                                "(aws ec2 create-default-vpc)")
        vpc = vpcs[0]["VpcId"]
        group = self._group(ec2, region, name, vpc)
        if group is None:
            try:
                with self._aws(f"create_security_group {name} in {region}"):
                    ec2.create_security_group(GroupName=name, VpcId=vpc, Description="orch: SSH (port 22) only")
            except AWSError as e:
                if e.code != "InvalidGroup.Duplicate":  # another orch made it meanwhile: use that one
                    raise
            group = self._group(ec2, region, name, vpc)
            if group is None:
                raise ProviderError(f"security group {name} in {region} was made but cannot be found: try again")
        extra = [p for p in group.get("IpPermissions", [])
                 if not (p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22 and p.get("ToPort") == 22)]
        if extra:
            raise ProviderError(f"security group {name} ({group['GroupId']}) in {region} opens more than port "
                                "22: orch's instances would be reachable on other ports; fix or delete it")
        ssh = [r.get("CidrIp") for p in group.get("IpPermissions", []) for r in p.get("IpRanges") or []]
        if cidr not in ssh:
            # Create and authorize are two calls: one failed authorize, or a rule deleted by hand, leaves a
            # group every instance would be unreachable through (for the whole SSH wait). Add the rule.
            try:
                with self._aws(f"authorize_security_group_ingress on {name} in {region}"):
                    ec2.authorize_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[{
                        "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                        "IpRanges": [{"CidrIp": cidr, "Description": "SSH for orch"}]}])
            except AWSError as e:
                if e.code != "InvalidPermission.Duplicate":  # added meanwhile by another orch
                    raise
        return group["GroupId"]

    def _group(self, ec2, region: str, name: str, vpc: str) -> dict | None:
        with self._aws(f"describe_security_groups in {region}"):
            wanted = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}]
            groups = ec2.describe_security_groups(Filters=wanted).get("SecurityGroups", [])
        return groups[0] if groups else None

    def _describe(self, pid: str) -> dict | None:
        iid, region = split_id(pid)
        try:
            with self._aws(f"describe_instances {iid} in {region}"):
                reservations = self._ec2(region).describe_instances(InstanceIds=[iid]).get("Reservations", [])
        except AWSError as e:
            if e.code == "InvalidInstanceID.NotFound":
                return None
            raise
        found = [i for r in reservations for i in r.get("Instances", []) if i.get("InstanceId") == iid]
        return found[0] if found else None

    def get(self, provider_id: str) -> Remote:
        inst = self._describe(provider_id)
        if inst is None:
            return self.unseen(provider_id, VISIBILITY_GRACE_S) or Remote(provider_id=provider_id, label="",
                                                                          status=Status.GONE)
        self.seen(provider_id)
        return self._remote(inst, split_id(provider_id)[1])

    def list(self) -> list[Remote]:
        remotes = []
        for region in self.listed_regions:
            with self._aws(f"describe_instances in {region}"):
                pages = self._ec2(region).get_paginator("describe_instances").paginate(Filters=[
                    {"Name": "tag-key", "Values": [LABEL_TAG]},
                    {"Name": "instance-state-name",
                     "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]}])
                for page in pages:
                    for r in page.get("Reservations", []):
                        for inst in r.get("Instances", []):
                            remote = self._remote(inst, region)
                            if parse_label(remote.label) and remote.status != Status.GONE:
                                remotes.append(remote)
        return remotes

    def stop(self, provider_id: str) -> None:
        remote = self.get(provider_id)
        if remote.spot:
            raise UsageError(f"AWS instance {provider_id} is a one-time spot instance: it cannot be stopped, "
                             "only terminated (`orch down`)")
        if remote.status == Status.STOPPED:
            return
        iid, region = split_id(provider_id)
        with self._aws(f"stop_instances {iid}"):
            self._ec2(region).stop_instances(InstanceIds=[iid])
        self._await(provider_id, {Status.STOPPED}, self.number("stop_timeout", 600), "stop")

    def start(self, provider_id: str) -> Remote:
        iid, region = split_id(provider_id)
        try:
            with self._aws(f"start_instances {iid}"):
                self._ec2(region).start_instances(InstanceIds=[iid])
        except NoCapacity as e:
            raise StartRefused(f"AWS cannot start {provider_id} now ({e}). Its volume is kept and bills while "
                               "stopped. Try the start again later, or `orch down` it.") from None
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        if self.get(provider_id).status == Status.GONE:
            return
        iid, region = split_id(provider_id)
        try:
            with self._aws(f"terminate_instances {iid}"):
                self._ec2(region).terminate_instances(InstanceIds=[iid])
        except AWSError as e:
            if e.code != "InvalidInstanceID.NotFound":
                raise
        self._await(provider_id, {Status.GONE}, self.number("destroy_timeout", 600), "terminate")

    def _await(self, provider_id: str, wanted: set[Status], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while (remote := self.get(provider_id)).status not in wanted:
            if time.monotonic() >= deadline:
                raise ProviderError(f"AWS accepted the {what} of {provider_id} but still shows it "
                                    f"{remote.detail or remote.status.value} after {timeout:.0f} s: it may bill, "
                                    "check the EC2 console")
            time.sleep(self.poll_seconds)

    def _remote(self, inst: dict, region: str) -> Remote:
        state = (inst.get("State") or {}).get("Name")
        status = _STATES.get(state, Status.PENDING)
        reason = (inst.get("StateReason") or {}).get("Code") or ""
        tags = {t.get("Key"): t.get("Value") for t in inst.get("Tags") or [] if isinstance(t, dict)}
        label = tags.get(LABEL_TAG) or tags.get("Name") or ""
        ip_key = "PrivateIpAddress" if self.settings.get("address") == "private" else "PublicIpAddress"
        ip = inst.get(ip_key)
        endpoint = Endpoint(ip, 22, self.ssh_user) if status == Status.RUNNING and isinstance(ip, str) and ip else None
        disk, price = _number(tags.get("orch:disk-gb")), _number(tags.get("orch:price-hr"))
        disk_hr = stopped_rate(disk, EBS_GB_MONTH) if disk else None
        gpus = int(_number(tags.get("orch:gpus")) or 0)
        zone = (inst.get("Placement") or {}).get("AvailabilityZone") or region
        return Remote(
            provider_id=provider_id(inst["InstanceId"], region), label=label, status=status, endpoint=endpoint,
            price_hr=(price or 0.0) + (disk_hr or 0.0) if price is not None else None, stopped_price_hr=disk_hr,
            gpu_name=tags.get("orch:gpu") or None, gpus=gpus, spot=inst.get("InstanceLifecycle") == "spot",
            private_ip=inst.get("PrivateIpAddress") or None,  # where the other nodes of its group reach it
            preempted=reason.startswith("Server.Spot"),  # SpotInstanceTermination, SpotInstanceShutdown, ...
            detail=f"{state}" + (f" ({reason})" if reason else "") + f" in {zone}",
            raw={"InstanceType": inst.get("InstanceType"), "State": state, "StateReason": reason,
                 "InstanceLifecycle": inst.get("InstanceLifecycle"), "ImageId": inst.get("ImageId")},
        )

    # -- what the instance and the account hold ------------------------------------------
    def self_stop_command(self, provider_id: str, destroy: bool) -> str | None:
        """A power-off, where the instance's shutdown behaviour makes it the verb asked for: no
        credentials on the instance. The attribute is asked of EC2, not assumed."""
        iid, region = split_id(provider_id)
        with self._aws(f"describe_instance_attribute {iid}"):
            behaviour = self._ec2(region).describe_instance_attribute(
                InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
        value = (behaviour.get("InstanceInitiatedShutdownBehavior") or {}).get("Value")
        return POWER_OFF if value == ("terminate" if destroy else "stop") else None

    # -- a node of a group (`--nodes N`) ---------------------------------------------------
    # A group's nodes reach each other on every TCP port at their private addresses (a rendezvous,
    # NCCL's and gloo's sockets), through one rule of a security group of the group's own that
    # admits its members: the group as the source (EC2 User Guide, "Security group rules":
    # "Security group referencing"; SkyPilot and dstack do the same). orch's SSH group stays port
    # 22 only. Where the type allows it (not the burstable t families), a cluster placement group
    # puts the nodes close together, in one zone (EC2 User Guide, "Placement groups").
    def _node_of_group(self, region: str, itype: str, request: Request, tags: dict) -> tuple[list[str], str | None]:
        """(the group's security group, its placement group or None) for a node; tags it with its
        group and rank. Idempotent, and safe when every node of a group asks at once."""
        if not request.group:
            return [], None
        tags.update({"orch:group": request.group, "orch:rank": str(request.node_rank),
                     "orch:nodes": str(request.nodes)})
        with _GROUP_LOCK:  # module-wide: each node of a group is made through a provider object of its own
            sg = self._group_rule(region, request.group)
            placement = None
            if request.nodes > 1 and not itype.startswith("t"):
                placement = self._placement_group(region, request.group)
        return [sg], placement

    def _group_rule(self, region: str, group: str) -> str:
        ec2 = self._ec2(region)
        name = f"orch-group-{group}"
        with self._aws(f"describe_security_groups in {region}"):
            found = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]}]).get(
                "SecurityGroups", [])
        if found:
            return found[0]["GroupId"]
        with self._aws(f"describe_vpcs in {region}"):
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
        if not vpcs:
            raise ProviderError(f"{region} has no default VPC for orch's instances: create one "
                                "(aws ec2 create-default-vpc)")
        with self._aws(f"create_security_group {name} in {region}"):
            gid = ec2.create_security_group(GroupName=name, VpcId=vpcs[0]["VpcId"], Description=(
                f"orch: the nodes of group {group} reach each other on every TCP port"))["GroupId"]
            ec2.authorize_security_group_ingress(GroupId=gid, IpPermissions=[{
                "IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
                "UserIdGroupPairs": [{"GroupId": gid, "Description": f"the members of orch group {group}"}]}])
        return gid

    def _placement_group(self, region: str, group: str) -> str:
        name = f"orch-{group}"
        try:
            with self._aws(f"create_placement_group {name} in {region}"):
                self._ec2(region).create_placement_group(GroupName=name, Strategy="cluster")
        except AWSError as e:
            if e.code != "InvalidPlacementGroup.Duplicate":
                raise
        return name

    def close_group(self, group: str) -> None:
        """The group's security group and placement group, once its nodes are terminated."""
        for region in self.regions:
            ec2 = self._ec2(region)
            with self._aws(f"describe_security_groups in {region}"):
                found = ec2.describe_security_groups(Filters=[{"Name": "group-name",
                                                               "Values": [f"orch-group-{group}"]}]).get(
                    "SecurityGroups", [])
            for sg in found:
                with self._aws(f"delete_security_group {sg['GroupId']} in {region}"):
                    ec2.delete_security_group(GroupId=sg["GroupId"])
            try:
                with self._aws(f"delete_placement_group orch-{group} in {region}"):
                    ec2.delete_placement_group(GroupName=f"orch-{group}")
            except AWSError as e:
                if e.code != "InvalidPlacementGroup.Unknown":
                    raise

    def account_key(self, public_key: str) -> str:
        name = key_pair_name(public_key)
        held = []
        for region in self.regions:
            try:
                with self._aws(f"describe_key_pairs in {region}"):
                    self._ec2(region).describe_key_pairs(KeyNames=[name])
                held.append(region)
            except AWSError as e:
                if e.code != "InvalidKeyPair.NotFound":
                    raise
        where = f"held as EC2 key pair {name} in {', '.join(held)}" if held else "not imported yet"
        missing = [r for r in self.regions if r not in held]
        return where + (f"; the first `orch up` in {', '.join(missing)} imports it as {name}" if missing else "")


class AWSError(ProviderError):
    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class QuotaExceeded(AWSError):
    """The account's EC2 quota, not the cloud's stock: raising it is the user's step."""


def _family(itype: str) -> str:
    return itype.split(".", 1)[0]


def _fractional(t: dict) -> bool:
    """A type whose GPUs are fractions of one (GpuPartitionSize < 1, botocore's GpuDeviceInfo)."""
    return any(float(g.get("GpuPartitionSize") or 1) < 1 for g in (t.get("GpuInfo") or {}).get("Gpus") or [])


def _short(zone: str | None) -> str:
    return hashlib.sha256(str(zone).encode()).hexdigest()[:4]


def _quota_line(code: str, itype: str, region: str, spot: bool) -> str:
    """One line: which quota stopped the create, and how to raise it."""
    family = _family(itype)
    bucket = "G" if family[0] in "gv" else "P" if family[0] == "p" else "Standard"
    name, quota = QUOTAS[bucket][1 if spot else 0]
    return (f"AWS refused {itype} in {region}: the account's quota \"{name}\" ({quota}, counted in vCPUs) is "
            f"used up ({code}). Raise it in the Service Quotas console (Amazon EC2, {region}), or `aws "
            f"service-quotas request-service-quota-increase --service-code ec2 --quota-code {quota} --desired-value "
            f"VCPUS --region {region}`; new accounts start at 0 for GPU instances")


def _code(e) -> str:
    return str((getattr(e, "response", None) or {}).get("Error", {}).get("Code") or "")


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value and value >= 0 else None


def _gpu_count(t: dict) -> int:
    return sum(int(g.get("Count") or 0) for g in (t.get("GpuInfo") or {}).get("Gpus") or [])


def _gpu_name(t: dict) -> str:
    gpus = (t.get("GpuInfo") or {}).get("Gpus") or [{}]
    return str(gpus[0].get("Name") or "?")


def _offer_type(offer: str) -> tuple[str | None, str] | None:
    """(region or None, instance type) from 'g5.xlarge' or 'us-east-1:g5.xlarge'."""
    region, _, itype = offer.rpartition(":")
    if not _TYPE.fullmatch(itype) or (region and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", region)):
        return None
    return region or None, itype


def _snapshot_gb(image: dict) -> int:
    root = image.get("RootDeviceName")
    for bdm in image.get("BlockDeviceMappings") or []:
        if bdm.get("DeviceName") == root:
            return int((bdm.get("Ebs") or {}).get("VolumeSize") or 0)
    return 0


def _offer(t: dict, region: str, price: float | None, source: str,
           zones: dict[str, tuple[float, datetime]]) -> Offer | None:
    itype, count = t["InstanceType"], _gpu_count(t)
    spot = min(zones.items(), key=lambda z: z[1][0]) if zones else None
    if price is None and spot is None:
        return None
    first = ((t.get("GpuInfo") or {}).get("Gpus") or [{}])[0]
    memory = (first.get("MemoryInfo") or {}).get("SizeInMiB") or 0  # per GPU
    notes = [f"on-demand: {source}" if price is not None else "on-demand: not in orch's price table"]
    if spot:
        notes.append(f"spot: live, {spot[0]} at {spot[1][1].astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC")
    return Offer(
        provider="aws", offer_id=f"{region}:{itype}", gpu_name=_gpu_name(t), gpus=count,
        vram_gb=round(memory / 1024, 1), price_hr=price,
        spot_hr=spot[1][0] if spot else None, min_bid_per_gpu=spot[1][0] / max(count, 1) if spot else None,
        # The root volume (EBS gp3) bills on top of the instance, running and stopped.
        disk_gb_month=EBS_GB_MONTH, disk_gb_month_stopped=EBS_GB_MONTH, disk_included=False,
        location=region, stock=f"spot cheapest in {spot[0]}" if spot else None, note="; ".join(notes),
        raw={"type": itype, "spot_zone": spot[0] if spot else None},
    )


@hookimpl
def register_providers(register):
    register(AWSProvider)
