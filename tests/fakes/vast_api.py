"""A fake Vast.ai REST API on 127.0.0.1 whose instances are real containers (tests/fakes/hosts.py).

It behaves, by default, as Vast.ai does. Where each behaviour comes from ("the SDK" is vastai 1.9.1
on PyPI, its source read after pip install; "docs" Vast.ai's CLI and API reference at
docs.vast.ai; "issue 13" the project's issue that read these sources):

- **Answers**: failures arrive as HTTP 200 with ``success: false`` (the SDK's callers check
  ``success``); the v1 listing
  pages by ``next_token``; an instance row carries a numeric ``start_date`` and ``extra_env``
  pairs (the SDK's ``show_instance`` indexes both: vastai/api/instances.py). ``price`` in a create
  body is the bid: ``null`` rents on-demand, a number interruptible (vastai/api/instances.py
  build_create_instance_payload).
- **Status fields** (docs "show instance", VastAI.show_instance): ``actual_status`` is the
  container (null, loading, running, stopped, frozen, exited, rebooting, unknown, offline),
  ``intended_status`` what the user asked for (running, stopped, frozen), ``cur_state`` the
  machine contract (running, stopped; unloaded once destroyed).
- **SSH routes**: ``ssh_host``/``ssh_port`` is Vast's SSH proxy, here a ``hosts.Relay`` to the
  container's sshd: it works. The direct route (``public_ipaddr`` + ``ports["22/tcp"]``) is
  firewalled, a ``hosts.Silent`` port: the TCP handshake completes and no banner ever comes.
  Issue 13 and docs ("SSH connection": the proxy is the default route): the direct route is often blocked, the proxy works
  (SkyPilot's Vast provisioner waits for and uses ``ssh_port``: sky/provision/vast/utils.py
  get_ssh_ports). ``direct_works=True`` opens the direct route too.
- **A start waits for its GPU**: it is accepted at once, then the instance shows *scheduling*
  (intended running, no machine allocated: ``cur_state`` stopped) until its host's GPU is free,
  possibly for ever; stopping it again is how one gives up (docs "vastai start instance": "If
  your instance is stuck in the 'scheduling' state ... the required resources on the machine to
  run your instance are currently unavailable"). There is no ``resources_unavailable`` refusal
  of a start. ``scheduling_polls`` is how long it waits when the GPU is free (Vast shows the
  state briefly every time); ``gpu_taken`` makes it wait longer, or for ever.
- **States that still bill** (docs "show instance"; vastai SKILL.md): ``exited`` the container's
  process died (the machine stays allocated: billed as running, docs "show instance"); ``offline`` /
  ``unknown`` the host dropped ("it will never reach running", SKILL.md's poll-loop warning);
  ``frozen`` paused with its memory kept, "GPU charges apply". ``crash`` puts an instance in one.
- **Outbid** interruptible instances stop, storage still billing (SKILL.md "Interruptible"), with
  ``cur_state``, ``intended_status`` and ``next_state`` all stopped (dstack's Vast backend,
  compute.py update_provisioning_data); raising the bid (``change_bid``) resumes it, through
  scheduling; a start without a winning bid schedules until the higher bidder leaves.
- **Create**: without ``cancel_unavail`` a create on an offer that cannot be scheduled (just
  taken by someone else) makes a *stopped* instance instead of an error (the CLI's help for
  ``--cancel-unavail``: "Return error if scheduling fails (rather than creating a stopped
  instance)"). A bid below the offer's minimum makes a stopped instance *and* answers an error
  that carries its ``new_contract`` (dstack's Vast client, api_client.py
  VastAICreateInstanceError: "Vast.ai creates spot instances in the stopped state and returns an
  error if the bid is insufficient"). Error codes for both are not documented: the ones here are
  placeholders, and orch must not depend on them.
- **Prices**: storage is priced over a 720-hour month (issue 13, from the OpenAPI show_instance
  example: storage_cost × GB / 720 = dph_total − dph_base); rows carry ``storage_total_cost``
  (the SDK's offer model has it: vastai/data/offer.py).

- **Volumes** (docs "Volumes", guides/instances/storage/volumes; API reference "search volumes",
  "rent volume", "list volumes", "delete volume"; "create instance"'s ``volume_info``): local to one
  machine. Every machine of the catalog offers its disk as a volume offer (``POST
  /api/v0/volumes/search/``, filtered like offers, ``allocated_storage`` pricing it); ``PUT
  /api/v0/volumes/ {id, size, name}`` rents one (name: letters, digits, underscores, at most 64) and
  answers ``volume_name: "V.<id>"``; ``GET /api/v0/volumes`` lists them with the ``instances``
  using each; ``DELETE /api/v0/volumes/`` (the id in the query, as the SDK sends it, or the body, as
  the reference shows) answers 404 ``no_such_volume`` for none, and refuses while an instance that
  is not destroyed uses it (its code is not documented: a placeholder). An instance created with
  ``volume_info {create_new: false, volume_id, mount_path}`` must be on the volume's machine (code
  not documented either) and sees the volume's folder at ``mount_path``; every instance of the
  volume sees the same files.

The filter matcher is stricter than Vast: an unknown field, or a number sent as a string (what
the SDK's ``parse_query`` does), matches nothing, so such a query finds no offer.

    with FakeVast(tmp_path) as fake:
        VastAI(api_key=fake.key, server_url=fake.url, retry=1)
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.hosts import Host, Relay, Silent, free_port

HOST = "127.0.0.1"
# Vast's SSH proxy (sshN.vast.ai), faked on a loopback address of its own: never off 127.0.0.0/8.
PROXY_HOST = "127.0.0.253"
# Vast prices storage per month of 720 hours (see the module's docstring).
HOURS_PER_MONTH = 720.0
# The states Vast shows for a host or container that will not run by itself (``crash``).
CRASHES = ("exited", "offline", "unknown", "frozen")


def _offer(id, gpu_name, dph_base, *, num_gpus=1, gpu_ram=24564, min_bid=None, storage_cost=0.15,
           reliability=0.99, verification="verified", direct_port_count=20, inet_down=800.0,
           cuda_max_good=12.4, rentable=True, geolocation="Sweden, SE", disk_space=200.0):
    return {
        "id": id, "ask_contract_id": id, "machine_id": 500 + id, "host_id": 90 + id % 7,
        "num_gpus": num_gpus, "gpu_name": gpu_name, "gpu_ram": gpu_ram, "gpu_total_ram": gpu_ram * num_gpus,
        "cpu_cores": 16, "cpu_ram": 64000, "disk_space": disk_space, "inet_down": inet_down, "inet_up": 500.0,
        "direct_port_count": direct_port_count, "dph_base": dph_base,
        "min_bid": round(dph_base * 0.45, 4) if min_bid is None else min_bid, "storage_cost": storage_cost,
        "reliability": reliability, "reliability2": reliability, "verification": verification,
        "verified": verification == "verified", "rentable": rentable, "rented": False, "external": False,
        "geolocation": geolocation, "cuda_max_good": cuda_max_good, "hosting_type": 0,
        "score": round(100 * reliability / dph_base, 2),
    }


def default_offers() -> list[dict]:
    """One good RTX 4090, a dearer good one, and cheaper ones each failing one of orch's bars."""
    return [
        _offer(1001, "RTX 4090", 0.40, min_bid=0.20),
        _offer(1002, "RTX 4090", 0.20, verification="unverified"),
        _offer(1003, "RTX 4090", 0.25, reliability=0.80),
        _offer(1004, "RTX 4090", 0.28, direct_port_count=0),
        _offer(1005, "RTX 4090", 0.30, cuda_max_good=11.8),
        _offer(1006, "RTX 4090", 0.31, inet_down=50.0),
        _offer(1007, "RTX 4090", 0.55, min_bid=0.30, storage_cost=0.20, geolocation="Texas, US"),
        _offer(1008, "A100 SXM4", 2.00, num_gpus=2, gpu_ram=81920, min_bid=1.10),
        _offer(1009, "RTX 3090", 0.22, min_bid=0.10, storage_cost=0.10, geolocation="Poland, PL"),
        _offer(1010, "RTX 4090", 0.21, rentable=False),
    ]


