"""``LambdaProvider``: the verbs over Lambda's API, and the launch loop (regions in turn, 429s waited
out, an answer lost to a 5xx looked for, never launched blind again)."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

from orchestrator.errors import NoCapacity, ProviderError, UsageError
from orchestrator.provider import Capabilities, Offer, Provider, Remote, RentsGroups, Request, Status, parse_label
from orchestrator.provider.grace import JustMade
from orchestrator.provider.http import Transient
from providers.lambda_cloud import groups, keys
from providers.lambda_cloud.api import ERRORS, NO_CAPACITY, NOT_FOUND, LambdaError, Session, api_key, lambda_id
from providers.lambda_cloud.health import UNHEALTHY_GRACE_S, Unhealthy
from providers.lambda_cloud.instances import STATES, remote_from
from providers.lambda_cloud.offers import asked, instance_types, matching, wanted

# A new id that GET /instances/{id} does not know yet is pending for two minutes, not gone (the grace
# EC2's eventual consistency gets).
VISIBILITY_GRACE_S = 120.0
LAUNCH_LOOKUP_SECONDS = 60.0  # how long a launch whose answer was lost is looked for (``look_for``)


class LambdaProvider(Provider, RentsGroups):
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
    numeric_settings = {"retries": 1, "http_timeout": 0.1, "launch_interval": 0, "poll_seconds": 0,
                        "destroy_timeout": 0, "launch_lookup_seconds": 0, "unhealthy_grace": 0}

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
        self.validate(request)
        if request.quote is None and not request.gpu and not request.offer:
            raise UsageError("say which GPU to rent on Lambda (--gpu, e.g. A10) or which instance type (--offer)")
        candidates = self._candidates(request)
        if not candidates:
            raise NoCapacity(f"Lambda Cloud has no capacity for {wanted(request)} in any region right now")
        return self._launch(candidates, request, label, self._ensure_key(public_key))

    def _launch(self, candidates: list[Offer], request: Request, label: str, key: str) -> Remote:
        """Launch the cheapest candidate in a region with capacity; a region whose capacity was taken
        meanwhile gives way to the next. After an answer that may hide a launch, look before retrying."""
        wanted_region = self.settings.get("region") or groups.region_of(request.group)
        queue = [(o, r) for o in candidates for r in o.raw["regions"] if not wanted_region or r == wanted_region]
        if not queue:
            raise NoCapacity(f"Lambda Cloud has no capacity for {asked(request)} in region {wanted_region}")
        attempts, failures = int(self.number("retries", 5)), 0
        while queue:
            offer, region = queue[0]
            try:
                body = launch_body(offer, region, request.image or self.settings.get("image"), label, key)
                answer = self.api.once("POST", "/instance-operations/launch", body)
                return self._launched(answer, offer, label)
            except ERRORS as e:
                error = e
            if error.code == NO_CAPACITY:
                # ``instance-operations/launch/insufficient-capacity``: that offer was taken meanwhile.
                queue.pop(0)  # taken meanwhile: the next region, else the next type
                continue
            if isinstance(error, Transient) and error.status == 429:
                # Requests are limited to about one a second, launches to one per 12 seconds (five a
                # minute): a 429 is waited out and asked again. The rate limiter refused the launch
                # itself, so nothing was made and a repeated launch makes no second machine.
                failures += 1
                if failures >= attempts:
                    raise error
                time.sleep(error.wait if error.wait >= 0 else self.number("launch_interval", 12))
                continue
            if not isinstance(error, Transient):
                raise error
            # A launch has no idempotency token, and an answer lost to a 5xx or a dropped connection may
            # hide a launch that happened: look, never launch blind again.
            return look_for(self, label, error)
        raise NoCapacity(f"every Lambda Cloud region with {asked(request)} lost its capacity before the launch: "
                         "try again")

    def _launched(self, answer: Any, offer: Offer, label: str) -> Remote:
        ids = answer.get("instance_ids") if isinstance(answer, dict) else None
        if not isinstance(ids, list) or len(ids) != 1:
            raise LambdaError(f"Lambda Cloud's launch answered without one instance id: {ids}")
        self.just_made.made(str(ids[0]))
        remote = self.get(str(ids[0]))
        if not remote.label:  # not visible yet: what the launch asked for is what it is
            remote = replace(remote, label=label, price_hr=offer.price_hr, gpu_name=offer.gpu_name, gpus=offer.gpus)
        return remote

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
        if word == "preempted":
            # Lambda took it back; orch reads it as gone, so the terminate goes too (idempotent): a
            # preempted instance that Lambda kept would otherwise bill unseen.
            try:
                self._terminate(provider_id)
            except ERRORS:
                pass  # already on its way out: the next look says so
        return remote_from(row, status, detail, self.ssh_user)

    # -- groups: one region --------------------------------------------------------------
    def open_group(self, group: str, request: Request) -> None:
        """One region for every node of the group (``groups.choose``); none to choose where the
        settings name the region."""
        if not self.settings.get("region"):
            groups.choose(group, self._candidates(request), wanted(request))

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
    """The launch of one ``offer`` in ``region`` (Lambda's InstanceLaunchRequest)."""
    body: dict[str, Any] = {"region_name": region, "instance_type_name": offer.offer_id, "ssh_key_names": [key],
                            "file_system_names": [], "quantity": 1, "name": label}
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
