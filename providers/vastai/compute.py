"""The Vast.ai provider's verbs, and the renting loop of its create (``api`` calls Vast,
``offers`` searches the marketplace, ``instances`` reads an instance row)."""

from __future__ import annotations

import time
from functools import cached_property
from typing import Any, Callable

from orchestrator.errors import AuthError, NoCapacity, ProviderError, UsageError
from orchestrator.provider import (Capabilities, Offer, Provider, Remote, Request, SelfEnding, Status, Stoppable,
                                   http, parse_label)
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.model import Volume
from providers.vastai import api, instances, self_stop, volumes
from providers.vastai.api import CREATE_TIMEOUT, MAX_WAIT, VastError
from providers.vastai.instances import vast_id
from providers.vastai.offers import bid, listed, search_arguments

DEFAULT_IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
# Create errors meaning "this offer was taken meanwhile": the next cheapest one may do. (Vast does
# not document the code of a create refused under cancel_unavail; any code is looked into by label.)
OFFER_TAKEN = {"no_such_ask", "resources_unavailable"}
MAX_OFFERS_TRIED = 3  # offers tried from one listing; then a fresh listing, without them
OFFER_LISTINGS = 3  # listings looked at before "every offer was taken" (concurrent ups race for the cheapest)


class OffersTaken(NoCapacity):
    """Every offer tried was rented by someone else first (or made an instance that would not run);
    ``last`` is what the last try met (an instance made and destroyed is named there)."""

    def __init__(self, message: str, last: ProviderError | None = None):
        super().__init__(message + (f" (last: {last})" if last else ""))
        self.last = last