def storage_hr(storage_cost: float, disk_gb: float) -> float:
    return round(storage_cost * disk_gb / HOURS_PER_MONTH, 6)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, Any]
    body: Any
    status: int = 0


@dataclass
class Fault:
    method: str | None
    path: re.Pattern
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    after: bool = False  # do the real work first, then answer with the fault


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj).encode()


_OPS = {
    "eq": lambda a, b: a == b, "neq": lambda a, b: a != b,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}
_ORDERED = {"gt": lambda a, b: a > b, "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b,
            "lte": lambda a, b: a <= b}


def matches(row: dict, filters: dict) -> bool:
    for name, ops in filters.items():
        if name not in row or not isinstance(ops, dict):
            return False
        value = row[name]
        for op, want in ops.items():
            if op in _OPS:
                if op in ("in", "notin") and not isinstance(want, list):
                    return False
                if not _OPS[op](value, want):
                    return False
            elif op in _ORDERED:
                numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (value, want))
                if not numbers or not _ORDERED[op](value, want):
                    return False
            else:
                return False
    return True


class FakeVast:
    """The fake server and its state. Knobs are plain attributes and the methods under "knobs"."""

    def __init__(self, tmp: Path, *, boot_polls: int = 2, destroy_polls: int = 1, page_limit: int | None = None,
                 direct_works: bool = False, scheduling_polls: int = 1):
        self.root = Path(tmp) / "vast"
        self.key = "vk-" + secrets.token_hex(12)
        self.offers: list[dict] = default_offers()
        self.boot_polls = boot_polls  # GETs an instance spends loading before it runs
        self.destroy_polls = destroy_polls  # GETs a destroyed instance still shows
        self.page_limit = page_limit  # caps the v1 listing's page size, to exercise next_token
        self.direct_works = direct_works  # False: the direct SSH route is firewalled (Vast as it is)
        self.scheduling_polls = scheduling_polls  # GETs a start shows scheduling when its GPU is free
        self.requests: list[Recorded] = []
        self.volumes: dict[int, dict] = {}  # rented volumes, as ``show volumes`` rows
        self._next_volume = 30_000_001
        self.instances: dict[int, dict] = {}
        self._private: dict[int, dict] = {}  # per instance: its host, routes, container key, polls...
        self._faults: list[Fault] = []
        self._after_search: list[Callable[[], None]] = []
        self._taken: set[int] = set()  # offers rented by someone else since a search showed them
        self._next_id = 7_000_001
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "FakeVast":
        self.root.mkdir(parents=True, exist_ok=True)
        fake = self

        class Handler(_Handler):
            pass

        Handler.fake = fake
        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        # A short poll: shutdown() (each test's end) waits for the loop's next wake, 0.5 s by default.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        for own in list(self._private.values()):
            self._release(own)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}"

    # -- knobs -----------------------------------------------------------------------------
    def inject(self, status: int, body: bytes | dict | str = b"", *, method: str | None = None,
               path: str = r".*", times: int = 1, after: bool = False, headers: dict | None = None) -> None:
        """The next ``times`` requests matching ``method`` and the ``path`` regex answer this."""
        ctype = "application/json"
        if isinstance(body, dict):
            body = _json_bytes(body)
        elif isinstance(body, str):
            body, ctype = body.encode(), "text/plain"
        with self._lock:
            self._faults.append(Fault(method, re.compile(path), status, body, ctype, headers or {}, times, after))

    def rate_limit(self, times: int = 1, *, quota: bool = False, retry_after: float | None = None,
                   path: str = r".*") -> None:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if quota:
            body: Any = {"success": False, "error": "search_quota_exceeded",
                         "msg": "Daily search quota exceeded; it resets at 00:00 UTC."}
        else:
            body = "429 Too Many Requests"  # Vast's rate limiter answers plain text
        self.inject(429, body, path=path, times=times, headers=headers)

    def server_error(self, times: int = 1, status: int = 500, path: str = r".*") -> None:
        self.inject(status, "<html><body><h1>%d Server Error</h1></body></html>" % status, path=path, times=times)

    def create_fails_after_creating(self, status: int = 502) -> None:
        """The next create rents the offer, then answers a gateway error (the SDK re-sends it)."""
        self.inject(status, "<html><body><h1>502 Bad Gateway</h1></body></html>", method="PUT",
                    path=r"^/api/v0/asks/\d+/$", after=True)

    def fail_listing(self, times: int = 1) -> None:
        self.inject(200, {"success": False, "error": "internal_error", "msg": "Listing temporarily unavailable."},
                    method="GET", path=r"^/api/v1/instances/$", times=times)

    def gpu_taken(self, instance_id: int | str, *, polls: int | None = None, seconds: float | None = None) -> None:
        """Someone else has this instance's GPU: its (next) start waits in scheduling for ``polls``
        GETs or ``seconds``, or, given neither, for ever (until ``free_gpu``)."""
        with self._lock:
            self._private[int(instance_id)]["gpu"] = {
                "polls": polls, "until": time.monotonic() + seconds if seconds is not None else None}

    def free_gpu(self, instance_id: int | str) -> None:
        with self._lock:
            own = self._private[int(instance_id)]
            own["gpu"], own["rival"] = {"polls": 0, "until": None}, None

    def take_after_search(self, offer_id: int) -> None:
        """Right after the next offer search answers, someone else rents this offer's machine: the
        search showed it, a create on it cannot be scheduled (what ``cancel_unavail`` is for)."""
        self._after_search.append(lambda: self._taken.add(offer_id))

    def min_bid_rises_after_search(self, offer_id: int, min_bid: float) -> None:
        """Right after the next offer search answers, the offer's minimum bid rises: a bid made
        from that answer is now too low."""
        offer = next(o for o in self.offers if o["id"] == offer_id)
        self._after_search.append(lambda: offer.update(min_bid=min_bid))

    def outbid(self, instance_id: int | str, by: float | None = None) -> None:
        """Someone bids more (``by`` $/h): the instance stops, its storage keeps billing, and the
        GPU is the higher bidder's until it leaves (``free_gpu``) or this bid beats it."""
        iid = int(instance_id)
        with self._lock:
            own = self._private[iid]
            self._kill(iid)
            own["rival"] = by if by is not None else round((own["bid"] or own["offer"]["min_bid"]) * 1.5 + 0.01, 4)
            self.instances[iid].update(intended_status="stopped", next_state="stopped", cur_state="stopped",
                                       actual_status="stopped", status_msg="outbid", ports={})

    def crash(self, instance_id: int | str, state: str = "exited") -> None:
        """The container's process dies (``exited``), the host drops off (``offline``, ``unknown``)
        or the instance is paused (``frozen``): nothing answers SSH, and it still bills."""
        if state not in CRASHES:
            raise ValueError(f"crash state must be one of {CRASHES}")
        iid = int(instance_id)
        with self._lock:
            self._kill(iid)
            row = self.instances[iid]
            row.update(actual_status=state, ports={}, status_msg={
                "exited": "Container exited with code 1", "offline": None, "unknown": None,
                "frozen": "Instance frozen"}[state])
            if state == "frozen":
                row.update(intended_status="frozen", next_state="frozen")

    # -- helpers for tests -----------------------------------------------------------------
    def home(self, instance_id: int | str) -> Path:
        """root's home on the instance's disk (the container disk's writable layer), running or not."""
        return self._private[int(instance_id)]["host"].upper / "upper" / "root"

    def container_key(self, instance_id: int | str) -> str:
        return self._private[int(instance_id)]["container_key"]

    def calls(self, method: str, path_regex: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)]

    def live(self) -> list[dict]:
        """The instances that exist (and bill), whatever their state."""
        return [row for iid, row in self.instances.items() if not self._private[iid]["destroyed"]]

    def scheduling(self, instance_id: int | str) -> bool:
        row = self.instances[int(instance_id)]
        return row["intended_status"] == "running" and row["cur_state"] == "stopped"

    # -- request handling ------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: Any, auth: str | None):
        """Returns (status, body bytes, content type, headers)."""
        record = Recorded(method, path, query, body)
        with self._lock:
            self.requests.append(record)
            fault = next((f for f in self._faults if f.method in (None, method) and f.path.search(path)), None)
            if fault:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
            if fault and not fault.after:
                record.status = fault.status
                return fault.status, fault.body, fault.content_type, fault.headers
            status, answer = self._route(method, path, query, body, auth)
            if fault:
                record.status = fault.status
                return fault.status, fault.body, fault.content_type, fault.headers
            record.status = status
            return status, _json_bytes(answer), "application/json", {}

    def _route(self, method, path, query, body, auth):
        if path == "/api/v0/gpu_names/unique/" and method == "GET":
            return 200, {"gpu_names": sorted({o["gpu_name"] for o in self.offers})}
        m = re.fullmatch(r"/api/v0/instances/(\d+)/", path)
        scope = int(m[1]) if m else None
        if not self._authorised(auth, scope):
            return 401, {"success": False, "error": "invalid_api_key", "msg": "Invalid or missing API key."}
        if path in ("/api/v0/users/current", "/api/v0/users/current/") and method == "GET":
            return 200, {"id": 4242, "username": "fake", "email": "tester@localhost", "credit": 25.0,
                         "balance": 0.0, "ssh_key": None}
        if path == "/api/v0/bundles/" and method == "POST":
            found = self._search(body or {})
            hooks, self._after_search = self._after_search, []
            for hook in hooks:
                hook()
            return 200, {"offers": found}
        if m := re.fullmatch(r"/api/v0/asks/(\d+)/", path):
            if method == "PUT":
                return self._create(int(m[1]), body or {})
        if path == "/api/v0/volumes/search/" and method == "POST":
            return 200, {"offers": self._volume_offers(body or {})}
        if path in ("/api/v0/volumes", "/api/v0/volumes/"):
            if method == "GET":
                kind = query.get("type", "all_volume")
                return 200, {"volumes": copy.deepcopy(list(self.volumes.values()))
                             if kind in ("local_volume", "all_volume") else []}
            if method == "PUT":
                return self._rent_volume(body or {})
            if method == "DELETE":
                return self._delete_volume(query.get("id", (body or {}).get("id")))
        if path == "/api/v1/instances/" and method == "GET":
            return self._list(query)
        if m := re.fullmatch(r"/api/v0/instances/(\d+)/ssh/", path):
            if method == "POST":
                return self._attach(int(m[1]), body or {})
        if m := re.fullmatch(r"/api/v0/instances/bid_price/(\d+)/", path):
            if method == "PUT":
                return self._change_bid(int(m[1]), body or {})
        if scope is not None:
            if method == "GET":
                return self._show(scope)
            if method == "PUT":
                return self._update(scope, body or {})
            if method == "DELETE":
                return self._destroy(scope)
        return 404, {"success": False, "error": "not_found", "msg": f"no route for {method} {path}"}

    def _authorised(self, auth: str | None, scope: int | None) -> bool:
        token = (auth or "").removeprefix("Bearer ").strip()
        if not token:
            return False
        if secrets.compare_digest(token, self.key):
            return True
        # A container's own key reaches that instance only.
        own = self._private.get(scope) if scope is not None else None
        return bool(own) and secrets.compare_digest(token, own["container_key"])

    # -- offers ----------------------------------------------------------------------------
    def _search(self, q: dict) -> list[dict]:
        q = dict(q)
        storage = float(q.pop("allocated_storage", 5.0))
        order = q.pop("order", [["score", "desc"]])
        limit = q.pop("limit", None)
        q.pop("type", None)
        q.pop("disable_bundling", None)
        found = []
        for offer in self.offers:
            disk_hr = storage_hr(offer["storage_cost"], storage)
            row = dict(offer, dph_total=round(offer["dph_base"] + disk_hr, 6), storage_total_cost=disk_hr)
            if matches(row, q):
                found.append(row)
        for name, direction in reversed(order):
            found.sort(key=lambda r: r.get(name, 0), reverse=direction == "desc")
        return found[: int(limit)] if limit else found

    # -- volumes ---------------------------------------------------------------------------
    def volume_dir(self, volume_id: int) -> Path:
        """The volume's files, on its machine: every instance that links it sees this folder."""
        return self.root / "volumes" / str(volume_id)

    def _volume_offers(self, q: dict) -> list[dict]:
        q = dict(q)
        storage = float(q.pop("allocated_storage", 1.0))
        order = q.pop("order", [["score", "desc"]])
        limit = q.pop("limit", None)
        found = []
        for offer in self.offers:
            used = sum(v["disk_space"] for v in self.volumes.values() if v["machine_id"] == offer["machine_id"])
            row = {"id": offer["id"] + 8000, "ask_contract_id": offer["id"] + 8000, "machine_id": offer["machine_id"],
                   "host_id": offer["host_id"], "disk_space": offer["disk_space"] - used,
                   "storage_cost": offer["storage_cost"],
                   "storage_total_cost": storage_hr(offer["storage_cost"], storage),
                   "reliability": offer["reliability"], "reliability2": offer["reliability"],
                   "verified": offer["verified"], "verification": offer["verification"], "external": False,
                   "geolocation": offer["geolocation"], "inet_down": offer["inet_down"], "inet_up": offer["inet_up"],
                   "cuda_max_good": offer["cuda_max_good"], "start_date": time.time() - 86400, "score": offer["score"]}
            if matches(row, q):
                found.append(row)
        for name, direction in reversed(order):
            found.sort(key=lambda r: r.get(name, 0), reverse=direction == "desc")
        return found[: int(limit)] if limit else found

    def _rent_volume(self, body: dict):
        size, name = body.get("size"), body.get("name")
        offer = next((o for o in self._volume_offers({}) if o["id"] == body.get("id")), None)
        if offer is None:
            return 404, {"success": False, "error": "no_such_ask", "msg": f"Volume offer {body.get('id')} not found."}
        if not isinstance(size, int) or not 0 < size <= offer["disk_space"]:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": f"size must be 1 to {offer['disk_space']:.0f} GB on this machine"}
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_]{1,64}", str(name)):
            return 400, {"success": False, "error": "invalid_args",
                         "msg": "name must be alphanumeric with underscores, at most 64 characters"}
        vid = self._next_volume
        self._next_volume += 1
        self.volumes[vid] = {"id": vid, "label": name, "disk_space": float(size), "machine_id": offer["machine_id"],
                             "host_id": offer["host_id"], "status": "running", "start_date": time.time(),
                             "storage_total_cost": storage_hr(offer["storage_cost"], size),
                             "geolocation": offer["geolocation"], "instances": []}
        self.volume_dir(vid).mkdir(parents=True)
        return 200, {"success": True, "volume_name": f"V.{vid}"}

    def _delete_volume(self, vid):
        try:
            row = self.volumes.get(int(vid))
        except (TypeError, ValueError):
            return 400, {"success": False, "error": "invalid_args", "msg": "Please provide a valid volume ID."}
        if row is None:
            return 404, {"success": False, "error": "no_such_volume", "msg": "Volume with that ID does not exist."}
        if row["instances"]:
            return 400, {"success": False, "error": "volume_in_use",
                         "msg": "Destroy every instance using this volume before deleting it."}
        del self.volumes[int(vid)]
        shutil.rmtree(self.volume_dir(int(vid)), ignore_errors=True)
        return 200, {"success": True}

    def _linked(self, offer: dict, body: dict):
        """The volume an instance create links, checked: (volume row, mount path), None, or a refusal."""
        info = body.get("volume_info")
        if not info:
            return None
        if info.get("create_new"):
            return 400, {"success": False, "error": "invalid_args", "msg": "This fake links existing volumes only."}
        row = self.volumes.get(info.get("volume_id"))
        if row is None:
            return 404, {"success": False, "error": "no_such_volume", "msg": "Volume with that ID does not exist."}
        if row["machine_id"] != offer["machine_id"]:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": f"Volume {row['id']} is on machine {row['machine_id']}, not {offer['machine_id']}."}
        return row, str(info.get("mount_path"))

    # -- instances -------------------------------------------------------------------------
    def _create(self, offer_id: int, body: dict):
        offer = next((o for o in self.offers if o["id"] == offer_id), None)
        if offer is None or offer["rented"] or not offer["rentable"]:
            return 404, {"success": False, "error": "no_such_ask",
                         "msg": f"Instance type by id {offer_id} is not available."}
        if not body.get("image"):
            return 200, {"success": False, "error": "invalid_args", "msg": "image is required"}
        disk = float(body.get("disk") or 10)
        if disk > offer["disk_space"]:
            return 200, {"success": False, "error": "invalid_args",
                         "msg": f"disk {disk} GB exceeds the {offer['disk_space']} GB this machine offers"}
        bid = body.get("price")
        linked = self._linked(offer, body)
        if linked is not None and not isinstance(linked[0], dict):
            return linked  # refused
        if offer_id in self._taken:
            self._taken.discard(offer_id)
            offer["rented"] = True  # someone else's now; the catalog catches up
            if body.get("cancel_unavail"):
                # The CLI's help: "Return error if scheduling fails". Its code is not documented.
                return 200, {"success": False, "error": "resources_unavailable",
                             "msg": f"Machine for offer {offer_id} is no longer available; not created "
                                    "(cancel_unavail)."}
            # "... rather than creating a stopped instance": it exists, bills its disk, and its GPU
            # is the other renter's for as long as they keep it.
            iid = self._new_instance(offer, body, bid, holds_offer=False)
            self._private[iid]["gpu"] = {"polls": None, "until": None}
            self.instances[iid].update(intended_status="stopped", next_state="stopped", cur_state="stopped",
                                       actual_status="stopped")
            return 200, {"success": True, "new_contract": iid}
        offer["rented"] = True
        iid = self._new_instance(offer, body, bid, holds_offer=True, linked=linked)
        if bid is not None and bid < offer["min_bid"]:
            # dstack's client: a bid that is too low still creates the instance, stopped, and the
            # answer is an error carrying its id. (The code is not documented.)
            self._private[iid]["rival"] = offer["min_bid"]
            self.instances[iid].update(intended_status="stopped", next_state="stopped", cur_state="stopped",
                                       actual_status="stopped", status_msg="outbid")
            return 200, {"success": False, "error": "insufficient_bid", "new_contract": iid,
                         "msg": f"Your bid {bid} is below the minimum bid {offer['min_bid']} for this machine."}
        return 200, {"success": True, "new_contract": iid}

    def _new_instance(self, offer: dict, body: dict, bid: float | None, holds_offer: bool, linked=None) -> int:
        iid = self._next_id
        self._next_id += 1
        disk = float(body.get("disk") or 10)
        env = body.get("env") or {}
        container_key = "ck-" + secrets.token_hex(12)
        host_env = {k: str(v) for k, v in env.items()}
        host_env.update({
            "CONTAINER_ID": str(iid), "CONTAINER_API_KEY": container_key, "VAST_CONTAINERLABEL": f"C.{iid}",
            # Real containers have no VAST_URL; here it keeps self-stop calls on this fake.
            "VAST_URL": self.url,
        })
        # A Vast.ai instance keeps its whole disk across a stop; the container's environment is not
        # exported to SSH sessions (hosts.py).
        volume, at = (self.volume_dir(linked[0]["id"]), linked[1]) if linked else (None, None)
        host = Host(self.root / str(iid), env=host_env, keep_container_disk=True, volume=volume, mount_path=at)
        if linked:
            linked[0]["instances"].append(iid)
        silent = Silent(host.address)  # the firewalled direct port (bound first: the sshd's port differs)
        port = free_port(host.address)
        relay = Relay((host.address, port), address=PROXY_HOST)
        direct = port if self.direct_works else silent.port
        host.env.update({"PUBLIC_IPADDR": host.address, "VAST_TCP_PORT_22": str(direct)})
        disk_hr = storage_hr(offer["storage_cost"], disk)
        self.instances[iid] = {
            "id": iid, "machine_id": offer["machine_id"], "host_id": offer["host_id"],
            "actual_status": None, "intended_status": "running", "cur_state": "running",
            "next_state": "running", "status_msg": None, "label": body.get("label"),
            "num_gpus": offer["num_gpus"], "gpu_name": offer["gpu_name"], "gpu_ram": offer["gpu_ram"],
            "gpu_totalram": offer["gpu_total_ram"], "cpu_cores": offer["cpu_cores"], "cpu_ram": offer["cpu_ram"],
            "image_uuid": body["image"], "image_runtype": body.get("runtype"), "onstart": body.get("onstart"),
            "ssh_host": PROXY_HOST, "ssh_port": relay.port, "ssh_idx": "253",
            "public_ipaddr": host.address, "ports": {},
            "is_bid": bid is not None, "min_bid": offer["min_bid"], "storage_cost": offer["storage_cost"],
            "storage_total_cost": disk_hr, "dph_base": offer["dph_base"],
            "dph_total": round((bid if bid is not None else offer["dph_base"]) + disk_hr, 6),
            "disk_space": disk, "start_date": time.time(), "end_date": None,
            "extra_env": [[k, str(v)] for k, v in env.items()],
            "geolocation": offer["geolocation"], "reliability2": offer["reliability"],
            "inet_down": offer["inet_down"], "inet_up": offer["inet_up"],
            "direct_port_count": offer["direct_port_count"], "cuda_max_good": offer["cuda_max_good"],
        }
        self._private[iid] = {
            "host": host, "silent": silent, "relay": relay, "port": port, "direct": direct,
            "container_key": container_key, "instance_id": f"vast{iid}-{uuid.uuid4().hex[:8]}",
            "polls": 0, "gone_polls": 0, "offer": offer, "holds_offer": holds_offer, "bid": bid,
            "gpu": None, "rival": None, "keys": [], "destroyed": False,
        }
        return iid

    def _advance(self, iid: int, look: bool) -> None:
        """What time (and, for ``look``, one more GET of this instance) does to it."""
        row, own = self.instances[iid], self._private[iid]
        if own["destroyed"] or row["intended_status"] != "running":
            return
        if row["cur_state"] == "stopped":  # scheduling: waits for the host to free its GPU
            if not self._gpu_free(own, look):
                return
            own["gpu"], own["polls"] = None, 0
            row.update(cur_state="running", actual_status="loading", status_msg=None)
        if look and row["cur_state"] == "running" and row["actual_status"] in (None, "loading"):
            own["polls"] += 1
            if own["polls"] >= self.boot_polls:
                self._boot(iid)
            else:
                row["actual_status"] = "loading"

    def _gpu_free(self, own: dict, look: bool) -> bool:
        if own["rival"] is not None and (own["bid"] or 0) <= own["rival"]:
            return False  # a higher bid holds the GPU
        gpu = own["gpu"]
        if gpu is None:
            return True
        if gpu["until"] is not None:
            return time.monotonic() >= gpu["until"]
        if gpu["polls"] is None:
            return False  # for ever
        if gpu["polls"] <= 0:
            return True
        if look:
            gpu["polls"] -= 1
        return False

    def _show(self, iid: int):
        row = self.instances.get(iid)
        if row is None:
            return 200, {"instances": None}
        own = self._private[iid]
        if own["destroyed"]:
            own["gone_polls"] += 1
            if own["gone_polls"] > self.destroy_polls:
                return 200, {"instances": None}
            return 200, {"instances": copy.deepcopy(row)}
        self._advance(iid, look=True)
        return 200, {"instances": copy.deepcopy(row)}

    def _list(self, query: dict):
        filters = query.get("select_filters") or {}
        for iid in list(self.instances):
            self._advance(iid, look=False)
        rows = [r for r in self.live() if matches(r, filters)]
        rows.sort(key=lambda r: r["id"])
        after = query.get("after_token")
        if after:
            rows = [r for r in rows if r["id"] > int(after)]
        limit = int(query.get("limit") or 25)
        if self.page_limit:
            limit = min(limit, self.page_limit)
        page = rows[:limit]
        token = str(page[-1]["id"]) if len(rows) > limit else None
        return 200, {"instances": copy.deepcopy(page), "next_token": token,
                     "total_instances": len(self.live())}

    def _found(self, iid: int) -> dict | None:
        row = self.instances.get(iid)
        return None if row is None or self._private[iid]["destroyed"] else row

    def _update(self, iid: int, body: dict):
        row = self._found(iid)
        if row is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        own = self._private[iid]
        if "label" in body:
            row["label"] = body["label"]
        state = body.get("state")
        if state == "stopped":
            self._kill(iid)
            own["gpu"] = None  # the stop gives up any wait for the GPU
            row.update(intended_status="stopped", next_state="stopped", cur_state="stopped", actual_status="stopped",
                       status_msg=None, ports={})
        elif state == "running":
            running = row["intended_status"] == "running" and row["actual_status"] in ("running", "loading", None)
            if not (running or self.scheduling(iid)):
                # Accepted at once; it runs when its host has the GPU free (see the module docstring).
                self._kill(iid)
                if own["gpu"] is None:
                    own["gpu"] = {"polls": self.scheduling_polls, "until": None}
                row.update(intended_status="running", next_state="running", cur_state="stopped",
                           actual_status="stopped", status_msg=None, ports={})
        elif state is not None:
            return 200, {"success": False, "error": "invalid_args", "msg": f"unknown state {state!r}"}
        return 200, {"success": True}

    def _destroy(self, iid: int):
        row = self._found(iid)
        if row is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        own = self._private[iid]
        self._release(own)
        shutil.rmtree(self.root / str(iid), ignore_errors=True)
        if own["holds_offer"]:
            own["offer"]["rented"] = False
        own["destroyed"] = True
        for volume in self.volumes.values():  # its volume is free again
            volume["instances"] = [i for i in volume["instances"] if i != iid]
        # docs "show instance": cur_state "unloaded (released on destroy)".
        row.update(cur_state="unloaded", intended_status="stopped", next_state="stopped", actual_status="stopped",
                   ports={})
        return 200, {"success": True}

    def _attach(self, iid: int, body: dict):
        if self._found(iid) is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        key = (body.get("ssh_key") or "").strip()
        if not key.startswith(("ssh-", "ecdsa-")):
            return 200, {"success": False, "error": "invalid_args", "msg": "Invalid SSH key."}
        own = self._private[iid]
        own["keys"].append(key)
        if own["host"].running():
            own["host"].add_authorized_key(key)
        return 200, {"success": True, "msg": "SSH key attached to instance."}

    def _change_bid(self, iid: int, body: dict):
        row = self._found(iid)
        if row is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        price = body.get("price")
        if not isinstance(price, (int, float)):
            return 200, {"success": False, "error": "invalid_args", "msg": "price must be a number"}
        own = self._private[iid]
        own["bid"] = price
        row["dph_total"] = round(price + row["storage_total_cost"], 6)
        if own["rival"] is not None and price > own["rival"]:
            own["rival"] = None
            if row["status_msg"] == "outbid":  # raising the bid resumes it, through scheduling
                own["gpu"] = {"polls": self.scheduling_polls, "until": None}
                row.update(intended_status="running", next_state="running", cur_state="stopped",
                           actual_status="stopped", status_msg=None)
        return 200, {"success": True}

    # -- the "machine" ---------------------------------------------------------------------
    def _boot(self, iid: int) -> None:
        row, own = self.instances[iid], self._private[iid]
        host = own["host"]
        host.boot(port=own["port"])
        for key in own["keys"]:
            host.add_authorized_key(key)
        row.update(actual_status="running", status_msg="running",
                   ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(own["direct"])},
                                     {"HostIp": "::", "HostPort": str(own["direct"])}]})

    def _kill(self, iid: int) -> None:
        own = self._private.get(iid)
        if own:
            own["host"].halt()

    @staticmethod
    def _release(own: dict) -> None:
        own["host"].destroy()
        own["relay"].close()
        own["silent"].close()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeVast
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        query = {}
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            try:
                query[k] = json.loads(v)
            except ValueError:
                query[k] = v
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        status, payload, ctype, headers = self.fake.handle(self.command, parts.path, query, body,
                                                           self.headers.get("Authorization"))
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # a client that stopped its own instance may be gone before the answer

    do_GET = do_PUT = do_POST = do_DELETE = _serve
