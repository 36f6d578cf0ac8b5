"""Vast.ai through its ``vastai`` SDK (imported only when a verb runs).

Settings (``[providers.vastai]`` in config.toml), all optional:
``api_key`` (else ``VAST_API_KEY``, else the SDK's own key files), ``server_url`` (else ``VAST_URL``),
``image``, ``ssh_user`` ("root"), ``max_price_hr`` (on-demand $/hr cap; the minimum bid for spot),
``min_reliability`` (0.95), ``min_inet_down`` (200 Mbps), ``min_cuda`` (12.1), ``spot_margin``
(0.05 over the live minimum bid), ``retries`` (5), ``http_timeout`` (30 s), ``create_timeout``
(120 s, the SDK's own: a create is slow), ``poll_seconds`` (2), ``stop_timeout`` /
``destroy_timeout`` (120 s), ``direct_ssh_grace`` (3 s: how long the direct SSH route may take to
say its banner before Vast's SSH proxy is tried).

Vast's traps, each handled here: failures arrive as HTTP 200 with ``success: false``; the SDK's
``show_instances`` turns a failed listing into ``[]``; a create that answered an error may have
rented (and bill) a machine anyway, and an error answer can carry the id of an instance it made;
a create without a bid silently rents on-demand; a create without ``cancel_unavail`` on an offer
just taken makes a stopped instance; a start is accepted and then waits (*scheduling*) until the
host frees the GPU, possibly for ever; the direct SSH route is often firewalled (the proxy works).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import replace
from functools import cached_property
from typing import Any, Callable

from orchestrator.errors import AuthError, NoCapacity, ProviderError, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import (Capabilities, Endpoint, Offer, Progress, Provider, Remote, Request, Status,
                                   bid_with_margin, parse_label, stopped_rate, tcp_open)
from orchestrator.retry import retry

DEFAULT_IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"
# A Retry-After longer than this (a search quota resets at midnight UTC) is not waited out.
MAX_WAIT = 30.0
# Create errors meaning "this offer was taken meanwhile": the next cheapest one may do. (Vast does
# not document the code of a create refused under cancel_unavail; any code is looked into by label.)
OFFER_TAKEN = {"no_such_ask", "resources_unavailable"}
MAX_OFFERS_TRIED = 3  # offers tried from one listing; then a fresh listing, without them
OFFER_LISTINGS = 3  # listings looked at before "every offer was taken" (concurrent ups race for the cheapest)
# Vast prices storage per month of 720 hours: the OpenAPI show_instance example has
# storage_cost × GB / 720 = dph_total - dph_base (orch's own month is 730 h).
VAST_HOURS_PER_MONTH = 720.0
# The SDK's own timeout (vastai/api/client.py _DEFAULT_TIMEOUT_SECONDS), "conservative enough for
# slow operations like ... instance creation": a create cut short at 30 s may still have rented.
CREATE_TIMEOUT = 120.0
# actual_status values of an instance that will not run by itself and may bill as running (docs
# "show instance"; the SDK's SKILL.md: "If actual_status becomes exited, unknown, or offline it will
# never reach running"; frozen: "paused with memory preserved. GPU charges apply").
_BROKEN = {"exited": "exited: the container's process died",
           "offline": "offline: its host dropped off Vast.ai",
           "unknown": "unknown: no heartbeat from its host",
           "frozen": "frozen: paused with its memory kept, GPU charges apply"}


class VastError(ProviderError):
    """A refusal from Vast, with its machine-readable ``error`` code when it gave one."""

    def __init__(self, message: str, code: str | None = None, status: int | None = None, answer: dict | None = None):
        super().__init__(message)
        self.code, self.status, self.answer = code, status, answer or {}


class Transient(VastError):
    """Worth another try: 429, 5xx, a dropped connection. ``wait`` < 0 means "back off"."""

    def __init__(self, message: str, wait: float = -1.0, **kw):
        super().__init__(message, **kw)
        self.wait = wait


def vast_gpu_name(name: str) -> str:
    """'NVIDIA GeForce RTX 4090', 'RTX_4090' or '4090' -> Vast's 'RTX 4090'."""
    n = " ".join(name.replace("_", " ").split())
    n = re.sub(r"^(nvidia\s+)?(geforce\s+)?", "", n, flags=re.I)
    if re.fullmatch(r"\d{3,4}(\s+ti)?", n, flags=re.I):
        n = ("GTX " if re.match(r"1\d{3}\b", n) else "RTX ") + n
    n = re.sub(r"^(rtx|gtx)\b", lambda m: m[1].upper(), n, flags=re.I)
    return re.sub(r"\bti$", "Ti", n, flags=re.I)


