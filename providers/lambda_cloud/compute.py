"""``LambdaProvider``: the verbs over Lambda's API, and the launch loop (regions in turn, 429s waited
out, an answer lost to a 5xx looked for, never launched blind again)."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider import Capabilities, Offer, Provider, Remote, RentsGroups, Request, Status, parse_label
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.model import Volume
from orchestrator.provider.grace import JustMade
from orchestrator.provider.http import Transient
from providers.lambda_cloud import groups, keys, volumes
from providers.lambda_cloud.api import (ERRORS, LAUNCH_LOOKUP_SECONDS, NO_CAPACITY, NOT_FOUND, LambdaError,
                                        LostLaunch, Session, api_key, lambda_id)
from providers.lambda_cloud.health import UNHEALTHY_GRACE_S, Unhealthy
from providers.lambda_cloud.instances import STATES, remote_from
from providers.lambda_cloud.offers import asked, instance_types, matching, wanted

# A new id that GET /instances/{id} does not know yet is pending for two minutes, not gone (the grace
# EC2's eventual consistency gets).
VISIBILITY_GRACE_S = 120.0


class LambdaProvider(Provider, RentsGroups, HasVolumes):
    name = "lambda"
    # There is no stop and no spot: spot is declared here and refused in one line, and the provider is
    # no ``Stoppable``. There is no self-stop either (no ``SelfEnding``): only a terminate through the
    # API ends the bill, and that needs the account's key, which orch never puts on an instance.
    # Groups: a group's nodes launch in one region, where instances reach each other at their
    # private_ip (``groups``).
    capabilities = Capabilities(spot=False, cpu_only=False, gpu=True)
    env_keys = ("LAMBDA_API_KEY", "LAMBDA_API_BASE_URL")
    credentials = "LAMBDA_API_KEY, or api_key under [providers.lambda] in config.toml"
    login = "ubuntu"  # Lambda Stack's user
    # Filesystems (``volumes``): one region, mounted by any number of its instances at once, sized by
    # what they hold (no size is set; the bounds are orch's own sanity).
    volume_place, shared_volumes = "region", True
    numeric_settings = {"retries": 1, "http_timeout": 0.1, "launch_interval": 0, "poll_seconds": 0,
                        "destroy_timeout": 0, "launch_lookup_seconds": 0, "unhealthy_grace": 0}
    other_settings = ("api_key", "base_url", "image", "region")

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        super().__init__(settings, home)
        self.api = Session(self.settings, self.number)
        self.just_made = JustMade(VISIBILITY_GRACE_S)
        self.unhealthy = Unhealthy(self.api, home, self.number("unhealthy_grace", UNHEALTHY_GRACE_S))

    def configured(self) -> bool:
        return bool(api_key(self.settings))

    # -- offers ------------------------------------------------------------------------
    def offers(self, request: Request) -> list[Offer]:
        # Asked for spot prices, Lambda has none to show: its offers carry no spot price (not an error).
        self.validate(replace(request, spot=False, bid=None))
        return matching(instance_types(self.api), request)

    def _candidates(self, request: Request) -> list[Offer]:
        """What to launch: the plan's quote as it was listed (its regions with capacity then), with no
        second ``GET /instance-types``; else the live offers, cheapest first."""
        quote = request.quote
        if quote is None:
            return self.offers(request)
        if quote.provider != self.name or not quote.raw.get("regions"):
            raise ProviderError(f"offer {quote.offer_id} is not one of Lambda Cloud's listed offers: it cannot be "
                                "launched as quoted")
        return [quote]

    # -- the verbs ---------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        super().validate(request)
        if request.image is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", request.image):
            raise UsageError("--image on lambda is a Lambda image family or image id (letters, digits, '.', '_', '-')")

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        candidates = self._rentable(request)
        return self.launch_one(candidates, request, label, self._ensure_key(public_key))[2]

    def _rentable(self, request: Request) -> list:
        """Where ``request`` can be rented now (one node, or a group's), checked first: one line when not."""
        self.validate(request)
        if request.quote is None and not request.gpu and not request.offer:
            raise UsageError("say which GPU to rent on Lambda (--gpu, e.g. A10) or which instance type (--offer)")
        candidates = self._candidates(request)
        if not candidates:
            raise NoCapacity(f"Lambda Cloud has no capacity for {wanted(request)} in any region right now")
        return candidates

    def launch_one(self, candidates: list[Offer], request: Request, label: str, key: str,
                   leader: bool = False) -> tuple[Offer, str, Remote]:
        """(offer, region, the instance): the cheapest candidate launched in a region with capacity
        (``send_launch``); after an answer that may hide a launch, looked for by its label, never
        launched blind again."""
        try:
            offer, region, answer = self.send_launch(candidates, request, label, key, leader)
        except LostLaunch as lost:
            return lost.offer, lost.region, look_for(self, label, lost.error)
        return offer, region, self._launched(answer, offer, label, request)

    def send_launch(self, candidates: list[Offer], request: Request, name: str, key: str,
                    leader: bool = False) -> tuple[Offer, str, Any]:
        """(offer, region, the launch's answer): the candidates in each of their regions with capacity,
        in turn, until one launches an instance named ``name`` with ``request``'s volumes; a region
        whose capacity was taken meanwhile gives way to the next. A group's node launches only as the
        group's type in the group's region (``groups.chosen``), except its first (``leader``), which
        tries the group's choice first, then any other, since nothing of the group is made yet.
        Raises ``LostLaunch`` after an answer that may hide a launch."""
        group = groups.chosen(request.group)
        alone = not leader and group is not None  # one node of a group that exists: its type, its region
        wanted_region = volumes.region(request, self.settings.get("region") or (group[1] if alone else None))
        queue = [(o, r) for o in candidates for r in o.raw["regions"] if not wanted_region or r == wanted_region]
        if alone:
            queue = [(o, r) for o, r in queue if o.offer_id == group[0]]
        elif group is not None:
            queue.sort(key=lambda q: (q[0].offer_id, q[1]) != group)  # stable: the group's choice first
        where = f"as instance type {group[0]} in region {group[1]}, the group's" if alone else \
            f"in region {wanted_region}" if wanted_region else "in any region"
        if not queue:
            raise NoCapacity(f"Lambda Cloud has no capacity for {asked(request)} {where}")
        while queue:
            offer, region = queue[0]
            body = launch_body(offer, region, request.image or self.settings.get("image"), name, key)
            body.update(volumes.launch_fields(request.mounts))
            try:
                return offer, region, self.api.launch(body)
            except ERRORS as e:
                error = e
            if error.code == NO_CAPACITY:
                # ``instance-operations/launch/insufficient-capacity``: that offer was taken meanwhile.
                queue.pop(0)  # taken meanwhile: the next region, else the next type
                continue
            if not isinstance(error, Transient) or error.status == 429:
                raise error  # a refusal, or the rate limit still refusing after ``api.launch``'s waits
            # A launch has no idempotency token, and an answer lost to a 5xx or a dropped connection may
            # hide a launch that happened.
            raise LostLaunch(offer, region, error)
        raise NoCapacity(f"Lambda Cloud lost its capacity for {asked(request)} {where} before the launch: try again")

    def create_nodes(self, requests: list[Request], labels: list[str], public_key: str) -> list[Remote]:
        """A group's nodes, one launch each (its own label, its own volumes), one type in one region;
        all or nothing (``groups.launch``)."""
        if len(requests) < 2:
            return super().create_nodes(requests, labels, public_key)
        candidates = self._rentable(requests[0])
        return groups.launch(self, requests, labels, self._ensure_key(public_key), candidates)

    def _launched(self, answer: Any, offer: Offer, label: str, request: Request) -> Remote:
        ids = answer.get("instance_ids") if isinstance(answer, dict) else None
        if not isinstance(ids, list) or len(ids) != 1 or not isinstance(ids[0], str):
            raise LambdaError(f"Lambda Cloud's launch answered without one instance id: {ids}")
        pid = ids[0]
        self.just_made.made(pid)
        try:
            remote = self.get(pid)
        except ERRORS as e:
            # The launch was answered with its id: it happened, whatever this read meets (a 429 on
            # every retry: "Requests to the API are generally limited to one request per second",
            # the description's preamble). Raising here would lose the id, and a caller that reads
            # the error as a refused launch launches again: two machines. The id is kept; the wait
            # for SSH reads it again.
            return Remote(provider_id=pid, label=label, status=Status.PENDING, price_hr=offer.price_hr,
                          gpu_name=offer.gpu_name, gpus=offer.gpus, detail=f"launched; not read yet ({e})"[:200])
        if not remote.label:  # not visible yet: what the launch asked for is what it is
            remote = replace(remote, label=label, price_hr=offer.price_hr, gpu_name=offer.gpu_name, gpus=offer.gpus)
        else:
            self._check_mounts(pid, remote, request)
        return remote

    def _check_mounts(self, pid: str, remote: Remote, request: Request) -> None:
        """The new instance mounts the filesystems its own request named (its ``file_system_names``,
        Lambda's OpenAPI description, Instance: "The names of the filesystems mounted to the
        instance"), or it is terminated and the launch fails: a node must never write another
        node's volume."""
        missing = volumes.not_mounted(remote.raw, request.mounts)
        if missing:
            groups.give_back(self, [pid])
            raise LambdaError(f"Lambda Cloud launched {pid} without the filesystems it was asked to "
                              f"mount ({', '.join(missing)}; it shows {remote.raw.get('file_system_names')}): "
                              "terminated")

    def get(self, provider_id: str) -> Remote:
        try:
            row = self.api.call("GET", f"/instances/{lambda_id(provider_id)}")
        except LambdaError as e:
            if e.status == 404 and e.code == NOT_FOUND:
                return self.just_made.unseen(provider_id) or \
                    Remote(provider_id=str(provider_id), label="", status=Status.GONE)
            raise
        if not isinstance(row, dict):
            raise LambdaError(f"Lambda Cloud's instance {provider_id} came back as {type(row).__name__}")
        self.just_made.seen(provider_id)
        return self._remote(row)

    def list(self) -> list[Remote]:
        rows = self.api.call("GET", "/instances")
        if not isinstance(rows, list):
            raise LambdaError(f"Lambda Cloud's instance listing came back without instances: {str(rows)[:200]}")
        remotes = [self._remote(r) for r in rows if isinstance(r, dict) and parse_label(r.get("name"))]
        return [r for r in remotes if r.status != Status.GONE]

    def _terminate(self, provider_id: str) -> None:
        self.api.call("POST", "/instance-operations/terminate", {"instance_ids": [lambda_id(provider_id)]})

    def destroy(self, provider_id: str) -> None:
        remote = self.get(provider_id)
        if remote.status == Status.GONE and not remote.preempted:
            return
        try:
            self._terminate(provider_id)
        except ERRORS:
            if self.get(provider_id).status != Status.GONE:
                raise
            return
        deadline = time.monotonic() + self.number("destroy_timeout", 180)
        while (status := self.get(provider_id).status) != Status.GONE:
            if time.monotonic() >= deadline:
                raise ProviderError(f"Lambda Cloud accepted the terminate of instance {provider_id} but still "
                                    f"shows it {status.value}: it may still bill, check the Lambda console")
            time.sleep(self.poll_seconds)

    def _remote(self, row: dict) -> Remote:
        word, provider_id = row.get("status"), str(row.get("id"))
        status, detail = STATES.get(word, Status.PENDING), str(word or "")
        health = self.unhealthy.judge(provider_id, word == "unhealthy")
        if health is not None:
            status, detail = health
        return remote_from(row, status, detail, self.ssh_user)

    # -- HasVolumes: filesystems (``volumes``) -----------------------------------------------
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        region = where or self.settings.get("region") or volumes.default_region(instance_types(self.api))
        return volumes.create(self.api, name, size_gb, region)

    def list_volumes(self) -> list[Volume]:
        return volumes.list_all(self.api)

    def delete_volume(self, volume: Volume) -> None:
        volumes.delete(self.api, volume)

    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        return volumes.reaches(offer, volume)

    def mount_steps(self, mounts) -> list:
        return volumes.mount_steps(mounts)

    # -- groups: one region --------------------------------------------------------------
    def open_group(self, group: str, request: Request) -> None:
        """One instance type in one region for every node of the group (``groups.choose``; in the
        region the settings name, where they name one)."""
        groups.choose(group, self._candidates(request), wanted(request), self.settings.get("region"))

    def close_group(self, group: str) -> None:
        groups.forget(group)

    # -- the account's SSH key -----------------------------------------------------------
    def _ensure_key(self, public_key: str) -> str:
        return keys.ensure(self.api, public_key)

    def account_key(self, public_key: str) -> str:
        held = keys.held(self.api, public_key)
        if held:
            return f"held by the Lambda account as SSH key {held!r}"
        return f"not in the Lambda account yet: the first `orch up` adds it as SSH key {keys.key_name(public_key)!r}"


def launch_body(offer: Offer, region: str, image: str | None, label: str, key: str) -> dict:
    """The launch of one instance of ``offer`` in ``region`` (Lambda's InstanceLaunchRequest, v1.10.0:
    no ``quantity``, so one launch makes one instance)."""
    body: dict[str, Any] = {"region_name": region, "instance_type_name": offer.offer_id, "ssh_key_names": [key],
                            "file_system_names": [], "name": label}
    if image:
        body["image"] = {"id": image} if re.fullmatch(r"[0-9a-f]{32}", image) else {"family": image}
    return body


def look_for(provider: LambdaProvider, label: str, error: ProviderError) -> Remote:
    """After a launch whose answer was lost: the instance by its name, looked for
    ``launch_lookup_seconds`` (a new instance may be missing from the listing for a while, as
    RunPod's are). No second launch is sent; reconcile (every reaper pass) adopts one that shows later."""
    window = provider.number("launch_lookup_seconds", LAUNCH_LOOKUP_SECONDS)
    found, failed = provider.find_within(label, window)
    if found:
        provider.just_made.made(found.provider_id)
        return found
    if failed is not None:
        raise ProviderError(f"Lambda Cloud's launch of {label} failed ({error}), and the listing that would "
                            f"show whether it happened anyway failed too ({failed}): orch sends no second launch; "
                            "the next reaper pass (or `orch reconcile`) adopts it should it show") from None
    raise ProviderError(f"Lambda Cloud's launch of {label} failed ({error}), and no instance of that name showed "
                        f"within {window:g} s. A launch can happen though its answer is lost: orch sends no second "
                        "launch; the next reaper pass (or `orch reconcile`) adopts it should it show") from None
