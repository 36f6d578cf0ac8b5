"""A fake RunPod GraphQL API on 127.0.0.1 whose pods are real sshd hosts.

Faithful to the runpod SDK (1.11, ``runpod/api/graphql.py``, read after pip install) and RunPod's
GraphQL docs (docs.runpod.io, "GraphQL API") where tests can tell: POST /graphql with
``{"query": ...}`` and no variables, Bearer keys (401 on a bad one; a pod's own key works only on
that pod), errors in ``errors`` (HTTP 200 for refusals, 500 for "Something went wrong", 400 for
queries that do not parse or ask for fields that do not exist), 429 with an HTML body, ``runtime``
null until the "container" is up and then a private port-22 entry listed before the public one.
Pods are tests/fakes/hosts.py containers: a stop clears the container disk and keeps the volume
(``/workspace``), RunPod's images make new SSH host keys at every start. What else it models, and
where that is written:

- **CPU pods have no volume** (REST v2 openapi in runpod/docs, CreatePodRequest: "CPU pods support
  container disk and network volumes only"; PersistentMount: "Disallowed on CPU pods";
  ``deployCpuPodInput`` takes no ``volumeInGb``). They stop and start like GPU pods (REST v2
  ``POST /pods/{id}/action``: a stop releases "GPU/CPU compute"), and keep nothing across it.
- **Spot pods are gone**: ``podRentInterruptable`` and ``podBidResume`` were removed from the API
  on 2026-09-11 (runpodctl PR #267; gpuhunt commit 249b01c): asked for, they are what GraphQL
  answers for any field the schema lacks, a validation error.
- **CUDA**: a pod lands on a host whose driver reports some CUDA version; created without
  ``allowedCudaVersions`` (or ``minCudaVersion``, which dstack sends) it may land on an old one
  (``host_cudas[0]``, by default older than the default image's CUDA: omitting the filter is
  caught). There a GPU container whose image needs a newer CUDA never starts ("OCI runtime create
  failed", docs pods/manage-pods): ``desiredStatus`` RUNNING, ``runtime`` null, for ever. Matching
  is exact (REST v2 openapi, CreateGpuConfig.allowedCudaVersions); no host in the list is a
  capacity error. The fake reads the CUDA an image needs from its tag (``cuda12.4.1``,
  ``cu1281``); the real runtime reads the image's ``NVIDIA_REQUIRE_CUDA``.
- **Listing lag**: a new pod may be missing from ``myself { pods }`` for a while (Transformer
  Lab's client, api/transformerlab/compute_providers/runpod.py, retries its lookup "to absorb
  listing lag"; runpodctl issue #172 for the 500 after the pod was made). ``lookup_lag`` does the
  same to ``pod(input: {podId})`` for a new pod: it answers null for the next N lookups (the
  create's own answer still carries the pod, as RunPod's does).

- **Network volumes** (RunPod docs, "Network volumes", docs.runpod.io/storage/network-volumes, and
  "Storage options", docs.runpod.io/pods/storage/types; the GraphQL calls dstack's RunPod client
  sends, src/dstack/_internal/core/backends/runpod/api_client.py): ``createNetworkVolume(input:
  {name, size, dataCenterId})`` in a data center that has network storage (``dataCenters``'
  ``storageSupport``), size 1 to 4000 GB (REST v1 ``POST /networkvolumes``); ``deleteNetworkVolume(
  input: {id})``; ``myself { networkVolumes { id name size dataCenterId } }``. A pod deployed with
  ``networkVolumeId`` runs in the volume's data center (a ``dataCenterId`` naming another is
  refused; a GPU type out of stock there is no capacity), on Secure Cloud, with the volume in place
  of its volume disk at ``volumeMountPath`` (``/workspace`` when none is sent: the docs' default);
  every pod of the volume sees the same files. ``dataCenters { id name storageSupport listed
  gpuAvailability { gpuTypeId stockStatus available } }`` says which GPU types are in stock where
  (``data_centers`` sets it).

    with FakeRunPod(tmp_path) as fake:       # or the ``fake_runpod`` fixture
        os.environ["RUNPOD_API_BASE_URL"] = fake.url
        RunPodProvider(fake.settings())
"""

from __future__ import annotations

import getpass
import json
import random
import re
import secrets
import shutil
import string
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.hosts import Host, free_port

HOST = "127.0.0.1"
PRIVATE_IP = "127.0.0.254"  # the "private" address: loopback, and nothing listens there
NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")
NOT_ENOUGH_GPUS = "There are not enough free GPUs on the host machine to start this pod."
SOMETHING_WRONG = "Something went wrong. Please try again later or contact support."
RATE_LIMIT_HTML = "<html><head><title>429 Too Many Requests</title></head><body>Too Many Requests</body></html>"