class OffersTaken(NoCapacity):
    """Every offer tried was rented by someone else first (or made an instance that would not run)."""


class VastAIProvider(Provider):
    name = "vastai"
    numeric_settings = {"max_price_hr": 0, "min_reliability": 0, "min_inet_down": 0, "min_cuda": 0, "spot_margin": 0,
                        "retries": 1, "http_timeout": 0.1, "create_timeout": 0.1, "poll_seconds": 0, "stop_timeout": 0,
                        "destroy_timeout": 0, "direct_ssh_grace": 0.1}
    capabilities = Capabilities(stop=True, spot=True, cpu_only=False, gpu=True, self_stop=True,
                                self_destroy=True)
    env_keys = ("VAST_API_KEY", "VAST_URL")
    credentials = "VAST_API_KEY, or api_key under [providers.vastai] in config.toml"
    # Marketplace instances sit on unrelated hosts with no private network between them (neither
    # SkyPilot nor dstack runs multi-node there; shared/reference/multinode.md).
    groups_refused = ("its marketplace instances are on unrelated hosts with no private network between them: "
                      "use aws, lambda or local")



    def configured(self) -> bool:
        # The SDK's own key files, checked without importing the SDK.
        return bool(os.environ.get("VAST_API_KEY") or self.settings.get("api_key") or any(
            os.path.exists(os.path.expanduser(p)) for p in ("~/.config/vastai/vast_api_key", "~/.vast_api_key")))

    @cached_property
    def _sdk(self):
        from vastai import VastAI

        key = os.environ.get("VAST_API_KEY") or self.settings.get("api_key") or None  # env beats config.toml
        # The SDK reads VAST_URL once, at import: pass it so import order does not matter.
        url = self.settings.get("server_url") or os.environ.get("VAST_URL") or None
        try:
            # retry=1: one attempt per SDK call, so its retries never multiply with ours.
            sdk = VastAI(api_key=key, server_url=url, retry=1, raw=True, quiet=True)
        except RuntimeError:
            raise AuthError("no Vast.ai API key: set api_key under [providers.vastai] in config.toml, "
                            "or VAST_API_KEY, or run `vastai set api-key`") from None
        sdk.client.timeout = self.number("http_timeout", 30)
        return sdk

    # -- calling Vast ----------------------------------------------------------------------
    def _once(self, fn: Callable[[], Any], what: str) -> Any:
        """One SDK call, its failures turned into orch's errors and ``success: false`` checked."""
        import requests

        try:
            answer = fn()
        except requests.HTTPError as e:
            raise _http_error(e.response, what) from None
        except (requests.ConnectionError, requests.Timeout) as e:
            raise Transient(f"cannot reach Vast.ai at {self._sdk.client.server_url} ({what}): {e}") from None
        except (requests.JSONDecodeError, KeyError) as e:  # the SDK indexes answers without looking
            raise VastError(f"Vast.ai answered {what} with something unexpected ({e!r})") from None
        if isinstance(answer, dict) and answer.get("success") is False:
            code, msg = answer.get("error"), answer.get("msg") or answer.get("message")
            raise VastError(f"Vast.ai refused {what}: {msg or code or answer}", code=code, answer=answer)
        return answer

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        return retry(lambda: self._once(fn, what), _delay_for, attempts=int(self.number("retries", 5)),
                     cap=MAX_WAIT)

    # -- offers ----------------------------------------------------------------------------
    def offers(self, request: Request) -> list[Offer]:
        self.validate(request)
        storage = float(request.disk_gb)
        if request.offer:
            try:
                query = {"id": {"eq": int(request.offer)}, "rentable": {"eq": True}, "rented": {"eq": False}}
            except ValueError:
                raise UsageError(f"a Vast.ai offer id is a number, not {request.offer!r}") from None
            rows = self._call(lambda: self._sdk.search_offers(query=query, no_default=True, storage=storage),
                              "offer search")
        else:
            kind = "bid" if request.spot else "on-demand"
            rows = self._call(lambda: self._sdk.search_offers(query=self._query(request), type=kind,
                                                              order="dph_total", storage=storage),
                              "offer search")
        if not isinstance(rows, list):
            raise VastError(f"Vast.ai offer search answered {type(rows).__name__}, not a list")
        found = [_offer(row, storage) for row in rows]
        found.sort(key=lambda o: (o.spot_hr if request.spot else o.price_hr) or 0.0)
        return found

    def _query(self, request: Request) -> dict:
        """Filters as typed JSON: the SDK's query strings would send numbers as strings."""
        q: dict[str, Any] = {
            "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
            "rented": {"eq": False}, "num_gpus": {"eq": int(request.gpus)},
            "disk_space": {"gte": float(request.disk_gb)},
            "reliability": {"gte": self.number("min_reliability", 0.95)},
            "direct_port_count": {"gte": 1},
            "inet_down": {"gte": self.number("min_inet_down", 200)},
            "cuda_max_good": {"gte": self.number("min_cuda", 12.1)},
        }
        if request.gpu:
            q["gpu_name"] = {"eq": vast_gpu_name(request.gpu)}
        cap = self.settings.get("max_price_hr")
        if cap is not None:
            q["min_bid" if request.spot else "dph_total"] = {"lte": float(cap)}
        return q

    # -- the verbs -------------------------------------------------------------------------
    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        tried: set[str] = set()
        taken: OffersTaken | None = None
        for _ in range(OFFER_LISTINGS):
            candidates = [o for o in self.offers(request) if o.offer_id not in tried][:MAX_OFFERS_TRIED]
            if not candidates and taken is not None:
                raise taken  # what the last try met (an instance made and destroyed is named there)
            if not candidates:
                what = f"offer {request.offer} is no longer available" if request.offer else \
                    f"no Vast.ai offer matches {request.gpus}x {request.gpu or 'any GPU'} with {request.disk_gb} GB disk"
                raise NoCapacity(what)
            tried.update(o.offer_id for o in candidates)
            try:
                instance_id = self._rent(candidates, request, label)
                break
            except OffersTaken as e:  # another renter was quicker: what is left, listed afresh
                taken = e
        else:
            raise taken
        # Before anyone waits for SSH: the key is what lets orch in.
        self._attach(instance_id, public_key)
        return self.get(instance_id)

    def _rent(self, candidates: list[Offer], request: Request, label: str) -> str:
        """Rent one of the offers: the id of an instance that will run. After ANY error, look for
        what the create may have made before trying again; what was made that will not run (a
        stopped instance, one waiting for its GPU, a crashed one) is destroyed, never left."""
        image = request.image or self.settings.get("image") or DEFAULT_IMAGE
        attempts, failures = int(self.number("retries", 5)), 0
        queue = list(candidates)
        error: ProviderError | None = None
        while queue:
            offer = queue[0]
            # cancel_unavail: without it an offer taken meanwhile makes a stopped instance, not an
            # error (the CLI's help for --cancel-unavail).
            args: dict[str, Any] = dict(image=image, disk=float(request.disk_gb), env=dict(request.env),
                                        label=label, ssh=True, direct=True, cancel_unavail=True)
            if request.spot:
                # Always explicit: a create without a bid rents on-demand and does not say so.
                args["bid_price"] = self._bid(request, offer)
            made: str | None = None
            try:
                answer = self._slow(lambda: self._sdk.create_instance(int(offer.offer_id), **args), "create")
                if not isinstance(answer, dict) or not answer.get("new_contract"):
                    raise VastError(f"Vast.ai create answered without an instance id: {answer}")
                made, error = str(answer["new_contract"]), None
            except AuthError:
                raise
            except ProviderError as e:
                error = e
                # An error answer that carries new_contract made that instance anyway (dstack's
                # Vast client: a bid too low creates it stopped and answers an error).
                contract = getattr(e, "answer", {}).get("new_contract")
                made = str(contract) if contract else None
            if made is None:
                # A 502 (and the SDK's own re-send, 404 no_such_ask) can hide a machine that bills.
                try:
                    found = self.find(label)
                except ProviderError as e:
                    raise ProviderError(f"Vast.ai create of {label} failed ({error}), and the listing that would "
                                        f"show whether it was created anyway failed too ({e}); check "
                                        f"`vastai show instances` before retrying") from None
                made = found.provider_id if found else None
            if made is not None:
                landed = self.get(made)
                if landed.status in (Status.RUNNING, Status.PENDING):
                    return made
                why = f"{error}; " if error else ""
                self._discard(made, f"{why}offer {offer.offer_id} gave instance {made}, which is "
                                    f"{landed.detail or landed.status.value}")
                error = NoCapacity(f"Vast.ai offer {offer.offer_id} made instance {made} "
                                   f"{landed.detail or landed.status.value} instead of running ({why.rstrip('; ')}"
                                   f"{'; ' if why else ''}destroyed it)")
                queue.pop(0)
                continue
            if getattr(error, "code", None) in OFFER_TAKEN:  # not a failure of Vast's: the next offer
                queue.pop(0)
                continue
            failures += 1
            if failures >= attempts:
                raise error
            if isinstance(error, Transient):
                time.sleep(min(MAX_WAIT, error.wait if error.wait >= 0 else 0.5 * 2 ** (failures - 1)))
            else:
                raise error
        raise OffersTaken("every matching Vast.ai offer was taken before it could be rented; try again"
                          + (f" (last: {error})" if error else ""))

    def _discard(self, instance_id: str, why: str) -> None:
        """Destroy an instance a create made that will not run; its id is in any error."""
        try:
            self.destroy(instance_id)
        except ProviderError as e:
            raise ProviderError(f"{why}; destroying it failed ({e}): it still bills; run "
                                f"`vastai destroy instance {instance_id} -y`") from None

    def _slow(self, fn: Callable[[], Any], what: str) -> Any:
        """One call that may take long at Vast (a create), under ``create_timeout``."""
        client = self._sdk.client
        before = client.timeout
        client.timeout = self.number("create_timeout", CREATE_TIMEOUT)
        try:
            return self._once(fn, what)
        finally:
            client.timeout = before

    def _bid(self, request: Request, offer: Offer) -> float:
        live = float(offer.raw["min_bid"])
        if request.bid is not None:
            # orch's --bid is per GPU on every provider; Vast's bid_price is for the whole machine.
            wanted = float(request.bid) * max(offer.gpus, 1)
            if wanted < live:
                raise UsageError(f"bid {request.bid:.4f} $/h per GPU is below offer {offer.offer_id}'s live minimum "
                                 f"{live / max(offer.gpus, 1):.4f} $/h per GPU: the instance would start outbid (stopped)")
            return wanted
        per_gpu = bid_with_margin(live / max(offer.gpus, 1), self.number("spot_margin", 0.05))
        return round(per_gpu * max(offer.gpus, 1), 6)

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

    def get(self, provider_id: str) -> Remote:
        row = self._call(lambda: self._sdk.show_instance(_vast_id(provider_id)), "instance lookup")
        if row is None:
            return Remote(provider_id=str(provider_id), label="", status=Status.GONE)
        if not isinstance(row, dict):
            raise VastError(f"Vast.ai instance lookup answered {type(row).__name__}, not an instance")
        return self._remote(row)

    def list(self) -> list[Remote]:
        """The v1 listing, every page, keys checked: a failed listing is never an empty fleet."""
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
        self._call(lambda: self._sdk.stop_instance(_vast_id(provider_id)), f"stop of instance {provider_id}")
        self._await(provider_id, {Status.STOPPED, Status.GONE}, self.number("stop_timeout", 120), "stop")

    def start(self, provider_id: str) -> Remote:
        """Ask for the start: Vast accepts it and the instance then waits (scheduling) until its
        host frees the GPU, possibly for ever. The waiting, and giving up, is the caller's."""
        self._call(lambda: self._sdk.start_instance(_vast_id(provider_id)), f"start of instance {provider_id}")
        return self.get(provider_id)

    def destroy(self, provider_id: str) -> None:
        if self.get(provider_id).status == Status.GONE:
            return
        try:
            self._call(lambda: self._sdk.destroy_instance(_vast_id(provider_id)),
                       f"destroy of instance {provider_id}")
        except VastError as e:
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

    def reachable(self, remote: Remote, progress: Progress | None = None) -> Remote | None:
        """The direct route when it says its SSH banner within ``direct_ssh_grace``, else Vast's SSH
        proxy (the direct port is often firewalled: it accepts and never speaks). Nothing is kept
        here: the ledger keeps the route that answered, and orch asks again when it stops answering."""
        if remote.status != Status.RUNNING:
            return None
        direct, proxy = _direct(remote.raw, self.ssh_user), _proxy(remote.raw, self.ssh_user)
        if direct and tcp_open(direct, timeout=self.number("direct_ssh_grace", 3)):
            return replace(remote, endpoint=direct)
        if proxy and tcp_open(proxy):
            if progress and direct:
                progress("the direct SSH route does not answer: using Vast.ai's SSH proxy")
            return replace(remote, endpoint=proxy)
        return None

    def _remote(self, row: dict) -> Remote:
        status, detail = _status(row)
        provider_id = str(row["id"])
        routes = []
        if status == Status.RUNNING:
            routes = [r for r in (_direct(row, self.ssh_user), _proxy(row, self.ssh_user)) if r]
        return Remote(
            provider_id=provider_id, label=row.get("label") or "", status=status, detail=detail,
            endpoint=routes[0] if routes else None, routes=routes,
            price_hr=row.get("dph_total"), stopped_price_hr=_storage_hr(row),
            gpu_name=row.get("gpu_name"), gpus=int(row.get("num_gpus") or 0), spot=bool(row.get("is_bid")),
            # The user's environment (tokens, perhaps) stays out of anything orch might record.
            raw={k: v for k, v in row.items() if k not in ("extra_env", "onstart")},
        )

    # -- inside the instance ---------------------------------------------------------------
    def self_stop_command(self, provider_id: str, destroy: bool) -> str:
        """Shell that, run on the instance, stops (or destroys) it with the container's own key.

        The key is read from the environment inside Python, never put on a command line. SSH
        sessions on Vast do not see the container's variables, so PID 1's are the fallback.
        (The CLI form, ``vastai destroy instance $CONTAINER_ID --api-key ...``, needs ``-y``:
        without it, and with no terminal, it prints "Aborted." and destroys nothing.)
        """
        method, body = ("DELETE", "{}") if destroy else ("PUT", '{"state": "stopped"}')
        code = _SELF_STOP.replace("@METHOD@", method).replace("@BODY@", body)
        return f"python3 -c {shlex.quote(code)}"


