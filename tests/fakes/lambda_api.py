"""A fake Lambda Cloud API v1 on 127.0.0.1 whose instances are real sshd hosts (tests/fakes/hosts.py).

Built from Lambda's published OpenAPI description (https://cloud.lambda.ai/api/v1/openapi.json,
v1.10.0; the copy read is api-evangelist/lambda-labs openapi/lambda-labs-instances-api-openapi.yml and
lambda-labs-ssh-keys-api-openapi.yml), cited as "spec" below; nothing here comes from orch.

- Paths live under ``/api/v1``; every success is ``{"data": ...}``, every failure
  ``{"error": {"code", "message", "suggestion"}}`` with the spec's codes (spec: "Response types").
- Auth is ``Authorization: Bearer KEY`` or HTTP Basic with the key as user (spec securitySchemes).
  A missing key and a wrong one both answer 401 ``global/invalid-api-key``, with the two messages
  the live API gave on 2026-09-13 (the "lambdalabs" recipe that struck it, read in the code corpus).
- A launch takes ``region_name``, ``instance_type_name`` and exactly one existing key in
  ``ssh_key_names`` (spec InstanceLaunchRequest) and answers ``{"instance_ids": [...]}``. A region
  without capacity for the type answers 400 ``instance-operations/launch/insufficient-capacity``
  (spec ApiErrorInsufficientCapacity); an unknown type or key 404 ``global/object-does-not-exist``.
- A launch makes one instance: v1.10.0's InstanceLaunchRequest has no ``quantity`` (the field the
  v1.5.1 reference had), and a body with it is refused as a field the schema does not define
  (below). Short of capacity (``capacity[(type, region)]``, how many more a region can launch), a
  launch answers insufficient-capacity and makes none.
- The account's instance quota (``quota``: how many live instances it may hold) refuses a launch
  past it with 400 ``global/quota-exceeded`` (spec launchInstance 400, ApiErrorQuotaExceeded:
  "Quota exceeded.", "Contact Support to increase your quota.").
- ``POST /instances/{id}`` with ``name`` renames an instance (spec postInstance, "Update instance
  details", InstanceModificationRequest: at most 64 characters) and answers the instance.
- Launches are limited to one per 12 seconds (spec description: "one request per 12 seconds, or
  five requests per minute"): a faster one answers 429. The spec documents no 429 body; SkyPilot's
  client (sky/provision/lambda_cloud/lambda_utils.py) reads only the status, and this fake answers
  plain text so a client that parses it breaks here first. ``launch_interval`` shortens it for tests.
- Instances go ``booting`` -> ``active`` (with ``ip``; "ip is not guaranteed present until late in
  boot") and, on terminate, ``terminating`` -> gone: the listing holds "your running instances"
  and a gone id answers 404 ``global/object-does-not-exist`` (spec ApiErrorInstanceNotFound).
  ``unhealthy`` and ``preempted`` are in the spec's InstanceStatus: ``break_host``/``preempt`` set them.
- An instance row carries ``jupyter_token`` and ``jupyter_url`` (spec Instance), a login to it.
- ``unhealthy`` is not final (SkyPilot's sky/provision/lambda_cloud/instance.py maps it to INIT, a
  state that goes on): ``break_host(id, reads=N)`` makes an instance unhealthy for N reads, then
  active again; ``/instance-operations/restart`` (spec restartInstance) reboots an unhealthy one
  back to active unless ``restart_cures`` is False.
- A launch has no idempotency token (spec InstanceLaunchRequest has none), so a launch whose answer
  is lost made an instance all the same: ``lose_launch_answers`` (next N launches make the instance,
  then answer 500). A new instance may be missing from ``GET /instances`` and ``/instances/{id}``
  for its first reads (``visibility_lag``), as RunPod's listings lag a create (Transformer Lab's
  client retries its lookup "to absorb listing lag").
- The launch's 403s (spec launchInstance 403): ``account_refusal`` set to
  ``global/account-inactive`` or ``global/invalid-address`` answers each with the spec's
  message and suggestion.
- Filesystems (spec "Filesystems": listFilesystems, createFilesystem, filesystemDelete; and
  launchInstance): ``GET /file-systems``, ``POST /filesystems {name, region}`` (name
  ``^[a-zA-Z]+[0-9a-zA-Z-]*$``, at most 60; a name taken answers 400 ``global/duplicate``),
  ``DELETE /filesystems/{id}`` (400 ``filesystems/filesystem-in-use`` while an instance that is not
  terminated mounts it, 404 ``global/object-does-not-exist`` when there is none). A launch's
  ``file_system_names`` must exist (404) and be in the launch's region (400
  ``instance-operations/launch/file-system-in-wrong-region``); ``file_system_mounts`` puts one at
  its ``mount_point``, which must match ``^(/home|/lambda/nfs|/data)[//a-zA-Z0-9-]*$`` (400
  ``global/invalid-parameters``), else it is at the filesystem's ``mount_point``,
  ``/lambda/nfs/NAME``. Every instance that mounts one sees the same folder (an NFS share). The
  hosts here mount one filesystem each: a launch with more is refused.
  ``bytes_used`` is what the folder holds, or what ``bytes_used[id]`` says (spec Filesystem:
  "The approximate amount of storage used by the filesystem in bytes. This estimate is updated
  every few hours"; billed per GB used, lambda.ai/pricing "Persistent storage").
- Every request body is checked against the request schema of its operation in the published
  description, vendored verbatim as tests/fakes/lambda_openapi.json (Lambda Cloud API v1.10.0,
  https://docs.lambda.ai/api/cloud/spec.json, served as https://cloud.lambda.ai/api/v1/openapi.json;
  the copy taken from api-evangelist/lambda-labs, openapi/lambda-labs-openapi.json at commit 9589c61,
  "mirrored from https://docs.lambda.ai/api/cloud/spec.json", 2026-05-23). A body the schema refuses
  answers 400 ``global/invalid-parameters`` naming what is wrong. A field the schema does not define
  (the description declares no ``additionalProperties``, so the live API may well ignore it) is
  refused the same way here and recorded in ``undefined_fields``, and leaving the fake with one
  recorded fails the test: a test cannot pass on a field the real API would not act on.
- SSH: the key named at launch is root's authorized key (Lambda Stack puts it in ``ubuntu``'s; these
  hosts have only root) and sshd listens on port 22 of the instance's ``ip``, as on Lambda: run the
  fake in a network namespace of its own (tests/netns.py), where port 22 of a 127.x address is free.

    with FakeLambda(tmp_path) as fake:
        LAMBDA_API_BASE_URL=fake.url LAMBDA_API_KEY=fake.key
"""