# The CUDA versions of the hosts a GPU pod may land on, in the order RunPod would place one that
# names no CUDA: the first is older than the default image's 12.4 (see the module's docstring).
HOST_CUDAS = ["11.8", "12.8"]
_IMAGE_CUDA = re.compile(r"(?:^|[^a-z0-9])(?:cuda[-_:]?|cu)(\d{2})\.?(\d)")

DEFAULT_GPUS = [
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "maxGpuCount": 8,
     "securePrice": 0.69, "communityPrice": 0.34, "minimumBidPrice": 0.20, "stockStatus": "High"},
    {"id": "NVIDIA GeForce RTX 3090", "displayName": "RTX 3090", "memoryInGb": 24, "maxGpuCount": 8,
     "securePrice": 0.43, "communityPrice": 0.22, "minimumBidPrice": 0.11, "stockStatus": "Medium"},
    {"id": "NVIDIA RTX A6000", "displayName": "RTX A6000", "memoryInGb": 48, "maxGpuCount": 8,
     "securePrice": 0.76, "communityPrice": 0.49, "minimumBidPrice": 0.25, "stockStatus": "Low"},
    {"id": "NVIDIA A100 80GB PCIe", "displayName": "A100 PCIe", "memoryInGb": 80, "maxGpuCount": 8,
     "securePrice": 1.64, "communityPrice": 1.19, "minimumBidPrice": 0.60, "stockStatus": "Low"},
    {"id": "NVIDIA A100-SXM4-80GB", "displayName": "A100 SXM", "memoryInGb": 80, "maxGpuCount": 8,
     "securePrice": 1.89, "communityPrice": None, "minimumBidPrice": None, "stockStatus": None},
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80, "maxGpuCount": 8,
     "securePrice": 2.99, "communityPrice": 2.69, "minimumBidPrice": 1.75, "stockStatus": "Medium"},
]

# Data centers: which have network storage and which GPU types are in stock in each (an id of
# DEFAULT_GPUS). Every pod that names no data center lands wherever its GPU type is.
DEFAULT_DATA_CENTERS = [
    {"id": "EU-RO-1", "name": "Romania", "storageSupport": True,
     "stock": {"NVIDIA GeForce RTX 4090": "High", "NVIDIA RTX A6000": "Low", "NVIDIA H100 80GB HBM3": "Medium"}},
    {"id": "US-KS-2", "name": "Kansas", "storageSupport": True, "stock": {"NVIDIA GeForce RTX 3090": "Medium"}},
    {"id": "EU-SE-1", "name": "Sweden", "storageSupport": False, "stock": {"NVIDIA GeForce RTX 4090": "Low"}},
]

# Input fields each mutation accepts (a subset of RunPod's schema; anything else is a validation
# error, as on RunPod: ``deployCpuPodInput`` has no ``volumeInGb``).
_COMMON = {"name", "imageName", "cloudType", "containerDiskInGb", "dataCenterId", "networkVolumeId",
           "volumeMountPath", "ports", "env", "startSsh", "startJupyter", "templateId", "dockerArgs",
           "countryCode", "minDownload", "minUpload", "supportPublicIp", "deployCost", "terminateAfter"}
# ``minCudaVersion``: dstack sends it on podFindAndDeployOnDemand (src/dstack/_internal/core/
# backends/runpod/api_client.py); podResume takes allowedCudaVersions (docs sdks/graphql/manage-pods).
_GPU = _COMMON | {"gpuTypeId", "gpuCount", "volumeInGb", "minVcpuCount", "minMemoryInGb",
                  "allowedCudaVersions", "minCudaVersion", "cudaVersion", "stopAfter", "volumeKey"}
# No podRentInterruptable, no podBidResume: removed on 2026-09-11 (see the module's docstring).
INPUTS = {
    "podFindAndDeployOnDemand": ("PodFindAndDeployOnDemandInput", _GPU),
    "deployCpuPod": ("deployCpuPodInput", _COMMON | {"instanceId", "volumeKey"}),
    "podStop": ("PodStopInput", {"podId", "incrementVersion"}),
    "podResume": ("PodResumeInput", {"podId", "gpuCount", "syncMachine", "allowedCudaVersions"}),
    "podTerminate": ("PodTerminateInput", {"podId"}),
    "createNetworkVolume": ("CreateNetworkVolumeInput", {"name", "size", "dataCenterId"}),
    "deleteNetworkVolume": ("DeleteNetworkVolumeInput", {"id"}),
}
VOLUME_MUTATIONS = ("createNetworkVolume", "deleteNetworkVolume")