_SELF_STOP = """\
import json, os, sys, time, urllib.error, urllib.request
env = dict(os.environ)
if not env.get("CONTAINER_API_KEY"):
    try:
        with open("/proc/1/environ", "rb") as f:
            for item in f.read().split(b"\\0"):
                k, _, v = item.decode(errors="replace").partition("=")
                env.setdefault(k, v)
    except OSError:
        pass
iid, key = env.get("CONTAINER_ID"), env.get("CONTAINER_API_KEY")
if not iid or not key:
    sys.exit("orch: CONTAINER_ID or CONTAINER_API_KEY missing: cannot reach the Vast.ai API")
url = env.get("VAST_URL", "https://console.vast.ai").rstrip("/") + "/api/v0/instances/%s/" % iid
for attempt in range(6):
    req = urllib.request.Request(url, data=json.dumps(@BODY@).encode(), method="@METHOD@",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.load(r)
        if answer.get("success") is False:
            sys.exit("orch: Vast.ai refused: %s" % answer)
        sys.exit(0)
    except urllib.error.HTTPError as e:
        if e.code != 429 and e.code < 500:
            sys.exit("orch: Vast.ai answered HTTP %d" % e.code)
    except (OSError, ValueError):
        pass
    time.sleep(2 ** attempt)
sys.exit("orch: Vast.ai did not answer")
"""


