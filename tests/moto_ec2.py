"""moto's EC2 in server mode on 127.0.0.1, made to behave as AWS does where orch relies on it, with
a real sshd host (tests/fakes/hosts.py) behind every instance's public address.

boto3 reaches it through ``AWS_ENDPOINT_URL`` (botocore's own setting), exactly as it would reach a
proxy. moto is the EC2 model; this harness only supplies what moto does differently from AWS, each
with its reason, by wrapping moto's own classes for the life of the harness (and undoing it after):

- **Addresses.** moto gives public addresses in 54.214.0.0/16. Here every public address it hands
  out (at a launch and at every start, as EC2 does: "Amazon EC2 instance IP addressing", a stopped
  instance gets a new public IPv4 address when started) is a fresh loopback address, and the
  instance's sshd listens on port 22 there. Private addresses (moto's subnet CIDRs) stay, and are
  never dialled: orch's route is the public address. Run this in a network namespace of its own
  (tests/netns.py) so that nothing else could be reached anyway, and port 22 is free.
- **Spot prices.** moto answers one price, 0.00001, dated 2006-01-02, for every type and zone. AWS
  answers the price history: every change per type, zone and product, including the one in effect
  at ``StartTime`` (EC2 API DescribeSpotPriceHistory). The harness answers from ``spot_history``,
  which a test fills with times and prices, honouring InstanceTypes, ProductDescriptions,
  StartTime and the availability-zone / instance-type filters.
- **One-time spot instances cannot stop.** moto stops them. AWS refuses with UnsupportedOperation
  (EC2 User Guide, "Stop and start Spot Instances": only a persistent request's instances can stop).
- **ClientToken.** moto launches again on a repeated token. AWS returns the first launch
  (EC2 API, "Ensuring idempotency").
- **Power-off from inside.** moto has no guest. An EC2 instance that powers off stops or
  terminates by its InstanceInitiatedShutdownBehavior, with the state reason
  ``Client.InstanceInitiatedShutdown`` (EC2 API StateReason). The hosts' ``shutdown`` leaves a
  mark the harness sees, and it applies that behaviour.
- **Spot interruption.** ``preempt()`` ends (or stops) an instance the way the spot market does:
  state reason ``Server.SpotInstanceTermination`` / ``Server.SpotInstanceShutdown`` (EC2 API StateReason).
- **Keys.** EC2 puts the launch key pair's public key in the default user's authorized_keys
  (the DLAMI's ``ubuntu``); these hosts have only root, so root gets it.
- **Placement groups.** moto has none. EC2's CreatePlacementGroup / DescribePlacementGroups /
  DeletePlacementGroup (EC2 API reference) are answered from ``placement_groups`` (and their tags,
  from CreatePlacementGroup's TagSpecifications, in ``placement_group_tags``): a name taken answers
  ``InvalidPlacementGroup.Duplicate``, an unknown one ``InvalidPlacementGroup.Unknown``, as does a
  launch into one (RunInstances' ``Placement.GroupName``).
- **A security group in use.** moto deletes one that instances still hold. EC2 refuses: "If you
  attempt to delete a security group that is associated with an instance ... the operation fails
  with DependencyViolation" (EC2 API DeleteSecurityGroup).
- **Capacity and quotas.** moto always has capacity and no quotas. EC2 refuses a launch in a zone
  that has none with ``InsufficientInstanceCapacity`` ("We currently do not have sufficient ...
  capacity in the Availability Zone you requested", EC2 API "Error codes"), and one past the
  account's vCPU quota with ``VcpuLimitExceeded`` / ``MaxSpotInstanceCountExceeded`` (same page):
  ``no_capacity`` (a set of zones; a launch that names none lands in the region's "a" zone, as
  moto places it) and ``quota`` (an error code) make it do so, creating nothing.
  ``capacity[type]`` is how many more instances of a type can be launched anywhere: a launch of
  ``MinCount`` more than that is refused whole ("If you specify a value that is more capacity than
  Amazon EC2 can provide in the target Availability Zone, Amazon EC2 does not launch any
  instances", botocore's EC2 model, RunInstances MinCount).
- **The DLAMI.** moto's AMI catalogue has no Deep Learning AMI: ``add_dlami`` registers one owned by
  Amazon (alias ``amazon``), as AWS's are.

moto has no filter on ``instance-lifecycle``; orch does not use one (it reads InstanceLifecycle
from each instance), so nothing is supplied for it.
"""