class GraphQLError(Exception):
    def __init__(self, message: str, status: int = 200, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


# -- a small GraphQL reader: enough for queries without variables or fragments ----------------
_TOKEN = re.compile(r'''
    (?P<skip>[\s,]+|\#[^\n]*)
  | (?P<str>"(?:[^"\\\n\r]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*")
  | (?P<num>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<name>[_A-Za-z][_0-9A-Za-z]*)
  | (?P<punct>[{}()\[\]:])
''', re.X)


class Enum(str):
    """An enum value as written in a query (``cloudType: ALL``)."""


@dataclass
class Field:
    name: str
    args: dict[str, Any]
    selections: list[Field] | None


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise GraphQLError(f"Syntax Error: Unexpected character {text[pos]!r} at {pos}.", 400,
                               "GRAPHQL_PARSE_FAILED")
        if m.lastgroup != "skip":
            out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


class _Reader:
    def __init__(self, text: str):
        self.toks, self.i = _tokens(text), 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, expect: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise GraphQLError("Syntax Error: Unexpected <EOF>.", 400, "GRAPHQL_PARSE_FAILED")
        tok = self.toks[self.i]
        if expect is not None and tok[1] != expect:
            raise GraphQLError(f"Syntax Error: Expected {expect!r}, found {tok[1]!r}.", 400,
                               "GRAPHQL_PARSE_FAILED")
        self.i += 1
        return tok

    def document(self) -> tuple[str, list[Field]]:
        op = "query"
        if self.peek() in ("query", "mutation"):
            op = self.take()[1]
            if self.peek() not in ("{", None):
                self.take()  # operation name
        selections = self.selection_set()
        if self.peek() is not None:
            raise GraphQLError(f"Syntax Error: Unexpected {self.peek()!r}.", 400, "GRAPHQL_PARSE_FAILED")
        return op, selections

    def selection_set(self) -> list[Field]:
        self.take("{")
        fields = []
        while self.peek() != "}":
            kind, name = self.take()
            if kind != "name":
                raise GraphQLError(f"Syntax Error: Expected Name, found {name!r}.", 400, "GRAPHQL_PARSE_FAILED")
            args = {}
            if self.peek() == "(":
                self.take("(")
                while self.peek() != ")":
                    key = self.take()[1]
                    self.take(":")
                    args[key] = self.value()
                self.take(")")
            sub = self.selection_set() if self.peek() == "{" else None
            fields.append(Field(name, args, sub))
        self.take("}")
        return fields

    def value(self) -> Any:
        kind, text = self.take()
        if kind == "str":
            return json.loads(text)
        if kind == "num":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name":
            return {"true": True, "false": False, "null": None}.get(text, Enum(text))
        if text == "[":
            items = []
            while self.peek() != "]":
                items.append(self.value())
            self.take("]")
            return items
        if text == "{":
            obj = {}
            while self.peek() != "}":
                key = self.take()[1]
                self.take(":")
                obj[key] = self.value()
            self.take("}")
            return obj
        raise GraphQLError(f"Syntax Error: Unexpected {text!r}.", 400, "GRAPHQL_PARSE_FAILED")


def parse(text: str) -> tuple[str, list[Field]]:
    return _Reader(text).document()


def project(value: Any, selections: list[Field] | None, type_name: str) -> Any:
    """Only the fields asked for, as GraphQL answers; a field that does not exist is an error."""
    if isinstance(value, list):
        return [project(v, selections, type_name) for v in value]
    if value is None or selections is None:
        if isinstance(value, dict):
            raise GraphQLError(f'Field of type "{type_name}" must have a selection of subfields.', 400,
                               "GRAPHQL_VALIDATION_FAILED")
        return value
    if not isinstance(value, dict):
        raise GraphQLError(f'Field of type "{type_name}" must not have a selection.', 400,
                           "GRAPHQL_VALIDATION_FAILED")
    out = {}
    for f in selections:
        if f.name not in value:
            raise GraphQLError(f'Cannot query field "{f.name}" on type "{type_name}".', 400,
                               "GRAPHQL_VALIDATION_FAILED")
        v = value[f.name]
        out[f.name] = project(v(**f.args) if callable(v) else v, f.selections, f.name)
    return out


# -- pods ---------------------------------------------------------------------------------------
@dataclass
class Pod:
    id: str
    name: str
    pod_type: str  # RESERVED (on-demand): INTERRUPTABLE (spot) pods are gone
    gpu_type: dict | None
    gpu_count: int
    cost_per_hr: float
    image: str
    env: dict[str, str]
    volume_gb: int
    container_gb: int
    mount: str | None
    root: Path
    key: str  # the pod-scoped RUNPOD_API_KEY
    host: Host | None = None
    vcpus: int = 8
    memory_gb: int = 32
    status: str = "RUNNING"
    port: int = 0
    private_port: int = 0
    late_polls: int = 0  # polls left with runtime null
    host_cuda: str | None = None  # the CUDA its host's driver reports (GPU pods)
    stuck: bool = False  # its container never starts (a driver older than the image's CUDA)
    hidden_listings: int = 0  # listings of ``myself { pods }`` left that do not show it yet
    hidden_lookups: int = 0  # ``pod(input: {podId})`` queries left that answer null for it
    network_volume: str | None = None  # the id of the network volume it mounts
    data_center: str | None = None
    gone_polls: int = 0  # polls left showing TERMINATED before the pod vanishes
    started: float = field(default_factory=time.time)
    changed: float = field(default_factory=time.time)


def _pod_id() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=14))


