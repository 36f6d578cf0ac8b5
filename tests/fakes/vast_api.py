"""A fake Vast.ai REST API on 127.0.0.1 whose instances are real sshd hosts.

Faithful to /work/shared/reference/providers.md where the real SDK and orch's provider look:
failures arrive as HTTP 200 with ``success: false``; the v1 listing pages by ``next_token``; an
instance row carries a numeric ``start_date`` and ``extra_env`` pairs (the SDK crashes without
them); ``ssh_host``/``ssh_port`` is a proxy, here an unconnectable loopback one, so only the
direct route (``public_ipaddr`` + ``ports["22/tcp"]``) reaches the sshd. ``price`` in a create
body is the bid: ``null`` rents on-demand, a number rents interruptible.

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
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.hosts import Host, free_port

HOST = "127.0.0.1"
# Vast's SSH proxy, faked where nothing listens: a client that uses it never leaves loopback.
PROXY_HOST = "127.0.0.253"
HOURS_PER_MONTH = 730.0


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
    """The fake server and its state. Knobs are plain attributes and the inject methods."""

    def __init__(self, tmp: Path, *, boot_polls: int = 2, destroy_polls: int = 1, page_limit: int | None = None,
                 direct_broken: bool = False):
        self.root = Path(tmp) / "vast"
        self.key = "vk-" + secrets.token_hex(12)
        self.offers: list[dict] = default_offers()
        self.boot_polls = boot_polls  # GETs an instance spends loading before it runs
        self.destroy_polls = destroy_polls  # GETs a destroyed instance still shows
        self.page_limit = page_limit  # caps the v1 listing's page size, to exercise next_token
        # A host whose direct port is firewalled: only the proxy (here the sshd itself) answers.
        self.direct_broken = direct_broken
        self.requests: list[Recorded] = []
        self.instances: dict[int, dict] = {}
        self._private: dict[int, dict] = {}  # per instance: sshd root, container key, polls...
        self._faults: list[Fault] = []
        self._start_refusals = 0
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
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        for own in list(self._private.values()):
            if own.get("host") is not None:
                own["host"].destroy()

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

    def refuse_start(self, times: int = 1) -> None:
        """The next ``times`` starts answer resources_unavailable (HTTP 200, success false)."""
        self._start_refusals += times

    def outbid(self, instance_id: int | str) -> None:
        """Someone bid more: the instance stops, its storage keeps billing."""
        iid = int(instance_id)
        with self._lock:
            self._kill(iid)
            self.instances[iid].update(actual_status="stopped", cur_state="stopped", status_msg="outbid",
                                       ports={})

    # -- helpers for tests -----------------------------------------------------------------
    def home(self, instance_id: int | str) -> Path:
        """root's home on the instance's disk (the container disk's writable layer), running or not."""
        return self._private[int(instance_id)]["host"].upper / "upper" / "root"

    def container_key(self, instance_id: int | str) -> str:
        return self._private[int(instance_id)]["container_key"]

    def calls(self, method: str, path_regex: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)]

    def live(self) -> list[dict]:
        return [i for i in self.instances.values() if i["intended_status"] != "destroyed"]

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
            return 200, {"offers": self._search(body or {})}
        if m := re.fullmatch(r"/api/v0/asks/(\d+)/", path):
            if method == "PUT":
                return self._create(int(m[1]), body or {})
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
            row = dict(offer, dph_total=round(offer["dph_base"] + offer["storage_cost"] * storage / HOURS_PER_MONTH, 6))
            if matches(row, q):
                found.append(row)
        for name, direction in reversed(order):
            found.sort(key=lambda r: r.get(name, 0), reverse=direction == "desc")
        return found[: int(limit)] if limit else found

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
        iid = self._next_id
        self._next_id += 1
        offer["rented"] = True
        storage_hr = offer["storage_cost"] * disk / HOURS_PER_MONTH
        env = body.get("env") or {}
        self.instances[iid] = {
            "id": iid, "machine_id": offer["machine_id"], "host_id": offer["host_id"],
            "actual_status": None, "intended_status": "running", "cur_state": "running",
            "next_state": "running", "status_msg": None, "label": body.get("label"),
            "num_gpus": offer["num_gpus"], "gpu_name": offer["gpu_name"], "gpu_ram": offer["gpu_ram"],
            "gpu_totalram": offer["gpu_total_ram"], "cpu_cores": offer["cpu_cores"], "cpu_ram": offer["cpu_ram"],
            "image_uuid": body["image"], "image_runtype": body.get("runtype"), "onstart": body.get("onstart"),
            "ssh_host": PROXY_HOST, "ssh_port": free_port(PROXY_HOST), "ssh_idx": "253",
            "public_ipaddr": HOST, "ports": {},
            "is_bid": bid is not None, "min_bid": offer["min_bid"], "storage_cost": offer["storage_cost"],
            "dph_base": offer["dph_base"],
            "dph_total": round((bid if bid is not None else offer["dph_base"]) + storage_hr, 6),
            "disk_space": disk, "start_date": time.time(), "end_date": None,
            "extra_env": [[k, str(v)] for k, v in env.items()],
            "geolocation": offer["geolocation"], "reliability2": offer["reliability"],
            "inet_down": offer["inet_down"], "inet_up": offer["inet_up"],
            "direct_port_count": offer["direct_port_count"], "cuda_max_good": offer["cuda_max_good"],
        }
        self._private[iid] = {
            "root": self.root / str(iid), "container_key": "ck-" + secrets.token_hex(12),
            "instance_id": f"vast{iid}-{uuid.uuid4().hex[:8]}", "port": None, "polls": 0, "gone_polls": 0,
            "offer": offer, "bid": bid,
        }
        self._private[iid]["keys"] = []
        if bid is not None and bid < offer["min_bid"]:
            self.instances[iid].update(actual_status="stopped", cur_state="stopped", status_msg="outbid")
        return 200, {"success": True, "new_contract": iid}

    def _show(self, iid: int):
        row = self.instances.get(iid)
        if row is None:
            return 200, {"instances": None}
        own = self._private[iid]
        if row["intended_status"] == "destroyed":
            own["gone_polls"] += 1
            if own["gone_polls"] > self.destroy_polls:
                return 200, {"instances": None}
            return 200, {"instances": copy.deepcopy(row)}
        if row["cur_state"] == "running" and row["actual_status"] in (None, "loading"):
            own["polls"] += 1
            if own["polls"] >= self.boot_polls:
                self._boot(iid)
            else:
                row["actual_status"] = "loading"
        return 200, {"instances": copy.deepcopy(row)}

    def _list(self, query: dict):
        filters = query.get("select_filters") or {}
        rows = [r for r in self.instances.values()
                if r["intended_status"] != "destroyed" and matches(r, filters)]
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

    def _update(self, iid: int, body: dict):
        row = self.instances.get(iid)
        if row is None or row["intended_status"] == "destroyed":
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        if "label" in body:
            row["label"] = body["label"]
        state = body.get("state")
        if state == "stopped":
            self._kill(iid)
            row.update(intended_status="stopped", cur_state="stopped", actual_status="exited", ports={})
        elif state == "running" and row["actual_status"] not in ("running", "loading"):
            if self._start_refusals:
                self._start_refusals -= 1
                return 200, {"success": False, "error": "resources_unavailable",
                             "msg": "Required resources are currently unavailable on this machine."}
            self._private[iid]["polls"] = 0
            row.update(intended_status="running", cur_state="running", actual_status="loading", status_msg=None)
        elif state not in (None, "running"):
            return 200, {"success": False, "error": "invalid_args", "msg": f"unknown state {state!r}"}
        return 200, {"success": True}

    def _destroy(self, iid: int):
        row = self.instances.get(iid)
        if row is None or row["intended_status"] == "destroyed":
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        own = self._private[iid]
        if own.get("host") is not None:
            own["host"].destroy()
        shutil.rmtree(own["root"], ignore_errors=True)
        own["offer"]["rented"] = False
        row.update(intended_status="destroyed", cur_state="stopped", actual_status="exited", ports={})
        return 200, {"success": True}

    def _attach(self, iid: int, body: dict):
        row = self.instances.get(iid)
        if row is None or row["intended_status"] == "destroyed":
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        key = (body.get("ssh_key") or "").strip()
        if not key.startswith(("ssh-", "ecdsa-")):
            return 200, {"success": False, "error": "invalid_args", "msg": "Invalid SSH key."}
        own = self._private[iid]
        own["keys"].append(key)
        if own.get("host") is not None and own["host"].running():
            own["host"].add_authorized_key(key)
        return 200, {"success": True, "msg": "SSH key attached to instance."}

    def _change_bid(self, iid: int, body: dict):
        row = self.instances.get(iid)
        if row is None or row["intended_status"] == "destroyed":
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {iid} not found."}
        price = body.get("price")
        if not isinstance(price, (int, float)):
            return 200, {"success": False, "error": "invalid_args", "msg": "price must be a number"}
        own = self._private[iid]
        own["bid"] = price
        row["dph_total"] = round(price + row["storage_cost"] * row["disk_space"] / HOURS_PER_MONTH, 6)
        if row["status_msg"] == "outbid" and price >= own["offer"]["min_bid"]:
            own["polls"] = 0
            row.update(actual_status="loading", cur_state="running", status_msg=None)
        return 200, {"success": True}

    # -- the "machine" ---------------------------------------------------------------------
    def _boot(self, iid: int) -> None:
        row, own = self.instances[iid], self._private[iid]
        env = {k: v for k, v in row["extra_env"]}
        env.update({
            "CONTAINER_ID": str(iid), "CONTAINER_API_KEY": own["container_key"], "VAST_CONTAINERLABEL": f"C.{iid}",
            # Real containers have no VAST_URL; here it keeps self-stop calls on this fake.
            "VAST_URL": self.url,
        })
        if own.get("host") is None:
            # A Vast.ai instance keeps its whole disk across a stop; the container's environment is
            # not exported to SSH sessions.
            own["host"] = Host(own["root"], env=env, keep_container_disk=True)
        host = own["host"]
        if own["port"] is None:
            own["port"] = free_port(host.address)
        host.env.update({"PUBLIC_IPADDR": host.address, "VAST_TCP_PORT_22": str(own["port"])})
        host.boot(port=own["port"])
        for key in own["keys"]:
            host.add_authorized_key(key)
        direct = own["port"]
        if self.direct_broken:
            direct = free_port(HOST)  # nothing listens there
            row.update(ssh_host=host.address, ssh_port=own["port"])
        row.update(actual_status="running", status_msg="running", public_ipaddr=host.address,
                   ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(direct)},
                                     {"HostIp": "::", "HostPort": str(direct)}]})

    def _kill(self, iid: int) -> None:
        own = self._private.get(iid)
        if own and own.get("host") is not None:
            own["host"].halt()


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