from __future__ import annotations

import base64
import copy
import json
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.hosts import Host

SPEC = Path(__file__).with_name("lambda_openapi.json")
HOST = "127.0.0.1"
PREFIX = "/api/v1"
SSH_PORT = 22
# A "private" address where nothing listens: a client that dials it never leaves loopback.
PRIVATE_IP = "127.0.0.254"


def _type(name, description, gpu_description, cents, gpus, vcpus, memory, storage, regions):
    return {"instance_type": {"name": name, "description": description, "gpu_description": gpu_description,
                              "price_cents_per_hour": cents,
                              "specs": {"vcpus": vcpus, "memory_gib": memory, "storage_gib": storage, "gpus": gpus}},
            "regions_with_capacity_available": [{"name": r, "description": REGIONS[r]} for r in regions]}


REGIONS = {"us-east-1": "Virginia, USA", "us-west-1": "California, USA", "us-south-1": "Texas, USA",
           "us-midwest-1": "Illinois, USA"}


def default_types() -> dict[str, dict]:
    """A catalog shaped like the spec's InstanceTypes example (names and descriptions in Lambda's style)."""
    return {
        "gpu_1x_a10": _type("gpu_1x_a10", "1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75, 1, 30, 200, 1400,
                            ["us-east-1", "us-west-1"]),
        "gpu_1x_a100_sxm4": _type("gpu_1x_a100_sxm4", "1x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 129, 1, 30, 200,
                                  512, ["us-south-1"]),
        "gpu_1x_h100_pcie": _type("gpu_1x_h100_pcie", "1x H100 (80 GB PCIe)", "H100 (80 GB PCIe)", 249, 1, 26, 200,
                                  1024, []),
        "gpu_8x_h100_sxm5": _type("gpu_8x_h100_sxm5", "8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 2392, 8, 208, 1800,
                                  24780, ["us-midwest-1"]),
        "gpu_2x_a6000": _type("gpu_2x_a6000", "2x A6000 (48 GB)", "A6000 (48 GB)", 160, 2, 28, 100, 1024,
                              ["us-west-1"]),
    }