class FakeRunPod:
    """Knobs: ``fail_create_after`` (next N creates make the pod, then answer 500),
    ``rate_limited`` (next N requests get 429 HTML), ``fail_listing`` (next N listings fail;
    ``listing_failure`` "error" or "null"), ``listing_lag`` (a new pod is missing from the next N
    listings), ``no_capacity`` (next N creates refused), ``refuse_resume`` (next N resumes refused),
    ``fail_stop`` / ``fail_terminate`` (next N podStop / podTerminate answer 500 and do nothing),
    ``lookup_lag`` (a new pod's next N ``pod`` lookups answer null), ``terminate_ignored`` (next N
    podTerminate answer as usual and do nothing, as ``terminate_pod`` cannot tell), ``runtime_delay`` (polls with ``runtime`` null after each (re)start),
    ``terminate_lag`` (polls a terminated pod still shows), ``host_cudas`` (see HOST_CUDAS),
    ``image_files`` (files every new pod's image has, as hosts.py writes them: a broken tool).
    ``queries`` holds every query received, in order."""

    def __init__(self, root: Path, gpus: list[dict] | None = None, runtime_delay: int = 2,
                 terminate_lag: int = 1):
        self.root = Path(root)
        self.gpus = [dict(g) for g in (gpus if gpus is not None else DEFAULT_GPUS)]
        self.runtime_delay = runtime_delay
        self.terminate_lag = terminate_lag
        self.key = "rpa_" + secrets.token_hex(16)
        self.pods: dict[str, Pod] = {}
        self.queries: list[str] = []
        self.fail_create_after = 0
        self.rate_limited = 0
        self.fail_listing = 0
        self.listing_failure = "error"
        self.no_capacity = 0
        self.refuse_resume = 0
        self.terminate_ignored = 0
        self.listing_lag = 0
        self.lookup_lag = 0
        self.fail_stop = 0
        self.fail_terminate = 0
        self.host_cudas = list(HOST_CUDAS)
        self.image_files: dict[str, dict] = {}
        self.data_centers = [dict(c, stock=dict(c["stock"])) for c in DEFAULT_DATA_CENTERS]
        self.network_volumes: dict[str, dict] = {}  # id -> {id, name, size, dataCenterId}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> FakeRunPod:
        self.root.mkdir(parents=True, exist_ok=True)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                fake._serve(self)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{HOST}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            for pod in self.pods.values():
                if pod.host is not None:
                    pod.host.destroy()

    def settings(self, **extra) -> dict[str, Any]:
        """Provider settings for this fake: its key, this machine's user, quick retries and polls."""
        return {"api_key": self.key, "ssh_user": getpass.getuser(), "retry_base": 0.01,
                "poll_interval": 0.05, "create_lookup_seconds": 5, **extra}

    def inputs(self, mutation: str) -> list[dict]:
        """The ``input`` of every ``mutation`` received, decoded as RunPod decodes it."""
        found = []
        for q in self.queries:
            try:
                op, fields = parse(q)
            except Exception:  # noqa: BLE001 - not every recorded query needs to parse
                continue
            found += [f.args["input"] for f in fields if op == "mutation" and f.name == mutation]
        return found

    def gpu(self, gpu_id: str) -> dict:
        return next(g for g in self.gpus if g["id"] == gpu_id)

    def live(self) -> list[Pod]:
        """Pods that exist (any state but terminated)."""
        with self._lock:
            return [p for p in self.pods.values() if p.status != "TERMINATED"]

    # -- HTTP -----------------------------------------------------------------------------
    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        body = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        try:
            query = json.loads(body)["query"]
        except (ValueError, KeyError, TypeError):
            return self._reply(req, 400, {"errors": [{"message": "POST body must be JSON with a query"}]})
        with self._lock:
            self.queries.append(query)
            if req.path.split("?")[0] != "/graphql":
                return self._reply(req, 404, {"errors": [{"message": "Not Found"}]})
            if self.rate_limited > 0:
                self.rate_limited -= 1
                return self._reply(req, 429, RATE_LIMIT_HTML)
            auth = req.headers.get("Authorization", "")
            token = auth[7:] if auth.startswith("Bearer ") else ""
            if token == self.key:
                scope = None
            else:
                scope = next((p.id for p in self.pods.values() if p.key == token and p.status != "TERMINATED"),
                             None)
                if scope is None:
                    return self._reply(req, 401, {"error": "Unauthorized"})
            try:
                op, fields = parse(query)
                data = {f.name: self._resolve(op, f, scope) for f in fields}
            except GraphQLError as e:
                error = {"message": str(e), "path": [], "extensions": {"code": e.code or "BAD_REQUEST"}}
                return self._reply(req, e.status, {"errors": [error], "data": None})
            return self._reply(req, 200, {"data": data})

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        html = isinstance(payload, str)
        raw = (payload if html else json.dumps(payload)).encode()
        req.send_response(status)
        req.send_header("Content-Type", "text/html" if html else "application/json")
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)

    # -- resolvers ------------------------------------------------------------------------
    def _resolve(self, op: str, f: Field, scope: str | None) -> Any:
        if op == "query":
            if f.name == "gpuTypes":
                wanted = (f.args.get("input") or {}).get("id")
                return project([self._gpu_view(g) for g in self.gpus if wanted in (None, g["id"])],
                               f.selections, "GpuType")
            if f.name == "pod":
                pod_id = (f.args.get("input") or {}).get("podId")
                self._check_scope(scope, pod_id)
                pod = self.pods.get(pod_id)
                if pod is not None and pod.hidden_lookups > 0:  # made, not visible to a lookup yet
                    pod.hidden_lookups -= 1
                    return None
                return project(self._pod_view(pod_id), f.selections, "Pod")
            if f.name == "myself":
                self._check_scope(scope, None)
                if self.fail_listing > 0:
                    self.fail_listing -= 1
                    if self.listing_failure == "null":
                        return None
                    raise GraphQLError(SOMETHING_WRONG, 500, "INTERNAL_SERVER_ERROR")
                # Each list is made only when asked for: a listing of volumes moves no pod's listing lag.
                volumes = lambda: [self._volume_view(v) for v in self.network_volumes.values()]  # noqa: E731
                return project({"id": "user-1", "pods": self._listed_pods, "networkVolumes": volumes},
                               f.selections, "User")
            if f.name == "dataCenters":
                return project([self._center_view(c) for c in self.data_centers], f.selections, "DataCenter")
            raise GraphQLError(f'Cannot query field "{f.name}" on type "Query".', 400, "GRAPHQL_VALIDATION_FAILED")
        if f.name not in INPUTS:
            raise GraphQLError(f'Cannot query field "{f.name}" on type "Mutation".', 400, "GRAPHQL_VALIDATION_FAILED")
        type_name, allowed = INPUTS[f.name]
        given = f.args.get("input")
        if not isinstance(given, dict):
            raise GraphQLError(f'Field "{f.name}" argument "input" of type "{type_name}!" is required.', 400,
                               "GRAPHQL_VALIDATION_FAILED")
        for key in given:
            if key not in allowed:
                raise GraphQLError(f'Field "{key}" is not defined by type "{type_name}".', 400,
                                   "GRAPHQL_VALIDATION_FAILED")
        if f.name in VOLUME_MUTATIONS:
            self._check_scope(scope, None)
            return getattr(self, "_" + f.name)(given, f)
        if f.name in ("podFindAndDeployOnDemand", "deployCpuPod"):
            self._check_scope(scope, None)
            return project(self._pod_view(self._create(f.name, given)), f.selections, "Pod")
        pod_id = given.get("podId")
        self._check_scope(scope, pod_id)
        pod = self.pods.get(pod_id)
        if pod is None or pod.status == "TERMINATED":
            raise GraphQLError("Pod not found")
        getattr(self, "_" + f.name)(pod, given)
        return None if f.name == "podTerminate" else project(self._pod_view(pod_id), f.selections, "Pod")

    def _listed_pods(self) -> list[dict]:
        pods = []
        for p in list(self.pods.values()):
            if p.hidden_listings > 0:  # not listed yet (listing lag)
                p.hidden_listings -= 1
            elif p.status != "TERMINATED":
                pods.append(self._pod_view(p.id))
        return pods

    # -- network volumes ------------------------------------------------------------------
    def _center_view(self, c: dict) -> dict:
        return {"id": c["id"], "name": c["name"], "location": c["name"], "listed": True,
                "storageSupport": c["storageSupport"],
                "gpuAvailability": [{"gpuTypeId": g, "stockStatus": level, "available": bool(level),
                                     "displayName": next((x["displayName"] for x in self.gpus if x["id"] == g), g)}
                                    for g, level in c["stock"].items()]}

    def _volume_view(self, v: dict) -> dict:
        center = next(c for c in self.data_centers if c["id"] == v["dataCenterId"])
        return {**v, "dataCenter": {"id": center["id"], "name": center["name"]}}

    def volume_dir(self, volume_id: str) -> Path:
        """Where a network volume's files are (every pod that mounts it sees this folder)."""
        return self.root / "network-volumes" / volume_id

    def _createNetworkVolume(self, given: dict, f: Field) -> dict:  # noqa: N802 - named after the mutation
        name, size, center = given.get("name"), given.get("size"), given.get("dataCenterId")
        if not isinstance(name, str) or not name or not isinstance(size, int) or isinstance(size, bool):
            raise GraphQLError("name and size are required", 400, "BAD_USER_INPUT")
        if not 1 <= size <= 4000:
            raise GraphQLError("Network volume size must be between 1 and 4000 GB", 200, "BAD_USER_INPUT")
        found = next((c for c in self.data_centers if c["id"] == center), None)
        if found is None or not found["storageSupport"]:
            raise GraphQLError(f"Data center {center!r} does not support network volumes", 200, "BAD_USER_INPUT")
        vid = "".join(random.choices(string.ascii_lowercase + string.digits, k=10))
        self.network_volumes[vid] = {"id": vid, "name": name, "size": size, "dataCenterId": center}
        self.volume_dir(vid).mkdir(parents=True)
        return project(self._volume_view(self.network_volumes[vid]), f.selections, "NetworkVolume")

    def _deleteNetworkVolume(self, given: dict, f: Field) -> None:  # noqa: N802
        if self.network_volumes.pop(str(given.get("id")), None) is None:
            raise GraphQLError("Network volume not found")
        shutil.rmtree(self.volume_dir(str(given["id"])), ignore_errors=True)
        return None

    def _check_scope(self, scope: str | None, pod_id: str | None) -> None:
        if scope is not None and pod_id != scope:
            raise GraphQLError("This API key is scoped to one pod: permission denied", 200, "FORBIDDEN")

    def _gpu_view(self, g: dict) -> dict:
        def lowest(input=None):
            n = int((input or {}).get("gpuCount") or 1)
            ok = n <= g.get("maxGpuCount", 8)
            listed = [p for p in (g.get("communityPrice"), g.get("securePrice")) if p]
            return {"minimumBidPrice": g.get("minimumBidPrice") if ok else None,
                    "uninterruptablePrice": (min(listed) if listed else None) if ok else None,
                    "stockStatus": g.get("stockStatus") if ok else None}

        spot = g.get("minimumBidPrice")
        return {"id": g["id"], "displayName": g["displayName"], "memoryInGb": g["memoryInGb"],
                "maxGpuCount": g.get("maxGpuCount", 8), "manufacturer": "Nvidia", "cudaCores": 0,
                "secureCloud": g.get("securePrice") is not None,
                "communityCloud": g.get("communityPrice") is not None,
                "securePrice": g.get("securePrice"), "communityPrice": g.get("communityPrice"),
                "secureSpotPrice": spot, "communitySpotPrice": spot, "oneMonthPrice": None,
                "threeMonthPrice": None, "oneWeekPrice": None, "lowestPrice": lowest}

    def _pod_view(self, pod_id: str | None) -> dict | None:
        pod = self.pods.get(pod_id)
        if pod is None:
            return None
        if pod.status == "TERMINATED":
            if pod.gone_polls <= 0:
                return None
            pod.gone_polls -= 1
        return {
            "id": pod.id, "name": pod.name, "desiredStatus": pod.status, "podType": pod.pod_type,
            "costPerHr": pod.cost_per_hr, "adjustedCostPerHr": pod.cost_per_hr, "gpuCount": pod.gpu_count,
            "vcpuCount": pod.vcpus, "memoryInGb": pod.memory_gb, "containerDiskInGb": pod.container_gb,
            "volumeInGb": pod.volume_gb, "volumeMountPath": pod.mount, "imageName": pod.image,
            "env": [f"{k}={v}" for k, v in pod.env.items()], "ports": "22/tcp", "port": None,
            "dockerArgs": "", "dockerId": None, "machineId": "m" + pod.id[:8],
            "uptimeSeconds": int(time.time() - pod.started) if pod.status == "RUNNING" else 0,
            "lastStatusChange": f"{pod.status.title()}: {time.ctime(pod.changed)}",
            "machine": {"gpuDisplayName": pod.gpu_type["displayName"] if pod.gpu_type else None,
                        "podHostId": f"{pod.id}-64410f9c"},
            "runtime": lambda: self._runtime(pod),
        }

    def _runtime(self, pod: Pod) -> dict | None:
        if pod.status != "RUNNING" or pod.stuck:
            return None
        if pod.late_polls > 0:  # RunPod's ports arrive late
            pod.late_polls -= 1
            return None
        return {"uptimeInSeconds": int(time.time() - pod.started), "gpus": [], "ports": [
            {"ip": PRIVATE_IP, "isIpPublic": False, "privatePort": 22, "publicPort": pod.private_port,
             "type": "tcp"},
            {"ip": pod.host.address, "isIpPublic": True, "privatePort": 22, "publicPort": pod.port, "type": "tcp"},
        ]}

    # -- mutations ------------------------------------------------------------------------
    def _create(self, mutation: str, given: dict) -> str:
        if self.no_capacity > 0:
            self.no_capacity -= 1
            raise GraphQLError(NO_CAPACITY)
        if not given.get("name") or not given.get("imageName") and not given.get("templateId"):
            raise GraphQLError("name and imageName (or templateId) are required", 400, "BAD_USER_INPUT")
        env = {}
        for item in given.get("env") or []:
            if not isinstance(item, dict) or set(item) != {"key", "value"}:
                raise GraphQLError('Field "env" expects [EnvironmentVariableInput] {key, value}', 400,
                                   "GRAPHQL_VALIDATION_FAILED")
            env[item["key"]] = item["value"]
        network, center = self._network_volume(given)
        gpu, count, host_cuda = None, 0, None
        if mutation == "deployCpuPod":
            flavor = str(given.get("instanceId") or "cpu3c-2-4")
            m = re.fullmatch(r"cpu\d[a-z]-(\d+)-(\d+)", flavor)
            if not m:
                raise GraphQLError(f"Unknown CPU instance {flavor!r}")
            vcpus, memory = int(m[1]), int(m[2])
            cost = round(0.03 * vcpus, 3)
            pod_type = "RESERVED"
        else:
            gpu = next((g for g in self.gpus if g["id"] == given.get("gpuTypeId")), None)
            if gpu is None:
                raise GraphQLError(f"Could not find GPU type {given.get('gpuTypeId')!r}")
            count = int(given.get("gpuCount") or 1)
            vcpus, memory = 8 * count, 32 * count
            cloud = str(given.get("cloudType") or "ALL")
            prices = {"SECURE": [gpu.get("securePrice")], "COMMUNITY": [gpu.get("communityPrice")]}.get(
                cloud, [gpu.get("securePrice"), gpu.get("communityPrice")])
            prices = [p for p in prices if p]
            if not prices:
                raise GraphQLError(NO_CAPACITY)
            cost, pod_type = round(min(prices) * count, 4), "RESERVED"
            host_cuda = self._place(given)
            if center is not None and not center["stock"].get(gpu["id"]):
                raise GraphQLError(NO_CAPACITY)  # not in stock in the data center its volume is in
        pod_id = _pod_id()
        root = self.root / pod_id
        root.mkdir(parents=True)
        volume = int(given.get("volumeInGb") or 0)
        pod = Pod(id=pod_id, name=str(given["name"]), pod_type=pod_type, gpu_type=gpu, gpu_count=count,
                  cost_per_hr=cost, image=str(given.get("imageName") or ""), env=env,
                  volume_gb=volume, container_gb=int(given.get("containerDiskInGb") or 0),
                  mount=given.get("volumeMountPath") if volume else None, root=root,
                  key="rpa_pod_" + secrets.token_hex(12), vcpus=vcpus, memory_gb=memory, host_cuda=host_cuda,
                  hidden_listings=self.listing_lag, hidden_lookups=self.lookup_lag)
        if network is not None:  # in place of the volume disk, at the path asked (docs' default /workspace)
            pod.network_volume, pod.data_center = network["id"], network["dataCenterId"]
            pod.mount = str(given.get("volumeMountPath") or "/workspace")
        self.pods[pod_id] = pod
        self._boot(pod)
        if self.fail_create_after > 0:  # RunPod has answered 500 after making the pod
            self.fail_create_after -= 1
            raise GraphQLError(SOMETHING_WRONG, 500, "INTERNAL_SERVER_ERROR")
        return pod_id

    def _network_volume(self, given: dict) -> tuple[dict | None, dict | None]:
        """(the network volume a deploy mounts, its data center), or (None, None)."""
        vid = given.get("networkVolumeId")
        if vid is None:
            return None, None
        network = self.network_volumes.get(str(vid))
        if network is None:
            raise GraphQLError(f"Network volume {vid!r} not found")
        if given.get("dataCenterId") not in (None, network["dataCenterId"]):
            raise GraphQLError(f"Network volume {vid} is in data center {network['dataCenterId']}, not "
                               f"{given['dataCenterId']}")
        if str(given.get("cloudType") or "SECURE") != "SECURE":  # docs: network volumes are Secure Cloud only
            raise GraphQLError("Network volumes are only available on Secure Cloud")
        return network, next(c for c in self.data_centers if c["id"] == network["dataCenterId"])

    def _place(self, given: dict) -> str:
        """The CUDA of the host a GPU pod lands on: the first whose version the create allows
        (exact match) or reaches the floor; with no filter, the first host, however old."""
        allowed, floor = given.get("allowedCudaVersions"), given.get("minCudaVersion")
        for cuda in self.host_cudas:
            if allowed and cuda not in allowed:
                continue
            if floor and _version(cuda) < _version(str(floor)):
                continue
            return cuda
        raise GraphQLError(NO_CAPACITY)

    def _boot(self, pod: Pod) -> None:
        pod.late_polls = self.runtime_delay
        pod.status, pod.started, pod.changed = "RUNNING", time.time(), time.time()
        needs = _image_cuda(pod.image)
        pod.stuck = bool(pod.gpu_count and pod.host_cuda and needs and _version(pod.host_cuda) < needs)
        if pod.stuck:  # "OCI runtime create failed": it shows RUNNING, with no runtime, for ever
            return
        runpod_env = {"RUNPOD_POD_ID": pod.id, "RUNPOD_API_KEY": pod.key, "RUNPOD_GPU_COUNT": str(pod.gpu_count),
                      # where "RunPod's API" is, seen from the pod
                      "RUNPOD_API_BASE_URL": self.url}
        container_env = {**pod.env, **runpod_env}
        if not pod.gpu_count:
            container_env["CUDA_VISIBLE_DEVICES"] = ""
        if pod.host is None:
            # RunPod's images (runpod/containers, official-templates/base start.sh): new SSH host keys
            # at every start, the container's environment written to /etc/rp_environment and sourced
            # at the end of ~/.bashrc (after Ubuntu's early return for non-interactive shells).
            shared = self.volume_dir(pod.network_volume) if pod.network_volume else None
            pod.host = Host(pod.root, env=container_env, volume=shared,
                            mount_path=pod.mount if pod.volume_gb or pod.network_volume else None,
                            keep_container_disk=False, new_host_keys_each_boot=True,
                            env_file="/etc/rp_environment", bashrc_tail="source /etc/rp_environment\n")
            pod.host.files.update(self.image_files)
        pod.port = pod.private_port = free_port(pod.host.address)
        pod.host.env.update({"RUNPOD_PUBLIC_IP": pod.host.address, "RUNPOD_TCP_PORT_22": str(pod.port)})
        try:
            pod.host.boot(port=pod.port)
        except RuntimeError as e:
            raise GraphQLError(f"{SOMETHING_WRONG} ({e})", 500, "INTERNAL_SERVER_ERROR") from None

    def _halt(self, pod: Pod) -> None:
        if pod.host is not None:
            pod.host.halt()  # the container disk goes with it; the volume stays
        pod.status, pod.changed = "EXITED", time.time()

    def _podStop(self, pod: Pod, given: dict) -> None:  # noqa: N802 - named after the mutation
        if self.fail_stop > 0:
            self.fail_stop -= 1
            raise GraphQLError(SOMETHING_WRONG, 500, "INTERNAL_SERVER_ERROR")
        if pod.status == "RUNNING":  # CPU pods too: they have no volume, and keep nothing
            self._halt(pod)

    def _resume(self, pod: Pod, given: dict) -> None:
        if pod.status == "RUNNING":
            return
        if self.refuse_resume > 0:
            self.refuse_resume -= 1
            raise GraphQLError(NOT_ENOUGH_GPUS)
        if int(given.get("gpuCount") or 0) != pod.gpu_count:
            raise GraphQLError(NOT_ENOUGH_GPUS)
        self._boot(pod)

    def _podResume(self, pod: Pod, given: dict) -> None:  # noqa: N802
        # A stopped pod keeps its machine and resumes on the same host (REST v2 openapi, the pod's
        # cudaVersion: "a stopped pod keeps its machine assignment"): the same CUDA as before.
        self._resume(pod, given)

    def _podTerminate(self, pod: Pod, given: dict) -> None:  # noqa: N802
        if self.fail_terminate > 0:
            self.fail_terminate -= 1
            raise GraphQLError(SOMETHING_WRONG, 500, "INTERNAL_SERVER_ERROR")
        if self.terminate_ignored > 0:
            self.terminate_ignored -= 1
            return
        if pod.host is not None:
            pod.host.destroy()
        shutil.rmtree(pod.root, ignore_errors=True)
        pod.status, pod.changed, pod.gone_polls = "TERMINATED", time.time(), self.terminate_lag


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _image_cuda(image: str) -> tuple[int, int] | None:
    m = _IMAGE_CUDA.search(image.lower())
    return (int(m[1]), int(m[2])) if m else None


@pytest.fixture
def fake_runpod(tmp_path, monkeypatch):
    """A running FakeRunPod with RUNPOD_API_BASE_URL pointed at it."""
    with FakeRunPod(tmp_path / "runpod") as fake:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
        monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
        yield fake