from __future__ import annotations

import secrets
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tests.fakes.hosts import Host, loopback_address

ACCOUNT = "123456789012"  # moto's default account
AMAZON = "898082745236"  # the owner of the Deep Learning AMIs
DLAMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04) 20261009"
POWEROFF_MARK = "/run/fake-ec2-poweroff"
# What `shutdown` does on these hosts: leave the mark (the harness then powers the instance off).
SHUTDOWN = f"#!/bin/sh\ntouch {POWEROFF_MARK}\necho 'The system will power off now!'\n"


_ABSENT = object()


@dataclass
class Call:
    action: str
    params: dict[str, str]


class MotoEC2:
    def __init__(self, tmp: Path, *, boot: bool = True):
        self.root = Path(tmp) / "ec2"
        self.boot = boot  # False: instances run, but nothing answers at their address (SSH never comes)
        self.spot_history: list[dict[str, Any]] = []  # {region, type, zone, price, at, product}
        self.calls: list[Call] = []
        self.hosts: dict[str, Host] = {}
        self._fail: dict[str, tuple[int, str, str]] = {}
        self._failing = ("Unavailable", "")
        self.no_capacity: set[str] = set()  # zones where a launch is refused for capacity
        self.quota: str | None = None  # an EC2 quota error code every launch is refused with
        self.placement_groups: dict[str, str] = {}  # name -> strategy
        self.placement_group_tags: dict[str, dict[str, str]] = {}  # name -> its tags
        self.placement_group_regions: dict[str, str] = {}  # name -> its region (a name is one region's)
        self.capacity: dict[str, int] = {}  # instance type -> launches of it that still succeed
        self._used: set[str] = set()
        self._undo: list[tuple[Any, str, Any]] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.server = None

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "MotoEC2":
        from moto.server import ThreadedMotoServer

        self.root.mkdir(parents=True, exist_ok=True)
        self._patch()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self._reset()
        threading.Thread(target=self._watch_power, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        try:
            self._reset()
        finally:
            self.server.stop()
            for obj, name, old in reversed(self._undo):
                if old is _ABSENT:
                    delattr(obj, name)
                else:
                    setattr(obj, name, old)
            self._undo.clear()
            for host in list(self.hosts.values()):
                host.destroy()

    def _reset(self) -> None:
        req = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=60).read()  # a loaded machine answers late

    @property
    def url(self) -> str:
        host, port = self.server.get_host_and_port()
        return f"http://{host}:{port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

    def backend(self, region: str = "us-east-1"):
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT][region]

    # -- what tests arrange --------------------------------------------------------------
    def add_dlami(self, region: str = "us-east-1", name: str = DLAMI_NAME) -> str:
        from moto.ec2.models.amis import Ami
        from moto.ec2.utils import random_ami_id

        backend = self.backend(region)
        ami = Ami(backend, random_ami_id(), name=name, owner_id=AMAZON, owner_alias="amazon", architecture="x86_64",
                  virtualization_type="hvm", root_device_type="ebs", root_device_name="/dev/sda1", public=True)
        backend.amis[ami.id] = ami
        return ami.id

    def spot(self, itype: str, zone: str, price: float, minutes_ago: float = 1.0,
             product: str = "Linux/UNIX") -> None:
        """A spot price change for ``itype`` in ``zone`` that took effect ``minutes_ago``."""
        self.spot_history.append({"region": zone[:-1], "type": itype, "zone": zone, "price": price, "product": product,
                                  "at": datetime.now(timezone.utc) - timedelta(minutes=minutes_ago)})

    def fail(self, action: str, times: int = 1, code: str = "Unavailable",
             message: str = "The service is unavailable. Please try again shortly.") -> None:
        """The next ``times`` calls of ``action`` (e.g. DescribeInstances) answer the error ``code``
        (by default EC2's "Unavailable"; a "not found" makes a look miss what is there, as a look
        taken just before another process made it does)."""
        self._fail[action] = (times, code, message)

    def instance(self, iid: str, region: str = "us-east-1"):
        return self.backend(region).get_instance(iid)

    def instances(self, region: str = "us-east-1") -> list:
        return list(self.backend(region).all_instances())

    def billing(self, region: str = "us-east-1") -> list:
        """Instances that run or keep their disk (anything but terminated)."""
        return [i for i in self.instances(region) if i.state != "terminated"]

    def requests(self, action: str) -> list[dict[str, str]]:
        return [c.params for c in self.calls if c.action == action]

    def preempt(self, iid: str, region: str = "us-east-1", stop: bool = False) -> None:
        """The spot market takes the instance back: terminated (or stopped), with EC2's state reason."""
        from moto.ec2.models.instances import StateReason

        inst = self.instance(iid, region)
        with self._lock:
            if stop:
                inst.stop()
                code = "Server.SpotInstanceShutdown"
            else:
                inst.terminate()
                code = "Server.SpotInstanceTermination"
            inst.state_reason = StateReason(f"{code}: Spot instance {'stopped' if stop else 'termination'}", code)
            self._halt(iid, destroy=not stop)

    # -- moto, made to behave like AWS ---------------------------------------------------
    def _set(self, obj, name: str, new) -> None:
        self._undo.append((obj, name, obj.__dict__.get(name, _ABSENT) if isinstance(obj, type) else getattr(obj, name)))
        setattr(obj, name, new)

    def _patch(self) -> None:
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.models import elastic_network_interfaces as enis
        from moto.ec2.models.instances import InstanceBackend
        from moto.ec2.responses import EC2Response
        from moto.ec2.responses.spot_instances import SpotInstances

        harness = self
        self._set(enis, "random_public_ip", self._address)

        call_action = EC2Response.call_action

        def recorded(response_self):
            action = (response_self.querystring.get("Action") or [""])[0]
            with harness._lock:
                harness.calls.append(Call(action, {k: v[0] for k, v in response_self.querystring.items() if v}))
                times, code, message = harness._fail.get(action, (0, "", ""))
                if times:
                    harness._fail[action] = (times - 1, code, message)
                    harness._failing = (code, message)
            placement = (response_self.querystring.get("Placement.GroupName") or [None])[0]
            # The answer is routed by the action moto reads (``_get_action``: from the query string up to
            # moto 5.2.5, from its service router since 5.2.6), so the reroute replaces that read.
            if times:
                response_self._get_action = lambda: "FakeUnavailable"
            elif action == "RunInstances" and placement and placement not in harness.placement_groups:
                response_self._get_action = lambda: "FakeUnknownPlacement"
            return call_action(response_self)

        def fake_unavailable(response_self):
            raise EC2ClientError(*harness._failing)

        def fake_unknown_placement(response_self):
            name = response_self.querystring["Placement.GroupName"][0]
            raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")

        self._set(EC2Response, "fake_unknown_placement", fake_unknown_placement)
        self._set(EC2Response, "call_action", recorded)
        self._set(EC2Response, "fake_unavailable", fake_unavailable)

        run_instances = InstanceBackend.run_instances

        def run(backend, image_id, count, user_data, security_group_names, **kwargs):
            # A launch that names no zone goes where EC2 picks (moto: the region's "a" zone), and is
            # refused there like any other when that zone is out of capacity.
            itype = kwargs.get("instance_type") or "m1.small"
            zone = kwargs.get("placement") or f"{backend.region_name}a"
            if harness.quota == "VcpuLimitExceeded":
                raise EC2ClientError("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU "
                                     "limit of 0 allows for the instance bucket that the specified instance type "
                                     "belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request "
                                     "an adjustment to this limit.")
            if harness.quota:
                raise EC2ClientError(harness.quota, "Max spot instance count exceeded")
            if zone in harness.no_capacity:
                raise EC2ClientError("InsufficientInstanceCapacity", f"We currently do not have sufficient {itype} "
                                     f"capacity in the Availability Zone you requested ({zone}). Our system will be "
                                     "working on provisioning additional capacity.")
            token = kwargs.get("client_token")
            for reservation in backend.reservations.values():
                if token and any(i.client_token == token for i in reservation.instances):
                    return reservation  # EC2: a repeated ClientToken answers the first launch
            itype = kwargs.get("instance_type")
            with harness._lock:
                left = harness.capacity.get(itype)
                if left is not None and left < count:
                    raise EC2ClientError("InsufficientInstanceCapacity", f"We currently do not have sufficient "
                                         f"{itype} capacity in the Availability Zone you requested. Our system will "
                                         "be working on provisioning additional capacity.")
                if left is not None:
                    harness.capacity[itype] = left - count
            reservation = run_instances(backend, image_id, count, user_data, security_group_names, **kwargs)
            for inst in reservation.instances:
                harness._boot(backend, inst)
            return reservation

        stop_instances = InstanceBackend.stop_instances

        def stop(backend, instance_ids):
            for inst in backend.get_multi_instances_by_id(instance_ids):
                if inst.lifecycle == "spot":  # orch asks only for one-time requests (EC2's default)
                    raise EC2ClientError("UnsupportedOperation", f"You can't stop the Spot Instance '{inst.id}' "
                                         "because it is associated with a one-time Spot Instance request. You can "
                                         "only stop Spot Instances associated with persistent Spot Instance requests.")
            done = stop_instances(backend, instance_ids)
            for inst, _ in done:
                harness._halt(inst.id, destroy=False)
            return done

        start_instances = InstanceBackend.start_instances

        def start(backend, instance_ids):
            done = start_instances(backend, instance_ids)  # a new public address, as on EC2
            for inst, _ in done:
                harness._boot(backend, inst)
            return done

        terminate_instances = InstanceBackend.terminate_instances

        def terminate(backend, instance_ids):
            done = terminate_instances(backend, instance_ids)
            for inst, _ in done:
                harness._halt(inst.id, destroy=True)
            return done

        for name, fn in (("run_instances", run), ("stop_instances", stop), ("start_instances", start),
                         ("terminate_instances", terminate)):
            self._set(InstanceBackend, name, fn)

        def spot_price_history(response_self):
            from moto.core.responses import ActionResult

            types = response_self._get_param("InstanceTypes", []) or []
            products = response_self._get_param("ProductDescriptions", []) or []
            start = response_self._get_param("StartTime")
            if isinstance(start, str):
                start = datetime.fromisoformat(start.replace("Z", "+00:00"))
            since = start.astimezone(timezone.utc) if isinstance(start, datetime) else None
            filters = response_self._filters_from_querystring()
            rows = [r for r in harness.spot_history if r["region"] == response_self.region
                    and (not types or r["type"] in types) and (not products or r["product"] in products)
                    and all(r[{"availability-zone": "zone", "instance-type": "type"}.get(k, "")] in v
                            for k, v in filters.items() if k in ("availability-zone", "instance-type"))]
            if since is not None:  # from StartTime on, and the price in effect at StartTime
                keep = []
                for key in {(r["type"], r["zone"], r["product"]) for r in rows}:
                    same = sorted((r for r in rows if (r["type"], r["zone"], r["product"]) == key),
                                  key=lambda r: r["at"])
                    before = [r for r in same if r["at"] <= since]
                    keep += before[-1:] + [r for r in same if r["at"] > since]
                rows = keep
            rows.sort(key=lambda r: r["at"], reverse=True)
            return ActionResult({"SpotPriceHistory": [
                {"InstanceType": r["type"], "ProductDescription": r["product"], "SpotPrice": f"{r['price']:.6f}",
                 "AvailabilityZone": r["zone"], "Timestamp": r["at"].strftime("%Y-%m-%dT%H:%M:%S.000Z")}
                for r in rows]})

        self._set(SpotInstances, "describe_spot_price_history", spot_price_history)

        def create_placement_group(response_self):
            from moto.core.responses import ActionResult

            name, strategy = response_self._get_param("GroupName"), response_self._get_param("Strategy")
            tags = response_self._parse_tag_specification().get("placement-group", {})
            with harness._lock:
                if name in harness.placement_groups:
                    raise EC2ClientError("InvalidPlacementGroup.Duplicate",
                                         f"The Placement Group '{name}' already exists.")
                harness.placement_groups[name] = strategy
                harness.placement_group_tags[name] = dict(tags)
                harness.placement_group_regions[name] = response_self.region
            return ActionResult({"PlacementGroup": {"GroupName": name, "Strategy": strategy, "State": "available",
                                                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}})

        def describe_placement_groups(response_self):
            from moto.core.responses import ActionResult

            filters = response_self._filters_from_querystring()
            names = response_self._get_param("GroupNames", []) or []
            found = []
            with harness._lock:
                for name, strategy in harness.placement_groups.items():
                    tags = harness.placement_group_tags.get(name, {})
                    if harness.placement_group_regions.get(name) != response_self.region:
                        continue
                    if names and name not in names:
                        continue
                    if "tag-key" in filters and not set(filters["tag-key"]) & set(tags):
                        continue
                    if "group-name" in filters and name not in filters["group-name"]:
                        continue
                    found.append({"GroupName": name, "Strategy": strategy, "State": "available",
                                  "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]})
            return ActionResult({"PlacementGroups": found})

        def delete_placement_group(response_self):
            from moto.core.responses import ActionResult

            name = response_self._get_param("GroupName")
            with harness._lock:
                if harness.placement_group_regions.get(name, response_self.region) != response_self.region or \
                        harness.placement_groups.pop(name, None) is None:
                    raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                harness.placement_group_tags.pop(name, None)
                harness.placement_group_regions.pop(name, None)
            return ActionResult({})

        self._set(EC2Response, "create_placement_group", create_placement_group)
        self._set(EC2Response, "describe_placement_groups", describe_placement_groups)
        self._set(EC2Response, "delete_placement_group", delete_placement_group)

        from moto.ec2.models.security_groups import SecurityGroupBackend

        delete_security_group = SecurityGroupBackend.delete_security_group

        def delete_group(backend, name=None, group_id=None):
            for inst in backend.all_instances():
                if inst.state != "terminated" and any(group_id in (g.id, g.name) or name == g.name
                                                      for g in inst.security_groups):
                    raise EC2ClientError("DependencyViolation",
                                         f"resource {group_id or name} has a dependent object")
            return delete_security_group(backend, name=name, group_id=group_id)

        self._set(SecurityGroupBackend, "delete_security_group", delete_group)

    def _address(self) -> str:
        with self._lock:
            while True:
                address = loopback_address(secrets.token_hex(8))
                if address not in self._used:
                    self._used.add(address)
                    return address

    def _boot(self, backend, inst) -> None:
        if not self.boot or not inst.public_ip:
            return
        with self._lock:
            host = self.hosts.get(inst.id)
            if host is None:
                host = self.hosts[inst.id] = Host(self.root / inst.id, keep_container_disk=True)  # EBS root: kept
                host.files["/usr/local/sbin/shutdown"] = {"text": SHUTDOWN, "mode": "755"}
            host.address = inst.public_ip
        host.boot(port=22)
        pair = backend.key_pairs.get(inst.key_name) if inst.key_name else None
        if pair is not None:
            host.add_authorized_key(pair.public_key)

    def _halt(self, iid: str, destroy: bool) -> None:
        with self._lock:
            host = self.hosts.pop(iid, None) if destroy else self.hosts.get(iid)
        if host is not None:
            host.destroy() if destroy else host.halt()

    def _watch_power(self) -> None:
        """An instance whose guest powered off stops or terminates, by its shutdown behaviour."""
        from moto.ec2.models.instances import StateReason

        while not self._stop.wait(0.2):
            for iid, host in list(self.hosts.items()):
                try:
                    off = host.running() and host.path(POWEROFF_MARK).exists()
                except (OSError, RuntimeError, IndexError, ValueError):
                    continue
                if not off:
                    continue
                for region in ("us-east-1", "us-west-2"):
                    try:
                        inst = self.instance(iid, region)
                    except Exception:  # noqa: BLE001 - moto's "no such instance"
                        continue
                    with self._lock:
                        terminate = inst.instance_initiated_shutdown_behavior == "terminate"
                        inst.terminate() if terminate else inst.stop()
                        inst.state_reason = StateReason("Client.InstanceInitiatedShutdown: Instance initiated "
                                                        "shutdown", "Client.InstanceInitiatedShutdown")
                        self._halt(iid, destroy=terminate)
                    break


def wait(pred, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
