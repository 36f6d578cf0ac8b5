"""Lambda Cloud through its REST API v1, plain HTTPS with the standard library (Lambda publishes no SDK).

Settings (``[providers.lambda]`` in config.toml), all optional: ``api_key`` (else ``LAMBDA_API_KEY``),
``base_url`` (else ``LAMBDA_API_BASE_URL``, else https://cloud.lambda.ai/api/v1), ``region`` (launch
only there; default: any region with capacity), ``image`` (an image family, or an image id; default:
Lambda Stack), ``ssh_user`` ("ubuntu", Lambda Stack's login), ``retries`` (5), ``http_timeout`` (30 s),
``launch_interval`` (12 s: the wait after a launch answered 429), ``poll_seconds`` (2),
``destroy_timeout`` (180 s), ``launch_lookup_seconds`` (60 s: how long an ambiguous launch is looked
for), ``unhealthy_grace`` (300 s: how long an unhealthy instance is waited on, before and after its
one restart).

What Lambda is, from its published OpenAPI description (cloud.lambda.ai/api/v1/openapi.json, v1.10.0),
and what this provider does about it:
- Every answer is ``{"data": ...}`` or ``{"error": {"code", "message", "suggestion"}}``; only the
  ``code`` is meant for programs (the spec says so), so only codes are read here.
- Requests are limited to about one a second, launches to one per 12 seconds (five a minute): a 429
  is waited out and asked again; it refused the request, so a repeated launch makes no second machine.
- A launch refused with ``instance-operations/launch/insufficient-capacity`` means that offer was
  taken meanwhile: the next region (or the next cheapest type) is tried.
- A launch has no idempotency token, and an answer lost to a 5xx or a dropped connection may hide a
  launch that happened: orch looks for the instance by its name for ``launch_lookup_seconds`` (a
  new instance may be missing from the listing for a while, as RunPod's are) and never launches
  blind again; reconcile (every reaper pass) adopts one that shows later. A new id that
  ``GET /instances/{id}`` does not know yet is pending for two minutes, not gone (the grace EC2's
  eventual consistency gets).
- The launch's 403s are the account's, not the key's (spec, launchInstance 403):
  ``global/account-inactive`` (verify the email address, add a payment method) and
  ``global/invalid-address`` (the billing address): each is named.
- ``unhealthy`` is not final (spec InstanceStatus; SkyPilot's lambda_cloud provisioner maps it to
  INIT, not to a failure): orch waits ``unhealthy_grace``, sends one
  ``/instance-operations/restart``, waits again, and only then reports it broken (and ``up`` or the
  reaper destroys it). The time it was first seen unhealthy, and the restart, are kept in orch's
  home, so a reaper that runs as a new process each pass still counts from the first sighting.
- ``preempted`` (taken back by Lambda) is read as gone, and the terminate is sent anyway: it is
  idempotent, and "gone" must mean nothing bills.
- There is no stop and no spot: both are declared (``capabilities``) and refused in one line. There
  is no self-stop either: only a terminate through the API ends the bill, and that needs the
  account's key, which orch never puts on an instance.
- An instance listing carries ``jupyter_token`` and ``jupyter_url`` (a login to the instance): they
  are dropped before anything orch keeps.
- A launch needs exactly one SSH key held by the account: orch's key is added once, named after
  its fingerprint.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import replace
from typing import Any

from orchestrator import gpus as gpu_names
from orchestrator.errors import AuthError, NoCapacity, ProviderError, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.provider import Capabilities, Endpoint, Offer, Provider, Remote, Request, Status, parse_label
from orchestrator.retry import retry

DEFAULT_BASE_URL = "https://cloud.lambda.ai/api/v1"
NO_CAPACITY = "instance-operations/launch/insufficient-capacity"
NOT_FOUND = "global/object-does-not-exist"
# The launch's 403s (spec, launchInstance 403: ApiErrorAccountInactive, ApiErrorInvalidBillingAddress),
# with what fixes each (the spec's own suggestions).
ACCOUNT_REFUSALS = {
    "global/account-inactive": "the Lambda account is inactive: verify its email address and add a valid payment "
                               "method in the Lambda console (Settings, Billing)",
    "global/invalid-address": "the Lambda account's billing address is invalid: correct it in the Lambda console "
                              "(Settings, Billing)",
}
VISIBILITY_GRACE_S = 120.0  # a new id GET /instances/{id} does not know yet is pending this long, not gone
LAUNCH_LOOKUP_SECONDS = 60.0
UNHEALTHY_GRACE_S = 300.0
# Instance fields that are a login to the instance (the spec: "the secret token used to log into
# the JupyterLab server"): never kept.
SECRET_FIELDS = ("jupyter_token", "jupyter_url")
MAX_WAIT = 60.0  # a Retry-After longer than this is not waited out
# "unhealthy" is decided by LambdaProvider._unhealthy (wait, one restart, then broken).
_STATES = {"booting": Status.PENDING, "active": Status.RUNNING, "unhealthy": Status.PENDING,
           "terminating": Status.PENDING, "terminated": Status.GONE, "preempted": Status.GONE}


class LambdaError(ProviderError):
    """A refusal from Lambda, with its error ``code`` where it gave one."""

    def __init__(self, message: str, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


class Transient(LambdaError):
    """Worth another try: 429, 5xx, a dropped connection. ``wait`` < 0: back off."""

    def __init__(self, message: str, wait: float = -1.0, **kw):
        super().__init__(message, **kw)
        self.wait = wait


def key_blob(public_key: str) -> str:
    """'ssh-ed25519 AAAA...' of a public key line, without its comment: what identifies the key."""
    return " ".join(public_key.split()[:2])


def key_name(public_key: str) -> str:
    """The name orch gives its key in an account: its fingerprint, so another key never collides."""
    try:
        blob = base64.b64decode(public_key.split()[1])
    except (IndexError, ValueError):
        blob = public_key.encode()
    return "orch-" + hashlib.sha256(blob).hexdigest()[:12]


def gpu_from_description(description: str) -> tuple[str, float]:
    """('H100 SXM5', 80.0) from Lambda's 'H100 (80 GB SXM5)': the name orch's GPU table knows, and
    the memory per GPU. The form factor is kept only where it names a different part."""
    m = re.fullmatch(r"\s*(?P<name>[^()]+?)\s*(\((?P<detail>[^)]*)\))?\s*", description or "")
    if not m:
        return (description or "?").strip() or "?", 0.0
    name, detail = m["name"], m["detail"] or ""
    mem = re.search(r"(\d+(?:\.\d+)?)\s*GB", detail, re.I)
    vram = float(mem[1]) if mem else 0.0
    form = re.sub(r"\d+(?:\.\d+)?\s*GB", "", detail, flags=re.I).strip()
    for candidate in (f"{name} {form}".strip(), name, f"RTX {name}"):
        if gpu_names.lookup(candidate):
            return candidate, vram
    return name, vram


# The region each group's nodes launch in (``open_group``), shared by the provider objects its nodes use.
_GROUP_REGIONS: dict[str, str] = {}


class LambdaProvider(Provider):
    name = "lambda"
    # groups: instances of one region share a private network (each has a private_ip); a group's
    # nodes are launched in one region (``open_group``), as SkyPilot does (shared/reference/multinode.md).
    capabilities = Capabilities(stop=False, spot=False, cpu_only=False, gpu=True, self_stop=False,
                                self_destroy=False, groups=True)
    env_keys = ("LAMBDA_API_KEY", "LAMBDA_API_BASE_URL")
    credentials = "LAMBDA_API_KEY, or api_key under [providers.lambda] in config.toml"
    login = "ubuntu"  # Lambda Stack's user
    numeric_settings = {"retries": 1, "http_timeout": 0.1, "launch_interval": 0, "poll_seconds": 0,
                        "destroy_timeout": 0, "launch_lookup_seconds": 0, "unhealthy_grace": 0}



    def configured(self) -> bool:
        return bool(os.environ.get("LAMBDA_API_KEY") or self.settings.get("api_key"))

    @property
    def base_url(self) -> str:
        url = self.settings.get("base_url") or os.environ.get("LAMBDA_API_BASE_URL") or DEFAULT_BASE_URL
        return str(url).rstrip("/")

    def _key(self) -> str:
        key = os.environ.get("LAMBDA_API_KEY") or self.settings.get("api_key")  # env beats config.toml
        if not key:
            raise AuthError("no Lambda Cloud API key: set api_key under [providers.lambda] in config.toml, "
                            "or LAMBDA_API_KEY")
        return str(key)

    # -- calling Lambda ----------------------------------------------------------------
    def _once(self, method: str, path: str, body: dict | None = None) -> Any:
        """One request; Lambda's errors become orch's, 429/5xx/network ones ``Transient``."""
        import urllib.error
        import urllib.request

        what = f"{method} {path}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self._key()}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.number("http_timeout", 30)) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise _http_error(e, what) from None
        except (OSError, ValueError) as e:  # refused, reset, timed out, a bad URL
            raise Transient(f"cannot reach Lambda Cloud at {self.base_url} ({what}): {e}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise LambdaError(f"Lambda Cloud answered {what} with something that is not JSON: {raw[:200]!r}") from None
        if not isinstance(answer, dict) or "data" not in answer:
            raise LambdaError(f"Lambda Cloud answered {what} without data: {str(answer)[:200]}")
        return answer["data"]

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        """A request that is safe to repeat (anything but a launch), with bounded retries."""
        return retry(lambda: self._once(method, path, body), _delay_for,
                     attempts=int(self.number("retries", 5)), cap=MAX_WAIT)

    # -- offers ------------------------------------------------------------------------
    def _types(self) -> dict[str, dict]:
        types = self._call("GET", "/instance-types")
        if not isinstance(types, dict):
            raise LambdaError(f"Lambda Cloud's instance types came back as {type(types).__name__}, not a map")
        return types

    def offers(self, request: Request) -> list[Offer]:
        # Asked for spot prices, Lambda has none to show: its offers carry no spot price (not an error).
        self.validate(replace(request, spot=False, bid=None))
        found = []
        for name, item in self._types().items():
            offer = _offer(name, item)
            if offer is None or offer.gpus != int(request.gpus):
                continue
            if request.gpu and not gpu_names.matches(request.gpu, offer.gpu_name):
                continue
            if request.offer and request.offer != name:
                continue
            found.append(offer)
        found.sort(key=lambda o: o.price_hr or 0.0)
        return found

    # -- the verbs ---------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        super().validate(request)
        if request.image is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", request.image):
            raise UsageError("--image on lambda is a Lambda image family or image id (letters, digits, '.', '_', '-')")

    def create(self, request: Request, label: str, public_key: str) -> Remote:
        self.validate(request)
        if not request.gpu and not request.offer:
            raise UsageError("say which GPU to rent on Lambda (--gpu, e.g. A10) or which instance type (--offer)")
        candidates = self.offers(request)
        if not candidates:
            what = f"instance type {request.offer}" if request.offer else f"{request.gpus}x {request.gpu}"
            raise NoCapacity(f"Lambda Cloud has no capacity for {what} in any region right now")
        key = self._ensure_key(public_key)
        return self._launch(candidates, request, label, key)

    def _launch(self, candidates: list[Offer], request: Request, label: str, key: str) -> Remote:
        """Launch the cheapest candidate in a region with capacity; a region whose capacity was taken
        meanwhile gives way to the next. After an answer that may hide a launch, look before retrying."""
        wanted_region = self.settings.get("region") or _GROUP_REGIONS.get(request.group or "")
        queue = [(o, r) for o in candidates for r in o.raw["regions"] if not wanted_region or r == wanted_region]
        if not queue:
            raise NoCapacity(f"Lambda Cloud has no capacity for {request.gpus}x {request.gpu or request.offer} "
                             f"in region {wanted_region}")
        attempts, failures = int(self.number("retries", 5)), 0
        while queue:
            offer, region = queue[0]
            body: dict[str, Any] = {"region_name": region, "instance_type_name": offer.offer_id,
                                    "ssh_key_names": [key], "file_system_names": [], "quantity": 1, "name": label}
            image = request.image or self.settings.get("image")
            if image:
                body["image"] = {"id": image} if re.fullmatch(r"[0-9a-f]{32}", image) else {"family": image}
            try:
                ids = self._once("POST", "/instance-operations/launch", body)
                ids = ids.get("instance_ids") if isinstance(ids, dict) else None
                if not isinstance(ids, list) or len(ids) != 1:
                    raise LambdaError(f"Lambda Cloud's launch answered without one instance id: {ids}")
                self.made(str(ids[0]))
                remote = self.get(str(ids[0]))
                if not remote.label:  # not visible yet: what the launch asked for is what it is
                    remote = replace(remote, label=label, price_hr=offer.price_hr, gpu_name=offer.gpu_name,
                                     gpus=offer.gpus)
                return remote
            except AuthError:
                raise
            except LambdaError as e:
                error = e
            if error.code == NO_CAPACITY:
                queue.pop(0)  # taken meanwhile: the next region, else the next type
                continue
            if isinstance(error, Transient) and error.status == 429:
                # The rate limiter refused the launch itself: nothing was made.
                failures += 1
                if failures >= attempts:
                    raise error
                time.sleep(error.wait if error.wait >= 0 else self.number("launch_interval", 12))
                continue
            if not isinstance(error, Transient):
                raise error
            # A 5xx or a dropped connection may hide a launch that happened: look, never launch blind again.
            return self._look_for(label, error)
        raise NoCapacity(f"every Lambda Cloud region with {request.gpus}x {request.gpu or request.offer} lost its "
                         "capacity before the launch: try again")

    def _look_for(self, label: str, error: LambdaError) -> Remote:
        """After a launch whose answer was lost: the instance by its name, looked for
        ``launch_lookup_seconds`` (a new instance may be missing from the listing for a while)."""
        window = self.number("launch_lookup_seconds", LAUNCH_LOOKUP_SECONDS)
        deadline = time.monotonic() + window
        while True:
            try:
                found, failed = self.find(label), None
            except ProviderError as e:
                found, failed = None, e
            if found:
                self.made(found.provider_id)
                return found
            if time.monotonic() >= deadline:
                break
            time.sleep(max(self.poll_seconds, 0.05))
        if failed is not None:
            raise ProviderError(f"Lambda Cloud's launch of {label} failed ({error}), and the listing that would "
                                f"show whether it happened anyway failed too ({failed}): orch sends no second launch; "
                                "the next reaper pass (or `orch reconcile`) adopts it should it show") from None
        raise ProviderError(f"Lambda Cloud's launch of {label} failed ({error}), and no instance of that name showed "
                            f"within {window:g} s. A launch can happen though its answer is lost: orch sends no second "
                            "launch; the next reaper pass (or `orch reconcile`) adopts it should it show") from None

    def get(self, provider_id: str) -> Remote:
        try:
            row = self._call("GET", f"/instances/{_lambda_id(provider_id)}")
        except LambdaError as e:
            if e.status == 404 and e.code == NOT_FOUND:
                return self.unseen(provider_id, VISIBILITY_GRACE_S) or \
                    Remote(provider_id=str(provider_id), label="", status=Status.GONE)
            raise
        if not isinstance(row, dict):
            raise LambdaError(f"Lambda Cloud's instance {provider_id} came back as {type(row).__name__}")
        self.seen(provider_id)
        return self._remote(row)

    def list(self) -> list[Remote]:
        rows = self._call("GET", "/instances")
        if not isinstance(rows, list):
            raise LambdaError(f"Lambda Cloud's instance listing came back without instances: {str(rows)[:200]}")
        remotes = [self._remote(r) for r in rows if isinstance(r, dict) and parse_label(r.get("name"))]
        return [r for r in remotes if r.status != Status.GONE]

    def _terminate(self, provider_id: str) -> None:
        self._call("POST", "/instance-operations/terminate", {"instance_ids": [_lambda_id(provider_id)]})

    def destroy(self, provider_id: str) -> None:
        remote = self.get(provider_id)
        if remote.status == Status.GONE and not remote.preempted:
            return
        try:
            self._terminate(provider_id)
        except LambdaError:
            if self.get(provider_id).status != Status.GONE:
                raise
            return
        deadline = time.monotonic() + self.number("destroy_timeout", 180)
        while (status := self.get(provider_id).status) != Status.GONE:
            if time.monotonic() >= deadline:
                raise ProviderError(f"Lambda Cloud accepted the terminate of instance {provider_id} but still "
                                    f"shows it {status.value}: it may still bill, check the Lambda console")
            time.sleep(self.poll_seconds)

    def open_group(self, group: str, request: Request) -> None:
        """One region for every node of the group: the cheapest offer's first region with capacity
        (a node that finds it taken meanwhile fails the group: all or nothing)."""
        if self.settings.get("region"):
            return
        candidates = self.offers(request)
        regions = [r for o in candidates for r in o.raw["regions"]]
        if not regions:
            what = f"instance type {request.offer}" if request.offer else f"{request.gpus}x {request.gpu}"
            raise NoCapacity(f"Lambda Cloud has no capacity for {what} in any region right now")
        _GROUP_REGIONS[group] = regions[0]

    def close_group(self, group: str) -> None:
        _GROUP_REGIONS.pop(group, None)

    def _remote(self, row: dict) -> Remote:
        status_word = row.get("status")
        status = _STATES.get(status_word, Status.PENDING)
        health = self._unhealthy(str(row.get("id")), status_word == "unhealthy")
        if health is not None:
            status = health[0]
        if status_word == "preempted":
            self._end_preempted(str(row.get("id")))
        itype = row.get("instance_type") if isinstance(row.get("instance_type"), dict) else {}
        gpu, _ = gpu_from_description(str(itype.get("gpu_description") or ""))
        cents = itype.get("price_cents_per_hour")
        ip = row.get("ip") if isinstance(row.get("ip"), str) else None
        endpoint = Endpoint(ip.strip(), 22, self.ssh_user) if status == Status.RUNNING and ip and ip.strip() else None
        label = row.get("name") if isinstance(row.get("name"), str) else ""
        region = row.get("region") if isinstance(row.get("region"), dict) else {}
        return Remote(
            provider_id=str(row.get("id")), label=label, status=status, endpoint=endpoint,
            price_hr=cents / 100 if isinstance(cents, (int, float)) else None, stopped_price_hr=None,
            gpu_name=gpu if itype else None, gpus=int((itype.get("specs") or {}).get("gpus") or 0),
            # Lambda sells no spot, yet lists "preempted" among an instance's states: taken back by Lambda.
            preempted=status_word == "preempted",
            private_ip=row.get("private_ip") if isinstance(row.get("private_ip"), str) else None,
            detail=(health[1] if health else str(status_word or "")) +
            (f" in {region.get('name')}" if region.get("name") else ""),
            raw={k: v for k, v in row.items() if k not in SECRET_FIELDS},
        )

    def _end_preempted(self, provider_id: str) -> None:
        """Lambda took it back; orch reads it as gone, so the terminate goes too (idempotent): a
        preempted instance that Lambda kept would otherwise bill unseen."""
        try:
            self._terminate(provider_id)
        except LambdaError:
            pass  # already on its way out: the next look says so

    # -- unhealthy: wait, one restart, then broken ---------------------------------------
    def _health_file(self):
        from pathlib import Path

        return Path(self.home) / "lambda-unhealthy.json" if self.home else None

    def _health_memory(self) -> dict:
        path = self._health_file()
        if path is None:
            return self.__dict__.setdefault("_health", {})
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _health_keep(self, memory: dict) -> None:
        path = self._health_file()
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(memory))
        tmp.replace(path)

    def _unhealthy(self, provider_id: str, unhealthy: bool) -> tuple[Status, str] | None:
        """(status, detail) of an unhealthy instance, counted from its first sighting (kept in orch's
        home): pending for ``unhealthy_grace``, then one restart and pending again as long, then
        broken. None for one that is not unhealthy (its sighting is forgotten)."""
        memory = self._health_memory()
        if not unhealthy:
            if provider_id in memory:
                memory.pop(provider_id)
                self._health_keep(memory)
            return None
        now, grace = time.time(), self.number("unhealthy_grace", UNHEALTHY_GRACE_S)
        seen = memory.get(provider_id) if isinstance(memory.get(provider_id), dict) else None
        if seen is None:
            seen = memory[provider_id] = {"since": now, "restarted": None}
            self._health_keep(memory)
        since, restarted = float(seen.get("since") or now), seen.get("restarted")
        if restarted is None:
            if now - since < grace:
                return Status.PENDING, f"unhealthy for {now - since:.0f} s: waiting for Lambda to recover it"
            try:
                self._call("POST", "/instance-operations/restart", {"instance_ids": [_lambda_id(provider_id)]})
                note = "restarted once"
            except LambdaError as e:
                note = f"its restart was refused ({e})"
            seen["restarted"] = now
            self._health_keep(memory)
            return Status.PENDING, f"unhealthy for {now - since:.0f} s: {note}, waiting again"
        if now - float(restarted) < grace:
            return Status.PENDING, f"unhealthy for {now - since:.0f} s: restarted once, waiting again"
        return Status.BROKEN, f"unhealthy for {now - since:.0f} s, before and after a restart: given up"

    # -- the account's SSH keys --------------------------------------------------------
    def _keys(self) -> list[dict]:
        keys = self._call("GET", "/ssh-keys")
        if not isinstance(keys, list):
            raise LambdaError(f"Lambda Cloud's SSH key listing came back without keys: {str(keys)[:200]}")
        return [k for k in keys if isinstance(k, dict)]

    def _held(self, public_key: str) -> str | None:
        """The name under which the account holds orch's key; None when it does not. A key of orch's
        name that is another key is refused: launching with it would lock orch out."""
        mine, name = key_blob(public_key), key_name(public_key)
        keys = self._keys()
        for k in keys:
            if key_blob(str(k.get("public_key") or "")) == mine:
                return str(k.get("name"))
        if any(k.get("name") == name for k in keys):
            raise ProviderError(f"the Lambda account holds an SSH key named {name!r} that is not orch's key: "
                                "delete or rename it in the Lambda console")
        return None

    def _ensure_key(self, public_key: str) -> str:
        held = self._held(public_key)
        if held:
            return held
        name = key_name(public_key)
        added = self._call("POST", "/ssh-keys", {"name": name, "public_key": key_blob(public_key)})
        if not isinstance(added, dict) or added.get("name") != name:
            raise LambdaError(f"Lambda Cloud did not confirm orch's SSH key {name}: {str(added)[:200]}")
        return name

    def account_key(self, public_key: str) -> str:
        held = self._held(public_key)
        if held:
            return f"held by the Lambda account as SSH key {held!r}"
        return f"not in the Lambda account yet: the first `orch up` adds it as SSH key {key_name(public_key)!r}"


def _offer(name: str, item: Any) -> Offer | None:
    if not isinstance(item, dict) or not isinstance(item.get("instance_type"), dict):
        return None
    itype = item["instance_type"]
    specs = itype.get("specs") if isinstance(itype.get("specs"), dict) else {}
    count, cents = specs.get("gpus"), itype.get("price_cents_per_hour")
    if not isinstance(count, int) or count < 1 or not isinstance(cents, (int, float)):
        return None
    regions = [r.get("name") for r in item.get("regions_with_capacity_available") or [] if isinstance(r, dict)]
    regions = [r for r in regions if isinstance(r, str) and r]
    if not regions:
        return None  # no capacity anywhere now: nothing to rent
    gpu, vram = gpu_from_description(str(itype.get("gpu_description") or ""))
    return Offer(
        provider="lambda", offer_id=name, gpu_name=gpu, gpus=count, vram_gb=vram, price_hr=cents / 100,
        location=", ".join(regions), stock=f"capacity in {len(regions)} region{'s' if len(regions) > 1 else ''}",
        # The instance's local disk comes with the price (specs.storage_gib); nothing is kept after a
        # terminate, and there is no stopped state to bill.
        disk_gb_month=None, disk_included=True,
        note=f"Lambda's list price (instance-types price_cents_per_hour), asked live; {specs.get('storage_gib')} GiB "
             "of local disk included",
        raw={"regions": regions, "description": itype.get("description"), "specs": specs},
    )


def _lambda_id(provider_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,100}", str(provider_id)):
        raise ProviderError(f"{provider_id!r} is not a Lambda Cloud instance id")
    return str(provider_id)


def _delay_for(exc: BaseException) -> float | None:
    return exc.wait if isinstance(exc, Transient) else None


def _http_error(e, what: str) -> LambdaError:
    status = e.code
    try:
        body = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        body = {}
    error = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = str(error.get("message") or code or e.reason or "")[:200]
    if status == 403 and code in ACCOUNT_REFUSALS:
        return AuthError(f"Lambda Cloud refused {what}: {ACCOUNT_REFUSALS[code]} ({code})")
    if status in (401, 403):
        return AuthError(f"Lambda Cloud refused the API key ({what}: HTTP {status}: {message}); check api_key "
                         f"under [providers.lambda] or LAMBDA_API_KEY")
    if status == 429:
        try:
            wait = float(e.headers.get("Retry-After"))
        except (TypeError, ValueError):
            wait = -1.0
        if wait > MAX_WAIT:
            return LambdaError(f"Lambda Cloud's rate limit on {what} asks for {wait:.0f} s: try again later",
                               code=code, status=429)
        return Transient(f"Lambda Cloud's rate limit on {what} (HTTP 429)", wait=wait, code=code, status=429)
    if status >= 500:
        return Transient(f"Lambda Cloud server error on {what} (HTTP {status}: {message})", code=code, status=status)
    if code == NO_CAPACITY:
        return LambdaError(f"Lambda Cloud has no capacity for this launch ({message})", code=code, status=status)
    return LambdaError(f"Lambda Cloud refused {what} (HTTP {status}: {code or ''} {message})".replace("  ", " "),
                       code=code, status=status)


@hookimpl
def register_providers(register):
    register(LambdaProvider)