def _delay_for(exc: BaseException) -> float | None:
    return exc.wait if isinstance(exc, Transient) else None


def _http_error(r, what: str) -> VastError:
    status = r.status_code
    try:
        body = r.json()
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    code = body.get("error")
    detail = body.get("msg") or body.get("message") or code or r.text.strip()[:200]
    if status in (401, 403):
        return AuthError(f"Vast.ai rejected the API key ({what}: HTTP {status}: {detail}); check api_key "
                         f"under [providers.vastai] or VAST_API_KEY")
    if status == 429:
        try:
            wait = float(r.headers["Retry-After"])
        except (KeyError, TypeError, ValueError):
            wait = -1.0
        if wait > MAX_WAIT or (code == "search_quota_exceeded" and wait < 0):
            return VastError(f"Vast.ai rate limit on {what} ({detail}); try again later", code=code, status=429)
        return Transient(f"Vast.ai rate limit on {what} (HTTP 429: {detail})", wait=wait, code=code, status=429)
    if status >= 500:
        return Transient(f"Vast.ai server error on {what} (HTTP {status}: {detail})", code=code, status=status,
                         answer=body)
    return VastError(f"Vast.ai refused {what} (HTTP {status}: {detail})", code=code, status=status, answer=body)


def _vast_id(provider_id: str) -> int:
    try:
        return int(provider_id)
    except (TypeError, ValueError):
        raise ProviderError(f"{provider_id!r} is not a Vast.ai instance id") from None