def _closed(node: Any) -> Any:
    """The schema ``node`` with every object that lists its ``properties`` (and says nothing of others)
    closed to them: a field the description does not define is then an error to report."""
    if isinstance(node, list):
        return [_closed(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if isinstance(out.get("properties"), dict) and not {"additionalProperties", "patternProperties", "allOf",
                                                         "unevaluatedProperties"} & set(out):
        out["additionalProperties"] = False
    return out


def request_schemas() -> list[tuple[str, re.Pattern, Any]]:
    """(method, path regex after /api/v1, validator) for every operation of the vendored description
    that takes a JSON body."""
    from jsonschema import Draft202012Validator

    spec = json.loads(SPEC.read_text())
    components = _closed(spec.get("components") or {})
    out = []
    for path, ops in spec["paths"].items():
        regex = re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path[len(PREFIX):])) + "$")
        for method, op in ops.items():
            content = ((op.get("requestBody") or {}).get("content") or {}) if isinstance(op, dict) else {}
            schema = (content.get("application/json") or {}).get("schema")
            if schema:
                out.append((method.upper(), regex, Draft202012Validator({**_closed(schema), "components": components})))
    return out


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    status: int = 0


def _error(code: str, message: str, suggestion: str | None = None) -> dict:
    err = {"code": code, "message": message}
    if suggestion:
        err["suggestion"] = suggestion
    return {"error": err}


