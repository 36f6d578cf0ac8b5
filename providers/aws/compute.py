"""The AWS provider's verbs; each concern it asks of EC2 is a module of this package (one module per
concern, as SkyPilot's github.com/skypilot-org/skypilot, ``sky/provision/aws/``)."""

from __future__ import annotations

import time
from typing import Any, Callable

from orchestrator.errors import NoCapacity, ProviderError, StartRefused, UsageError
from orchestrator.provider import (Capabilities, Offer, Provider, Remote, RentsGroups, Request, SelfEnding, Status,
                                   Stoppable)
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.grace import JustMade
from orchestrator.provider.model import Volume
from providers.aws import groups, instances, launch, network, self_stop, volumes
from providers.aws.instances import provider_id, split_id
from providers.aws.offers import check_request, list_offers
from providers.aws.prices import ebs_gb_month
from providers.aws.session import AWSError, Session, aws, credentials_found
from providers.aws.settings import check as check_settings

# How long after our own create a "no such instance" means "not visible yet": right after a create, an
# instance may not be visible yet (EC2 API, "Eventual consistency"), so a lookup that misses an
# instance this process just made says pending, not gone (``JustMade``).
VISIBILITY_GRACE_S = 120.0


class AWSProvider(Provider, Stoppable, SelfEnding, RentsGroups, HasVolumes):
    name = "aws"
    # EBS gp3 (``volumes``): one zone, one instance at a time, 1 GiB to 16 TiB (EBS User Guide, "Amazon
    # EBS volume types": gp3 volume size).
    volume_place, shared_volumes, min_volume_gb, max_volume_gb = "zone", False, 1, 16384
    capabilities = Capabilities(spot=True, cpu_only=True, gpu=True)
    env_keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
    cpu_offers = True  # --cpu --offer us-west-2:m6i.large: a CPU type, in the region named
    credentials = ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or ~/.aws/credentials, "
                   "or a [providers.aws] section in config.toml")
    login = "ubuntu"  # the Deep Learning AMI's user
    numeric_settings = {"spot_margin": 0, "poll_seconds": 0, "stop_timeout": 0, "destroy_timeout": 0, "retries": 1}
    other_settings = ("address", "ami", "ami_name", "ami_owner", "cpu_instance_type", "ebs_prices", "metadata_url",
                      "on_demand_prices", "profile", "region", "regions", "security_group", "shutdown_behavior",
                      "ssh_cidr")

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        check_settings(self.settings)
        self.session = Session(self.settings, home, retries=int(self.number("retries", 5)))
        self.just_made = JustMade(VISIBILITY_GRACE_S)

    def configured(self) -> bool:
        return credentials_found(self.settings)

    @property
    def region(self) -> str:
        return self.session.region

    @property
    def regions(self) -> list[str]:
        return self.session.regions

    # -- the verbs ------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        super().validate(request)
        check_request(self.settings, request)

    def offers(self, request: Request) -> list[Offer]:
        self.validate(request)
        return list_offers(self.session, request, self.session.regions)

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        chosen = volumes.place(launch.plan(self.session, request), request)  # in the zone of its volumes
        [made] = launch.launch(self.session, chosen, [request], [label], public_key)
        self.just_made.made(provider_id(made["InstanceId"], chosen.region))
        volumes.attach(self, made, chosen.region, request.mounts)  # once it runs; ends it should one fail
        return self._remote(made, chosen.region)

    def get(self, provider_id: str) -> Remote:
        inst = instances.describe(self.session, provider_id)
        if inst is None:  # not visible yet right after our own create (EC2's eventual consistency), or gone
            return self.just_made.unseen(provider_id) or Remote(provider_id=provider_id, label="",
                                                                status=Status.GONE)
        self.just_made.seen(provider_id)
        return self._remote(inst, split_id(provider_id)[1])

    def list(self) -> list[Remote]:
        return instances.tagged(self.session, self.ssh_user, self.settings.get("address") == "private")

    def destroy(self, provider_id: str) -> None:
        if self.get(provider_id).status == Status.GONE:
            return
        iid, region = split_id(provider_id)
        try:
            with aws(f"terminate_instances {iid}"):
                self.session.ec2(region).terminate_instances(InstanceIds=[iid])
        except AWSError as e:
            if e.code != "InvalidInstanceID.NotFound":
                raise
        self._await(provider_id, {Status.GONE}, self.number("destroy_timeout", 600), "terminate")

    # -- Stoppable: on demand only (EC2 User Guide, "Stop and start Spot Instances") -------
    def notice_url(self, spot: bool) -> str | None:
        """EC2's instance metadata service (IMDSv2): ``spot/instance-action`` two minutes before a
        spot instance is interrupted, and ``events/recommendations/rebalance`` when the risk rises
        (EC2 User Guide, "Spot Instance interruption notices" and "EC2 instance rebalance
        recommendations"). ``metadata_url`` in ``[providers.aws]`` points elsewhere."""
        return str(self.setting("metadata_url", "http://169.254.169.254")) if spot else None

    # A one-time spot instance cannot be stopped (only instances of a persistent request can):
    # ``stops(spot=True)`` says so, and its shutdown behaviour is terminate (``launch.run_args``).
    def stops(self, spot: bool) -> bool:
        return not spot

    def stop(self, provider_id: str) -> None:
        remote = self.get(provider_id)
        if remote.spot:
            raise UsageError(f"AWS instance {provider_id} is a one-time spot instance: it cannot be stopped, "
                             "only terminated (`orch down`)")
        if remote.status == Status.STOPPED:
            return
        iid, region = split_id(provider_id)
        with aws(f"stop_instances {iid}"):
            self.session.ec2(region).stop_instances(InstanceIds=[iid])
        self._await(provider_id, {Status.STOPPED}, self.number("stop_timeout", 600), "stop")

    def start(self, provider_id: str) -> Remote:
        iid, region = split_id(provider_id)
        try:
            with aws(f"start_instances {iid}"):
                self.session.ec2(region).start_instances(InstanceIds=[iid])
        except NoCapacity as e:
            raise StartRefused(f"AWS cannot start {provider_id} now ({e}). Its volume is kept and bills while "
                               "stopped. Try the start again later, or `orch down` it.") from None
        return self.get(provider_id)

    # -- SelfEnding, RentsGroups, the account --------------------------------------------
    def self_stop_command(self, provider_id: str, destroy: bool) -> str | None:
        return self_stop.self_stop_command(self.session, provider_id, destroy)

    def open_group(self, group: str, request: Request) -> None:
        """Nothing yet: a group's security group and placement group are made by its first node's
        create, in the region its offer is in (``groups.node_of_group``)."""

    def close_group(self, group: str) -> None:
        groups.close_group(self.session, group)

    def create_nodes(self, requests: list[Request], labels: list[str], public_key: str) -> list[Remote]:
        """A group's nodes in one ``run_instances`` with ``MinCount=MaxCount=N`` (``launch``): EC2
        makes all of them in one zone (and cluster placement group) or none. Each is then tagged
        with its own node's label and rank; should that fail, every instance the launch made is
        terminated before the error goes on. Nodes with volumes to attach are made one by one: an EBS
        volume is one instance's, attached once that instance runs (``volumes.attach``)."""
        if len(requests) < 2 or any(r.mounts for r in requests):
            return super().create_nodes(requests, labels, public_key)
        self.validate(requests[0])
        chosen = launch.plan(self.session, requests[0])
        made = launch.launch(self.session, chosen, requests, labels, public_key)
        ids = [provider_id(m["InstanceId"], chosen.region) for m in made]
        for pid in ids:
            self.just_made.made(pid)
        try:
            if len(made) != len(requests):
                raise ProviderError(f"AWS launched {len(made)} instances for a group of {len(requests)} nodes")
            named = launch.label_nodes(self.session, chosen.region, made, labels)
        except BaseException:
            self._give_back(ids)
            raise
        return [self._remote(m, chosen.region) for m in named]

    def _give_back(self, ids: list[str]) -> None:
        """Terminate what a group's failed create made, at once; best effort (the caller looks each
        label up again, and reconcile adopts anything left)."""
        if not ids:
            return
        region = split_id(ids[0])[1]
        try:
            with aws(f"terminate_instances of {len(ids)} in {region}"):
                self.session.ec2(region).terminate_instances(InstanceIds=[split_id(i)[0] for i in ids])
        except ProviderError:
            pass
        for pid in ids:
            try:
                self.destroy(pid)
            except ProviderError:
                pass

    def sweep_groups(self, live_groups: Callable[[], set[str]]) -> list[str]:
        """Every region orch looks in: the security groups and placement groups of groups with no
        live node, deleted (``groups.sweep``)."""
        return groups.sweep(self.session, live_groups)

    def account_key(self, public_key: str) -> str:
        return network.account_key(self.session, public_key)

    # -- HasVolumes: EBS (``volumes``) ------------------------------------------------------
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        return volumes.create(self.session, name, size_gb, where, self.poll_seconds)

    def list_volumes(self) -> list[Volume]:
        return volumes.list_all(self.session)

    def delete_volume(self, volume: Volume) -> None:
        volumes.delete(self.session, volume)

    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        return volumes.reaches(offer, volume)

    def mount_steps(self, mounts) -> list:
        return volumes.mount_steps(mounts)

    # -- helpers ----------------------------------------------------------------------------
    def _remote(self, inst: dict, region: str) -> Remote:
        return instances.remote(inst, region, self.ssh_user, self.settings.get("address") == "private",
                                ebs_gb_month(self.settings, region))

    def _await(self, provider_id: str, wanted: set[Status], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while (remote := self.get(provider_id)).status not in wanted:
            if time.monotonic() >= deadline:
                raise ProviderError(f"AWS accepted the {what} of {provider_id} but still shows it "
                                    f"{remote.detail or remote.status.value} after {timeout:.0f} s: it may bill, "
                                    "check the EC2 console")
            time.sleep(self.poll_seconds)