class VastAIProvider(Provider, Stoppable, SelfEnding, HasVolumes):
    name = "vastai"
    volume_place = "machine"  # a local volume: only instances on its machine mount it (``volumes``)
    numeric_settings = {"max_price_hr": 0, "min_reliability": 0, "min_inet_down": 0, "min_cuda": 0, "spot_margin": 0,
                        "retries": 1, "http_timeout": 0.1, "create_timeout": 0.1, "poll_seconds": 0, "stop_timeout": 0,
                        "destroy_timeout": 0, "direct_ssh_grace": 0.1}
    other_settings = ("api_key", "image", "server_url")
    capabilities = Capabilities(spot=True, cpu_only=False, gpu=True)
    env_keys = ("VAST_API_KEY", "VAST_URL")
    credentials = "VAST_API_KEY, or api_key under [providers.vastai] in config.toml"
    # Marketplace instances sit on unrelated hosts with no private network between them. Neither
    # SkyPilot nor dstack runs multi-node there: SkyPilot's (github.com/skypilot-org/skypilot, sky/clouds/vast.py) lists
    # MULTI_NODE among its unsupported features ("the interconnection among nodes are non-trivial on
    # Vast"); dstack's VastAICompute (github.com/dstackai/dstack, src/dstack/_internal/core/backends/vastai/compute.py)
    # is no ComputeWithMultinodeSupport.
    groups_refused = ("its marketplace instances are on unrelated hosts with no private network between them "
                      "(Vast's overlay networks are another API, planned separately)")

    def configured(self) -> bool:
        return api.has_key(self.settings)

    @cached_property
    def _sdk(self):
        return api.connect(self.settings, self.number("http_timeout", 30))

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        return api.call(self._sdk, fn, what, attempts=int(self.number("retries", 5)))

    def offers(self, request: Request) -> list[Offer]:
        self.validate(request)
        args = volumes.on_machine(search_arguments(request, self.number, self.settings.get("max_price_hr")), request)
        return listed(self._call(lambda: self._sdk.search_offers(**args), "offer search"), request)

    # -- create ----------------------------------------------------------------------------
    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        instance_id = (self._rent_quote(request, label) if request.quote is not None
                       else self._rent_listed(request, label))
        # Before anyone waits for SSH: the key is what lets orch in.
        self._attach(instance_id, public_key)
        return self.get(instance_id)

    def _rent_quote(self, request: Request, label: str) -> str:
        """The offer a plan chose, rented as it was listed (its row holds the live minimum bid),
        without searching again. Taken meanwhile, it fails: whoever planned plans again."""
        quote = request.quote
        if quote.provider != self.name:
            raise UsageError(f"offer {quote.offer_id} is {quote.provider}'s, not {self.name}'s")
        if request.spot and quote.raw.get("min_bid") is None:
            raise NoCapacity(f"Vast.ai offer {quote.offer_id} was listed without its minimum bid: list it again")
        try:
            return self._rent([quote], request, label)
        except OffersTaken as e:
            raise OffersTaken(f"Vast.ai offer {quote.offer_id} was taken before it could be rented",
                              e.last) from None

    def _rent_listed(self, request: Request, label: str) -> str:
        """The cheapest offers listed now, a few at a time; when every one tried was taken, what is
        left, listed afresh (concurrent ups race for the cheapest)."""
        tried: set[str] = set()
        taken: OffersTaken | None = None
        for _ in range(OFFER_LISTINGS):
            candidates = [o for o in self.offers(request) if o.offer_id not in tried][:MAX_OFFERS_TRIED]
            if not candidates:
                raise taken or NoCapacity(_nothing_matches(request))
            tried.update(o.offer_id for o in candidates)
            try:
                return self._rent(candidates, request, label)
            except OffersTaken as e:  # another renter was quicker
                taken = e
        raise taken

    def _rent(self, candidates: list[Offer], request: Request, label: str) -> str:
        """Rent one of the offers: the id of an instance that will run. After ANY error, look for
        what the create may have made before trying again; what was made that will not run (a
        stopped instance, one waiting for its GPU, a crashed one) is destroyed, never left."""
        attempts, failures = int(self.number("retries", 5)), 0
        queue = list(candidates)
        error: ProviderError | None = None
        while queue:
            offer = queue[0]
            made, error = self._create_once(offer, request, label)
            if made is not None:
                landed = self.get(made)
                if landed.status in (Status.RUNNING, Status.PENDING):
                    return made
                error = self._unrunnable(offer, made, landed, error)
                queue.pop(0)
                continue
            if getattr(error, "code", None) in OFFER_TAKEN:  # not a failure of Vast's: the next offer
                queue.pop(0)
                continue
            failures += 1
            if failures >= attempts or not isinstance(error, http.Transient):
                raise error
            time.sleep(min(MAX_WAIT, error.wait) if error.wait >= 0 else http.backoff(failures, 0.5, MAX_WAIT))
        raise OffersTaken("every matching Vast.ai offer was taken before it could be rented; try again", error)

    def _create_once(self, offer: Offer, request: Request, label: str) -> tuple[str | None, ProviderError | None]:
        """One create on ``offer``: (the instance it made, if any, whatever it answered; its error)."""
        # cancel_unavail: without it an offer taken meanwhile makes a stopped instance, not an
        # error (the CLI's help for ``vastai create instance --cancel-unavail``: "Return error if
        # scheduling fails (rather than creating a stopped instance)").
        args: dict[str, Any] = dict(image=request.image or self.settings.get("image") or DEFAULT_IMAGE,
                                    disk=float(request.disk_gb), env=dict(request.env), label=label, ssh=True,
                                    direct=True, cancel_unavail=True, **volumes.create_args(request))
        if request.spot:
            # Always explicit: a create without a bid rents on-demand and does not say so
            # (vastai/api/instances.py ``build_create_instance_payload``: ``"price": null``).
            args["bid_price"] = bid(request, offer, self.number("spot_margin", 0.05))
        try:
            answer = api.slow(self._sdk, lambda: self._sdk.create_instance(int(offer.offer_id), **args), "create",
                              self.number("create_timeout", CREATE_TIMEOUT))
            if not isinstance(answer, dict) or not answer.get("new_contract"):
                raise VastError(f"Vast.ai create answered without an instance id: {answer}")
            return str(answer["new_contract"]), None
        except AuthError:
            raise
        except ProviderError as e:
            # An error answer that carries new_contract made that instance anyway (dstack's Vast
            # client, github.com/dstackai/dstack, src/dstack/_internal/core/backends/vastai/api_client.py
            # ``VastAICreateInstanceError``: "Vast.ai creates spot instances in the stopped state and
            # returns an error if the bid is insufficient").
            contract = getattr(e, "answer", {}).get("new_contract")
            if contract:
                return str(contract), e
            error = e
        # A create that answered an error may have rented, and bill, a machine anyway: the SDK
        # re-sends 429/502/503/504 on every method, ``PUT /asks/{id}/`` included (vastai/api/client.py
        # ``_RETRYABLE_STATUS``), and the re-sent create meets its own now-rented offer (404
        # ``no_such_ask``). So after any create error the instance is looked up by its label.
        try:
            found = self.find(label)
        except ProviderError as e:
            raise ProviderError(f"Vast.ai create of {label} failed ({error}), and the listing that would "
                                f"show whether it was created anyway failed too ({e}); check "
                                f"`vastai show instances` before retrying") from None
        return (found.provider_id if found else None), error

    def _unrunnable(self, offer: Offer, made: str, landed: Remote, error: ProviderError | None) -> NoCapacity:
        """Destroy what a create made that will not run; what to say of it (its id is in any error)."""
        state, why = landed.detail or landed.status.value, f"{error}; " if error else ""
        try:
            self.destroy(made)
        except ProviderError as e:
            raise ProviderError(f"{why}offer {offer.offer_id} gave instance {made}, which is {state}; destroying "
                                f"it failed ({e}): it still bills; run `vastai destroy instance {made} -y`") from None
        return NoCapacity(f"Vast.ai offer {offer.offer_id} made instance {made} {state} instead of running "
                          f"({why}destroyed it)")

    def _attach(self, instance_id: str, public_key: str) -> None:
        try:
            self._call(lambda: self._sdk.attach_ssh(int(instance_id), public_key.strip()), "SSH key attach")
        except ProviderError as e:
            # A machine nobody can log in to is only a bill: give it back.
            try:
                self.destroy(instance_id)
            except ProviderError as e2:
                raise ProviderError(f"attaching orch's SSH key to Vast.ai instance {instance_id} failed ({e}) "
                                    f"and destroying it failed too ({e2}): it still bills; run "
                                    f"`vastai destroy instance {instance_id} -y`") from None
            raise ProviderError(f"attaching orch's SSH key to Vast.ai instance {instance_id} failed ({e}); "
                                f"the instance was destroyed") from None

    # -- the other verbs -------------------------------------------------------------------
    def get(self, provider_id: str) -> Remote:
        row = self._call(lambda: self._sdk.show_instance(vast_id(provider_id)), "instance lookup")
        if row is None:
            return Remote(provider_id=str(provider_id), label="", status=Status.GONE)
        if not isinstance(row, dict):
            raise VastError(f"Vast.ai instance lookup answered {type(row).__name__}, not an instance")
        return self._remote(row)

    def list(self) -> list[Remote]:
        """The v1 listing, every page, keys checked: a failed listing is never an empty fleet (the
        SDK's ``show_instances`` turns one into ``[]``: vastai/api/instances.py
        ``data.get("instances") or []``)."""
        params: dict[str, Any] = {"select_filters": {}, "order_by": [{"col": "id", "dir": "asc"}], "limit": 25}
        remotes, seen = [], set()
        while True:
            page = self._call(lambda: self._sdk.show_instances_v1(dict(params)), "instance listing")
            rows = page.get("instances") if isinstance(page, dict) else None
            if not isinstance(rows, list):
                raise VastError(f"Vast.ai instance listing answered without instances: {str(page)[:200]}")
            remotes += [self._remote(r) for r in rows if isinstance(r, dict) and parse_label(r.get("label"))]
            token = page.get("next_token")
            if not token:
                return [r for r in remotes if r.status != Status.GONE]
            if token in seen:
                raise VastError(f"Vast.ai instance listing repeated its page token {token!r}")
            seen.add(token)
            params["after_token"] = token

    def stop(self, provider_id: str) -> None:
        self._call(lambda: self._sdk.stop_instance(vast_id(provider_id)), f"stop of instance {provider_id}")
        self._await(provider_id, {Status.STOPPED, Status.GONE}, self.number("stop_timeout", 120), "stop")

    def start(self, provider_id: str) -> Remote:
        """Ask for the start: Vast accepts it and the instance then waits (scheduling) until its
        host frees the GPU, possibly for ever (Vast.ai docs, CLI reference "start instance");
        stopping again is how to give up. The waiting, and giving up, is the caller's."""
        self._call(lambda: self._sdk.start_instance(vast_id(provider_id)), f"start of instance {provider_id}")
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        if self.get(provider_id).status == Status.GONE:
            return
        try:
            self._call(lambda: self._sdk.destroy_instance(vast_id(provider_id)), f"destroy of instance {provider_id}")
        except (VastError, http.Transient) as e:
            # A destroy that raced another one: only a lookup says whether it is gone.
            if self.get(provider_id).status != Status.GONE:
                raise e from None
            return
        self._await(provider_id, {Status.GONE}, self.number("destroy_timeout", 120), "destroy")

    def _await(self, provider_id: str, wanted: set[Status], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.get(provider_id).status
            if status in wanted:
                return
            if time.monotonic() >= deadline:
                raise ProviderError(f"Vast.ai accepted the {what} of instance {provider_id} but still shows it "
                                    f"{status.value} after {timeout:.0f} s")
            time.sleep(self.number("poll_seconds", 2))

    def _remote(self, row: dict) -> Remote:
        return instances.remote(row, self.ssh_user, self.number("direct_ssh_grace", 3))

    def self_stop_command(self, provider_id: str, destroy: bool) -> str:
        """The instance ends itself with its own key (``self_stop``): any instance, so no id."""
        return self_stop.command(destroy)

    # -- HasVolumes: local volumes (``volumes``) ---------------------------------------------
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        return volumes.create(self._sdk, self._call, lambda fn, what: api.once(self._sdk, fn, what), name, size_gb,
                              where)

    def list_volumes(self) -> list[Volume]:
        return volumes.list_all(self._sdk, self._call)

    def delete_volume(self, volume: Volume) -> None:
        volumes.delete(self._sdk, self._call, volume)

    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        return volumes.reaches(offer, volume)


def _nothing_matches(request: Request) -> str:
    if request.offer:
        return f"offer {request.offer} is no longer available"
    return f"no Vast.ai offer matches {request.gpus}x {request.gpu or 'any GPU'} with {request.disk_gb} GB disk"