def _offer(row: dict, disk_gb: float) -> Offer:
    per_gb = row.get("storage_cost")
    disk_hr = _number(row.get("storage_total_cost"))
    if disk_hr is None:
        disk_hr = stopped_rate(disk_gb, per_gb or 0.0, VAST_HOURS_PER_MONTH)
    min_bid = row.get("min_bid")
    return Offer(
        provider="vastai", offer_id=str(row["id"]), gpu_name=row.get("gpu_name") or "?",
        gpus=int(row.get("num_gpus") or 0), vram_gb=round((row.get("gpu_ram") or 0) / 1024, 1),
        price_hr=row.get("dph_total"),
        # min_bid leaves the disk out; dph_total has it (for the allocated storage asked).
        spot_hr=round(min_bid + disk_hr, 6) if min_bid is not None else None,
        disk_gb_month=per_gb, reliability=row.get("reliability"), location=row.get("geolocation"),
        # Stopped, the disk alone bills, over Vast's 720-hour month.
        stopped_hr=round(disk_hr, 6),
        min_bid_per_gpu=float(min_bid) / max(int(row.get("num_gpus") or 1), 1) if min_bid is not None else None, raw=row,
    )


def _status(row: dict) -> tuple[Status, str]:
    """Vast's three status fields as one ``Status`` and the word for it (docs "show instance"):
    ``actual_status`` the container, ``intended_status`` what was asked for, ``cur_state`` the
    machine contract (``unloaded`` once destroyed)."""
    actual, intended, contract = row.get("actual_status"), row.get("intended_status"), row.get("cur_state")
    if contract == "unloaded":
        return Status.GONE, "unloaded"
    if intended == "stopped":
        # Stopped by someone, or outbid (dstack: cur_state, intended_status and next_state all
        # stopped), whatever the container reads (SkyPilot takes exited for stopped too).
        if actual == "running":
            return Status.PENDING, "stopping"
        return Status.STOPPED, actual or "stopped"
    if actual in _BROKEN or intended == "frozen":
        return Status.BROKEN, _BROKEN.get(actual, _BROKEN["frozen"])
    if actual == "running":
        return Status.RUNNING, "running"
    if actual == "scheduling" or (contract == "stopped" and actual in (None, "stopped", "created")):
        # A start accepted and no machine allocated yet: it waits for its host to free the GPU
        # (docs "vastai start instance": the "scheduling" state).
        return Status.SCHEDULING, "scheduling: waits for its host to free a GPU"
    return Status.PENDING, actual or "provisioning"  # created, loading, rebooting, or null


def _storage_hr(row: dict) -> float | None:
    """What the instance bills stopped: its own storage_total_cost where given, else its disk over
    Vast's 720-hour month."""
    given = _number(row.get("storage_total_cost"))
    if given is not None:
        return given
    disk, per_gb = _number(row.get("disk_space")), _number(row.get("storage_cost"))
    return stopped_rate(disk, per_gb, VAST_HOURS_PER_MONTH) if disk is not None and per_gb is not None else None


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None


def _direct(row: dict, user: str) -> Endpoint | None:
    ip = (row.get("public_ipaddr") or "").strip()
    try:
        port = int(((row.get("ports") or {}).get("22/tcp") or [{}])[0]["HostPort"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return Endpoint(ip, port, user) if ip else None


def _proxy(row: dict, user: str) -> Endpoint | None:
    host, port = (row.get("ssh_host") or "").strip(), row.get("ssh_port")
    return Endpoint(host, int(port), user) if host and port else None


@hookimpl
def register_providers(register):
    register(VastAIProvider)