class FakeLambda:
    """The fake server and its state. Knobs are plain attributes and the methods under "knobs"."""

    def __init__(self, tmp: Path, *, boot_polls: int = 1, terminate_polls: int = 1, launch_interval: float = 12.0):
        self.root = Path(tmp) / "lambda"
        self.key = "secret_" + secrets.token_hex(16)
        self.types: dict[str, dict] = default_types()
        self.boot_polls = boot_polls  # GETs an instance spends booting
        self.terminate_polls = terminate_polls  # GETs a terminated instance still shows as terminating
        self.launch_interval = launch_interval
        self.lose_launch_answers = 0
        self.visibility_lag = 0
        self.account_refusal: str | None = None
        self.restart_cures = True
        self.boot_unhealthy_reads = 0  # a new instance is unhealthy for its first N reads after booting
        self.capacity: dict[tuple[str, str], int] = {}  # (type, region) -> instances it can still launch
        self.quota: int | None = None  # live instances the account may hold
        self.instances: dict[str, dict] = {}
        self.ssh_keys: list[dict] = []
        self.filesystems: dict[str, dict] = {}  # id -> the spec's Filesystem, less bytes_used (measured)
        self.bytes_used: dict[str, int] = {}  # id -> the bytes_used reported instead of the folder's measure
        self.requests: list[Recorded] = []
        self._hosts: dict[str, Host] = {}
        self._polls: dict[str, int] = {}
        self._faults: list[tuple[str | None, re.Pattern, int, bytes, str, int]] = []
        self._taken: list[tuple[str, str]] = []  # capacity that disappears at the next launch
        self._last_launch = float("-inf")
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._schemas = request_schemas()
        self.undefined_fields: list[str] = []  # "METHOD path: field" the description does not define

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "FakeLambda":
        self.root.mkdir(parents=True, exist_ok=True)

        class Handler(_Handler):
            fake = self

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        # A short poll: shutdown() (each test's end) waits for the loop's next wake, 0.5 s by default.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        for host in list(self._hosts.values()):
            host.destroy()
        if exc[0] is None and self.undefined_fields:
            raise AssertionError("orch sent Lambda fields its API description (v1.10.0) does not define: "
                                 + "; ".join(self.undefined_fields))

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}{PREFIX}"

    # -- knobs ---------------------------------------------------------------------------
    def inject(self, status: int, body: dict | str, *, method: str | None = None, path: str = r".*",
               times: int = 1) -> None:
        """The next ``times`` requests matching ``method`` and the ``path`` regex (after /api/v1) answer this."""
        raw, ctype = (json.dumps(body).encode(), "application/json") if isinstance(body, dict) else \
            (body.encode(), "text/plain")
        with self._lock:
            self._faults.append((method, re.compile(path), status, raw, ctype, times))

    def take_capacity(self, type_name: str, region: str) -> None:
        """Someone else takes the last machine of ``type_name`` in ``region`` just before the next launch."""
        self._taken.append((type_name, region))

    def preempt(self, instance_id: str) -> None:
        with self._lock:
            self._halt(instance_id)
            self.instances[instance_id]["status"] = "preempted"

    def break_host(self, instance_id: str, reads: int | None = None) -> None:
        """Unhealthy: for ever, or for the next ``reads`` reads of it (then active again)."""
        with self._lock:
            self._halt(instance_id)
            self.instances[instance_id]["status"] = "unhealthy"
            self.instances[instance_id]["_sick_reads"] = reads

    def live(self) -> list[dict]:
        """Instances that exist and bill: not terminated, not on their way out, not taken back by Lambda."""
        return [r for r in self.instances.values() if r["status"] not in ("terminating", "terminated", "preempted")]

    def calls(self, method: str, path_regex: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and re.search(path_regex, r.path)]

    def host(self, instance_id: str) -> Host:
        return self._hosts[instance_id]

    # -- requests ------------------------------------------------------------------------
    def handle(self, method: str, path: str, body: Any, auth: str | None) -> tuple[int, bytes, str, dict]:
        record = Recorded(method, path, body)
        with self._lock:
            self.requests.append(record)
            for i, (m, pattern, status, raw, ctype, times) in enumerate(self._faults):
                if m in (None, method) and pattern.search(path):
                    if times <= 1:
                        self._faults.pop(i)
                    else:
                        self._faults[i] = (m, pattern, status, raw, ctype, times - 1)
                    record.status = status
                    return status, raw, ctype, {}
            status, answer = self._route(method, path, body, auth)
            record.status = status
            if isinstance(answer, str):
                return status, answer.encode(), "text/plain", {}
            return status, json.dumps(answer).encode(), "application/json", {}

    def _authorised(self, auth: str | None) -> tuple[bool, str]:
        auth = (auth or "").strip()
        if not auth:
            return False, "No API key was provided."
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer":
            token = value.strip()
        elif scheme.lower() == "basic":
            # spec basicAuth: "Basic <base64 of api_key:>" or "Basic <api_key>"
            try:
                token = base64.b64decode(value.strip(), validate=True).decode().split(":", 1)[0]
            except ValueError:
                token = value.strip()
        else:
            token = ""
        if token and secrets.compare_digest(token, self.key):
            return True, ""
        return False, "API key was invalid, expired, or deleted."

    def _route(self, method: str, path: str, body: Any, auth: str | None):
        ok, why = self._authorised(auth)
        if not ok:
            return 401, _error("global/invalid-api-key", why, "Check your API key or create a new one, then try again.")
        refused = self._against_schema(method, path, body)
        if refused is not None:
            return refused
        if method == "GET" and path == "/instance-types":
            return 200, {"data": copy.deepcopy(self.types)}
        if method == "GET" and path == "/instances":
            rows = []
            for iid in list(self.instances):
                if self._hidden(iid):
                    continue
                row = self._look(iid)
                if row is not None:
                    rows.append(row)
            return 200, {"data": rows}
        if m := re.fullmatch(r"/instances/([^/]+)", path):
            if method == "GET":
                row = None if self._hidden(m[1]) else self._look(m[1])
                if row is None:
                    return 404, _error("global/object-does-not-exist", "Specified instance does not exist.")
                return 200, {"data": row}
            if method == "POST":
                return self._rename(m[1], body if isinstance(body, dict) else {})
        if method == "POST" and path == "/instance-operations/launch":
            return self._launch(body if isinstance(body, dict) else {})
        if method == "POST" and path in ("/instance-operations/terminate", "/instance-operations/restart"):
            return self._operate(path.rsplit("/", 1)[1], body if isinstance(body, dict) else {})
        if path == "/ssh-keys":
            if method == "GET":
                return 200, {"data": copy.deepcopy(self.ssh_keys)}
            if method == "POST":
                return self._add_key(body if isinstance(body, dict) else {})
        if method == "GET" and path == "/file-systems":
            return 200, {"data": [self._filesystem(f) for f in self.filesystems.values()]}
        if method == "POST" and path == "/filesystems":
            return self._add_filesystem(body if isinstance(body, dict) else {})
        if (m := re.fullmatch(r"/filesystems/([^/]+)", path)) and method == "DELETE":
            return self._delete_filesystem(m[1])
        if (m := re.fullmatch(r"/ssh-keys/([^/]+)", path)) and method == "DELETE":
            before = len(self.ssh_keys)
            self.ssh_keys = [k for k in self.ssh_keys if k["id"] != m[1]]
            if len(self.ssh_keys) == before:
                return 404, _error("global/not-found", "The requested resource was not found.")
            return 200, {"data": {}}
        return 404, _error("global/not-found", "The requested resource was not found.")

    def _against_schema(self, method: str, path: str, body: Any):
        """The refusal of a body its operation's schema refuses (None: it passes, or takes no body)."""
        for m, regex, validator in self._schemas:
            if m == method and regex.match(path):
                errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
                if not errors:
                    return None
                for e in errors:
                    if e.validator == "additionalProperties":
                        where = "".join(f"[{p!r}]" for p in e.absolute_path)
                        extra = sorted(set(e.instance) - set(e.schema.get("properties") or {}))
                        self.undefined_fields += [f"{method} {path}: {where}{f!r}" if where else f"{method} {path}: {f}"
                                                  for f in extra]
                return 400, _error("global/invalid-parameters", "; ".join(e.message for e in errors)[:500])
        return None

    # -- instances -----------------------------------------------------------------------
    def _launch(self, body: dict):
        if self.account_refusal == "global/account-inactive":
            return 403, _error(self.account_refusal, "Your account is inactive.", "Make sure you have verified your "
                               "email address and have a valid payment method. Contact Support if problems continue.")
        if self.account_refusal == "global/invalid-address":
            return 403, _error(self.account_refusal, "Your billing address is invalid.", "Make sure your billing "
                               "address is valid. Contact Support if problems continue.")
        for field in ("region_name", "instance_type_name", "ssh_key_names"):
            if field not in body:
                return 400, _error("global/invalid-parameters", f"Missing required field: {field}.")
        names = body["ssh_key_names"]
        if not isinstance(names, list) or len(names) != 1:
            return 400, _error("global/invalid-parameters", "Exactly one SSH key must be specified.")
        name = body.get("name", "")
        if not isinstance(name, str) or len(name) > 64:
            return 400, _error("global/invalid-parameters", "name must be 64 characters or fewer.")
        now = time.monotonic()
        if now - self._last_launch < self.launch_interval:
            return 429, "Too Many Requests"
        self._last_launch = now
        itype = self.types.get(body["instance_type_name"])
        if itype is None:
            return 404, _error("global/object-does-not-exist", f"Instance type {body['instance_type_name']!r} "
                               "does not exist.", "Check the instance type name.")
        key = next((k for k in self.ssh_keys if k["name"] == names[0]), None)
        if key is None:
            return 404, _error("global/object-does-not-exist", f"SSH key {names[0]!r} does not exist.",
                               "Add the SSH key first.")
        region = body["region_name"]
        mounted = self._mounts(body, region)
        if isinstance(mounted, tuple):
            return mounted  # refused
        for taken in list(self._taken):
            self._taken.remove(taken)
            t, r = taken
            self.types[t]["regions_with_capacity_available"] = [
                x for x in self.types[t]["regions_with_capacity_available"] if x["name"] != r]
        left = self.capacity.get((body["instance_type_name"], region))
        if region not in [r["name"] for r in itype["regions_with_capacity_available"]] or \
                (left is not None and left < 1):
            return 400, _error("instance-operations/launch/insufficient-capacity",
                               "Not enough capacity to fulfill launch request.",
                               "Choose an instance type with more availability, or try again later.")
        if self.quota is not None and len(self.live()) + 1 > self.quota:
            return 400, _error("global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota.")
        if left is not None:
            self.capacity[(body["instance_type_name"], region)] = left - 1
        ids = [self._make(body, name, names, key, region, itype, mounted)]
        if self.lose_launch_answers > 0:  # made, and the answer lost on the way back
            self.lose_launch_answers -= 1
            return 500, _error("global/unknown", "Internal server error.")
        return 200, {"data": {"instance_ids": ids}}

    def _make(self, body: dict, name: str, names: list, key: dict, region: str, itype: dict, mounted: list) -> str:
        iid = secrets.token_hex(16)
        token = secrets.token_hex(16)
        self.instances[iid] = {
            "id": iid, "name": name, "status": "booting", "ssh_key_names": list(names),
            "file_system_names": [f["name"] for f, _ in mounted],
            **({"file_system_mounts": [{"mount_point": at, "file_system_id": f["id"]} for f, at in mounted]}
               if mounted else {}),
            "region": {"name": region, "description": REGIONS.get(region, region)},
            "instance_type": copy.deepcopy(itype["instance_type"]),
            "jupyter_token": token,
            "jupyter_url": f"https://jupyter-{secrets.token_hex(16)}.lambdaspaces.com/?token={token}",
            "is_reserved": False,
            "actions": {a: {"available": a == "terminate"} for a in
                        ("migrate", "rebuild", "restart", "cold_reboot", "terminate")},
            "tags": [dict(t) for t in body.get("tags") or [] if isinstance(t, dict)],
            "_key": key["public_key"], "_image": body.get("image"),
            "_volume": (self.filesystem_dir(mounted[0][0]["id"]), mounted[0][1]) if mounted else None,
        }
        self._polls[iid] = 0
        self.instances[iid]["_hidden_reads"] = self.visibility_lag
        return iid

    def _rename(self, iid: str, body: dict):
        row = self.instances.get(iid)
        if row is None or row["status"] == "terminated":
            return 404, _error("global/object-does-not-exist", "Specified instance does not exist.")
        name = body.get("name")
        if not isinstance(name, str) or len(name) > 64:
            return 400, _error("global/invalid-parameters", "name must be 64 characters or fewer.")
        row["name"] = name
        return 200, {"data": {k: copy.deepcopy(v) for k, v in row.items() if not k.startswith("_")}}

    def _hidden(self, iid: str) -> bool:
        """A new instance not visible yet (``visibility_lag``): this read misses it."""
        row = self.instances.get(iid)
        if row is None or not row.get("_hidden_reads"):
            return False
        row["_hidden_reads"] -= 1
        return True

    def _look(self, iid: str) -> dict | None:
        """The instance as a GET shows it now (each look moves a booting or terminating one on)."""
        row = self.instances.get(iid)
        if row is None or row["status"] == "terminated":
            return None
        self._polls[iid] = self._polls.get(iid, 0) + 1
        if row["status"] == "booting" and self._polls[iid] >= self.boot_polls:
            self._boot(iid)
            if self.boot_unhealthy_reads:
                self.break_host(iid, reads=self.boot_unhealthy_reads)
        elif row["status"] == "unhealthy" and row.get("_sick_reads") is not None:
            if row["_sick_reads"] <= 0:
                self._boot(iid)  # healthy again
            else:
                row["_sick_reads"] -= 1
        elif row["status"] == "terminating" and self._polls[iid] > self.terminate_polls:
            row["status"] = "terminated"
            return None
        return {k: copy.deepcopy(v) for k, v in row.items() if not k.startswith("_")}

    def _boot(self, iid: str) -> None:
        row = self.instances[iid]
        host = self._hosts.get(iid)
        if host is None:
            volume, at = row["_volume"] or (None, None)
            host = self._hosts[iid] = Host(self.root / iid, keep_container_disk=True, volume=volume, mount_path=at)
        host.boot(port=SSH_PORT)
        host.add_authorized_key(row["_key"])
        row.update(status="active", ip=host.address, private_ip=PRIVATE_IP, hostname=host.address.replace(".", "-"))
        row["actions"] = {a: {"available": True} for a in row["actions"]}

    def _halt(self, iid: str) -> None:
        host = self._hosts.get(iid)
        if host is not None:
            host.halt()

    def _operate(self, verb: str, body: dict):
        ids = body.get("instance_ids")
        if not isinstance(ids, list) or not ids:
            return 400, _error("global/invalid-parameters", "instance_ids must be a non-empty list.")
        if any(i not in self.instances or self.instances[i]["status"] == "terminated" for i in ids):
            return 404, _error("global/object-does-not-exist", "Specified instance does not exist.")
        done = []
        for iid in ids:
            row = self.instances[iid]
            if verb == "terminate":
                host = self._hosts.pop(iid, None)
                if host is not None:
                    host.destroy()
                row["status"], self._polls[iid] = "terminating", 0
            elif row["status"] == "active":  # restart: the machine reboots, every process ends
                self._halt(iid)
                self._boot(iid)
            elif row["status"] == "unhealthy":
                if self.restart_cures:
                    self._boot(iid)
            done.append({k: copy.deepcopy(v) for k, v in row.items() if not k.startswith("_")})
        return 200, {"data": {"restarted_instances" if verb == "restart" else "terminated_instances": done}}

    # -- filesystems ---------------------------------------------------------------------
    def filesystem_dir(self, fs_id: str) -> Path:
        """The share every instance that mounts the filesystem sees."""
        return self.root / "filesystems" / fs_id

    def _in_use(self, name: str) -> bool:
        return any(name in r["file_system_names"] for r in self.instances.values() if r["status"] != "terminated")

    def _filesystem(self, fs: dict) -> dict:
        used = self.bytes_used.get(fs["id"])
        if used is None:
            used = sum(p.stat().st_size for p in self.filesystem_dir(fs["id"]).rglob("*") if p.is_file())
        return {**copy.deepcopy(fs), "is_in_use": self._in_use(fs["name"]), "bytes_used": used}

    def _add_filesystem(self, body: dict):
        name, region = body.get("name"), body.get("region")
        if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z]+[0-9a-zA-Z-]*", name) or len(name) > 60:
            return 400, _error("global/invalid-parameters", "Invalid filesystem name.")
        if region not in REGIONS:
            return 400, _error("global/invalid-parameters", f"Region {region!r} does not exist.")
        if any(f["name"] == name for f in self.filesystems.values()):
            return 400, _error("global/duplicate", f"A filesystem named {name!r} already exists.")
        fs_id = secrets.token_hex(16)
        self.filesystems[fs_id] = {
            "id": fs_id, "name": name, "mount_point": f"/lambda/nfs/{name}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "created_by": {"id": "user-1", "email": "tester@localhost", "status": "active"},
            "region": {"name": region, "description": REGIONS[region]}}
        self.filesystem_dir(fs_id).mkdir(parents=True)
        return 200, {"data": self._filesystem(self.filesystems[fs_id])}

    def _delete_filesystem(self, fs_id: str):
        fs = self.filesystems.get(fs_id)
        if fs is None:
            return 404, _error("global/object-does-not-exist", "Filesystem was not found.")
        if self._in_use(fs["name"]):
            return 400, _error("filesystems/filesystem-in-use", "Filesystem is in use.",
                               "Terminate the instances using this filesystem, then try again.")
        del self.filesystems[fs_id]
        shutil.rmtree(self.filesystem_dir(fs_id), ignore_errors=True)
        return 200, {"data": {"deleted_ids": [fs_id]}}

    def _mounts(self, body: dict, region: str):
        """[(filesystem, where it is mounted)] for a launch, or the refusal (status, answer)."""
        names = body.get("file_system_names") or []
        asked = {m.get("file_system_id"): m.get("mount_point") for m in body.get("file_system_mounts") or []
                 if isinstance(m, dict)}
        for at in asked.values():
            if not isinstance(at, str) or not re.fullmatch(r"(/home|/lambda/nfs|/data)[//a-zA-Z0-9-]*", at) \
                    or len(at) > 256:
                return 400, _error("global/invalid-parameters", f"Invalid mount point {at!r}.")
        by_name = {f["name"]: f for f in self.filesystems.values()}
        wanted = [by_name.get(n) for n in names] + [self.filesystems.get(i) for i in asked
                                                     if self.filesystems.get(i, {}).get("name") not in names]
        if any(f is None for f in wanted):
            return 404, _error("global/object-does-not-exist", "Filesystem was not found.")
        if len(wanted) > 1:
            return 400, _error("global/invalid-parameters", "This fake mounts one filesystem per instance.")
        for f in wanted:
            if f["region"]["name"] != region:
                return 400, _error("instance-operations/launch/file-system-in-wrong-region",
                                   f"Filesystem {f['name']!r} is in {f['region']['name']}, not in {region}.")
        return [(f, asked.get(f["id"]) or f["mount_point"]) for f in wanted]

    def _add_key(self, body: dict):
        name = body.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            return 400, _error("global/invalid-parameters", "name must be 1 to 64 characters.")
        if any(k["name"] == name for k in self.ssh_keys):
            return 400, _error("global/invalid-parameters", f"An SSH key named {name!r} already exists.")
        public = body.get("public_key")
        if public is None:
            return 400, _error("global/invalid-parameters", "This fake does not generate key pairs.")
        if not isinstance(public, str) or not public.startswith(("ssh-", "ecdsa-")) or len(public) > 4096:
            return 400, _error("global/invalid-parameters", "Invalid public key.")
        key = {"id": secrets.token_hex(16), "name": name, "public_key": public.strip()}
        self.ssh_keys.append(key)
        return 200, {"data": dict(key)}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLambda
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = parts.path
        if not path.startswith(PREFIX + "/"):
            status, payload, ctype, headers = 404, json.dumps(_error("global/not-found", "Not found.")).encode(), \
                "application/json", {}
        else:
            status, payload, ctype, headers = self.fake.handle(self.command, path[len(PREFIX):], body,
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
            pass

    do_GET = do_POST = do_DELETE = _serve
