"""A fake RunPod on 127.0.0.1: REST API v2 and GraphQL on one account state, whose pods are real sshd hosts.

**REST API v2** (``/v2/...``), as RunPod's published description has it (api-reference-v2/openapi.json
in github.com/runpod/docs, vendored beside this file as ``runpod_openapi_v2.json`` with its address
and date): every request body is checked against its schema, and a field the schema does not define
is **422** "Request validation failed." naming it (``$: additional properties 'x' not allowed``), as v2
answers; errors are RFC 9457 problems ``{title, status, detail, errors?}``; lists are wrapped
(``{"pods": [...]}``); 429 carries ``Retry-After`` when the knob sets one. Routes: pods (create, get,
list, ``/action`` start/stop/restart/terminate with 409 where the status does not allow it, delete;
"Create a pod", "Trigger a pod state transition", "Terminate a pod"), network volumes ("Create a network
volume": 10 to 4096 GB, in a data center with network volumes), the catalog ("List GPU types": prices
per cloud, ``availability`` and ``dataCenters`` for ``product``/``count``/``cloud``, ``include`` needing
``product``; "List data centers"), and Instant Clusters (``/v2/clusters``, below). A v2 pod's
``status`` is PROVISIONING/STARTING until its container is up, then RUNNING with ``ssh.direct`` (its
``22/tcp``); a create places the pod only in a data center of ``dataCenterIds`` where the catalog shows
its type in stock in its cloud, else 400 "There are no longer any instances available ...".

**GraphQL** (``/graphql``, the runpod SDK 1.11's one call and RunPod's GraphQL docs) answers queries
on the same state. ``retire_graphql`` (on by default: the tests run so) makes its pod and volume
mutations answer as a retired API would: HTTP 410 with an error naming REST v2 (RunPod documents no
text for it; the migration guide moves every client to v2), and nothing is done.

GraphQL days (what it answered before ``retire_graphql``): POST /graphql with ``{"query": ...}`` and no
variables, Bearer keys (401 on a bad one; a pod's own key works only on that pod), errors in ``errors``
(HTTP 200 for refusals, 500 for "Something went wrong", 400 for queries that do not parse or ask for
fields that do not exist), 429 with an HTML body, ``runtime`` null until the "container" is up.
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

# Data centers: which have network volumes, and which GPU types are in stock in each, per cloud (an id
# of DEFAULT_GPUS: its availability level) and for Instant Clusters (``cluster``: the catalog's
# product=CLUSTER). A pod goes to a data center of its cloud that has its type in stock.
DEFAULT_DATA_CENTERS = [
    {"id": "EU-RO-1", "name": "Romania", "storageSupport": True,
     "stock": {"NVIDIA GeForce RTX 4090": "High", "NVIDIA RTX A6000": "Low", "NVIDIA H100 80GB HBM3": "Medium"},
     "community": {}, "cluster": {"NVIDIA H100 80GB HBM3": "Medium"}},
    {"id": "US-KS-2", "name": "Kansas", "storageSupport": True, "stock": {"NVIDIA GeForce RTX 3090": "Medium"},
     "community": {}, "cluster": {}},
    {"id": "EU-SE-1", "name": "Sweden", "storageSupport": False, "stock": {"NVIDIA GeForce RTX 4090": "Low"},
     "community": {"NVIDIA GeForce RTX 4090": "High", "NVIDIA GeForce RTX 3090": "Medium",
                   "NVIDIA RTX A6000": "Low", "NVIDIA A100 80GB PCIe": "Low", "NVIDIA H100 80GB HBM3": "Low"},
     "cluster": {}},
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
RETIRED = ("This API has been retired: pods and network volumes are managed through REST API v2 "
           "(https://docs.runpod.io/api-reference-v2/overview)")
SPEC_PATH = Path(__file__).with_name("runpod_openapi_v2.json")
_validators: dict[str, Any] = {}


def spec() -> dict:
    return json.loads(SPEC_PATH.read_text())


def validate(schema: str, body: Any) -> list[str]:
    """What is wrong with ``body`` against the v2 description's ``schema``, in v2's words: an
    undefined field named as ``$.path: additional properties 'x' not allowed``."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    if schema not in _validators:
        registry = Registry().with_resource("urn:runpod-v2", Resource.from_contents(spec(), DRAFT202012))
        _validators[schema] = jsonschema.Draft202012Validator(
            {"$ref": f"urn:runpod-v2#/components/schemas/{schema}"}, registry=registry)
    out = []
    for e in sorted(_validators[schema].iter_errors(body), key=lambda e: list(e.absolute_path)):
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        if e.validator in ("additionalProperties", "unevaluatedProperties"):
            names = re.findall(r"'([^']+)'", e.message.split("(")[-1])
            out.append(f"{where}: additional properties {', '.join(repr(n) for n in names)} not allowed")
        else:
            out.append(f"{where}: {e.message}")
    return out


class V2Error(Exception):
    """A v2 problem answer."""

    def __init__(self, status: int, detail: str, errors: list[str] | None = None, title: str | None = None,
                 retry_after: str | None = None):
        super().__init__(detail)
        self.status, self.detail, self.errors, self.retry_after = status, detail, errors, retry_after
        self.title = title or {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
                               409: "Conflict", 422: "Unprocessable Entity", 429: "Too Many Requests",
                               500: "Internal Server Error"}.get(status, "Error")

    def problem(self) -> dict:
        out = {"title": self.title, "status": self.status, "detail": self.detail}
        if self.errors:
            out["errors"] = self.errors
        return out


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
    cloud: str = "SECURE"
    cpu_flavor: str | None = None
    cluster: str | None = None  # the Instant Cluster it is a member of
    rank: int = 0
    cluster_ip: str | None = None
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
                 terminate_lag: int = 1, retire_graphql: bool = True):
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
        self.retire_graphql = retire_graphql
        self.retry_after: str | None = None  # the Retry-After a 429 carries (v2), None: none
        self.fail_volume_create_after = 0  # next N volume creates make it, then answer 500
        self.volume_listing_lag = 0  # a new volume is missing from the next N volume listings
        self.requests: list[tuple[str, str, Any]] = []  # every v2 request: (method, path with query, body)
        self.clusters: dict[str, dict] = {}
        self.fail_cluster_member = 0  # next N clusters: one member never comes up (the create still bills)
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

            def do_GET(self):  # noqa: N802
                fake._serve(self)

            def do_DELETE(self):  # noqa: N802
                fake._serve(self)

            def do_PATCH(self):  # noqa: N802
                fake._serve(self)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{HOST}:{self._server.server_address[1]}"
        # A short poll: shutdown() (each test's end) waits for the loop's next wake, 0.5 s by default.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
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

    def sent(self, method: str, path: str) -> list[Any]:
        """The body of every v2 ``method`` request to ``path`` (exact, without its query)."""
        return [b for m, p, b in self.requests if m == method and p.split("?")[0] == path]

    def actions(self, action: str) -> list[str]:
        """The pod ids of every v2 ``/action`` request of ``action``."""
        return [p.split("/")[3] for m, p, b in self.requests
                if m == "POST" and p.endswith("/action") and isinstance(b, dict) and b.get("action") == action]

    def gpu(self, gpu_id: str) -> dict:
        return next(g for g in self.gpus if g["id"] == gpu_id)

    def live(self) -> list[Pod]:
        """Pods that exist (any state but terminated)."""
        with self._lock:
            return [p for p in self.pods.values() if p.status != "TERMINATED"]

    # -- HTTP -----------------------------------------------------------------------------
    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        if req.path.startswith("/v2/") or req.path == "/v2":
            return self._serve_v2(req)
        body = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        try:
            query = json.loads(body)["query"]
        except (ValueError, KeyError, TypeError):
            return self._reply(req, 400, {"errors": [{"message": "POST body must be JSON with a query"}]})
        with self._lock:
            self.queries.append(query)
            if req.command != "POST" or req.path.split("?")[0] != "/graphql":
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
                if self.retire_graphql and op == "mutation" and any(f.name in INPUTS for f in fields):
                    raise GraphQLError(RETIRED, 410, "GONE")
                data = {f.name: self._resolve(op, f, scope) for f in fields}
            except GraphQLError as e:
                error = {"message": str(e), "path": [], "extensions": {"code": e.code or "BAD_REQUEST"}}
                return self._reply(req, e.status, {"errors": [error], "data": None})
            return self._reply(req, 200, {"data": data})

    # -- REST API v2 ----------------------------------------------------------------------
    def _serve_v2(self, req: BaseHTTPRequestHandler) -> None:
        raw = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        path, _, qs = req.path.partition("?")
        from urllib.parse import parse_qs

        query = {k: v[-1] for k, v in parse_qs(qs).items()}
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError:
            return self._problem(req, V2Error(400, "request body is not JSON"))
        with self._lock:
            self.requests.append((req.command, req.path, body))
            self.queries.append(f"{req.command} {req.path}")
            try:
                if self.rate_limited > 0:  # the limiter: nothing is done
                    self.rate_limited -= 1
                    raise V2Error(429, "rate limit exceeded", retry_after=self.retry_after)
                auth = req.headers.get("Authorization", "")
                token = auth[7:] if auth.startswith("Bearer ") else ""
                scope = None
                if token != self.key:
                    scope = next((p.id for p in self.pods.values() if p.key == token and p.status != "TERMINATED"),
                                 None)
                    if scope is None:
                        raise V2Error(401, "invalid or missing API key")
                status, answer = self._route(req.command, path, query, body, scope)
            except V2Error as e:
                return self._problem(req, e)
        if status == 204:
            req.send_response(204)
            req.send_header("Content-Length", "0")
            req.end_headers()
            return None
        return self._reply(req, status, answer)

    def _problem(self, req: BaseHTTPRequestHandler, e: V2Error) -> None:
        raw = json.dumps(e.problem()).encode()
        req.send_response(e.status)
        req.send_header("Content-Type", "application/problem+json")
        if e.retry_after is not None:
            req.send_header("Retry-After", e.retry_after)
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)

    def _checked(self, schema: str, body: Any) -> dict:
        problems = validate(schema, body)
        if problems:
            raise V2Error(422, "Request validation failed.", problems)
        return body

    def _route(self, method: str, path: str, query: dict, body: Any, scope: str | None) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p][1:]  # after "v2"
        if scope is not None and not (len(parts) >= 2 and parts[0] == "pods" and parts[1] == scope):
            raise V2Error(403, "This API key is scoped to one pod: permission denied")
        route = (method, *["{id}" if i == 1 and parts[0] != "catalog" else p for i, p in enumerate(parts)])
        ident = parts[1] if len(parts) > 1 else None
        if route == ("GET", "pods"):
            return 200, {"pods": self._v2_listing(query.get("includeClusterPods") == "true")}
        if route == ("POST", "pods"):
            return 201, self._v2_create_pod(self._checked("CreatePodRequest", body))
        if route == ("GET", "pods", "{id}"):
            return 200, self._v2_lookup(ident)
        if route == ("DELETE", "pods", "{id}"):
            self._v2_terminate(self._v2_member_check(ident))
            return 204, None
        if route == ("POST", "pods", "{id}", "action"):
            action = self._checked("PodActionRequest", body)["action"]
            pod = self._v2_member_check(ident) if action in ("stop", "terminate", "start") else self._v2_pod(ident)
            return self._v2_action(pod, action)
        if route == ("GET", "network-volumes"):
            if self.fail_listing > 0:
                self.fail_listing -= 1
                raise V2Error(500, SOMETHING_WRONG)
            shown = []
            for v in self.network_volumes.values():
                if v.get("hidden", 0) > 0:  # listing lag, as a new pod's (assumed for volumes alike)
                    v["hidden"] -= 1
                else:
                    shown.append(self._v2_volume(v))
            return 200, {"networkVolumes": shown}
        if route == ("POST", "network-volumes"):
            return 201, self._v2_create_volume(self._checked("CreateNetworkVolumeRequest", body))
        if route == ("GET", "network-volumes", "{id}"):
            if ident not in self.network_volumes:
                raise V2Error(404, "network volume not found")
            return 200, self._v2_volume(self.network_volumes[ident])
        if route == ("DELETE", "network-volumes", "{id}"):
            if self.network_volumes.pop(ident, None) is None:
                raise V2Error(404, "network volume not found")
            shutil.rmtree(self.volume_dir(ident), ignore_errors=True)
            return 204, None
        if route == ("GET", "catalog", "gpus"):
            return 200, {"gpus": self._v2_catalog(query)}
        if route == ("GET", "catalog", "datacenters"):
            return 200, {"dataCenters": [self._v2_center(c) for c in self.data_centers]}
        if route == ("GET", "clusters"):
            return 200, {"clusters": [self._v2_cluster(c) for c in self.clusters.values()]}
        if route == ("POST", "clusters"):
            return 201, self._v2_create_cluster(self._checked("CreateClusterRequest", body))
        if route == ("GET", "clusters", "{id}"):
            return 200, self._v2_cluster(self._cluster(ident))
        if route == ("GET", "clusters", "{id}", "pods"):
            cluster = self._cluster(ident)
            return 200, {"pods": [self._v2_pod_view(self.pods[p]) for p in cluster["pods"]
                                  if self.pods[p].status != "TERMINATED"]}
        if route == ("DELETE", "clusters", "{id}"):
            self._v2_delete_cluster(self._cluster(ident))
            return 204, None
        raise V2Error(404, f"no route {method} {path}")

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
        pod.stuck = pod.stuck or bool(pod.gpu_count and pod.host_cuda and needs and _version(pod.host_cuda) < needs)
        if pod.stuck:  # "OCI runtime create failed": it never comes up, for ever
            return
        self._host_for(pod)
        pod.port = pod.private_port = free_port(pod.host.address)
        pod.host.env.update({"RUNPOD_PUBLIC_IP": pod.host.address, "RUNPOD_TCP_PORT_22": str(pod.port)})
        try:
            pod.host.boot(port=pod.port)
        except RuntimeError as e:
            raise GraphQLError(f"{SOMETHING_WRONG} ({e})", 500, "INTERNAL_SERVER_ERROR") from None

    def _host_for(self, pod: Pod) -> Host:
        """The pod's container host, made at its first boot."""
        if pod.host is None:
            runpod_env = {"RUNPOD_POD_ID": pod.id, "RUNPOD_API_KEY": pod.key, "RUNPOD_GPU_COUNT": str(pod.gpu_count),
                          # where "RunPod's API" is, seen from the pod
                          "RUNPOD_API_BASE_URL": self.url}
            container_env = {**pod.env, **runpod_env}
            if not pod.gpu_count:
                container_env["CUDA_VISIBLE_DEVICES"] = ""
            # RunPod's images (runpod/containers, official-templates/base start.sh): new SSH host keys
            # at every start, the container's environment written to /etc/rp_environment and sourced
            # at the end of ~/.bashrc (after Ubuntu's early return for non-interactive shells).
            shared = self.volume_dir(pod.network_volume) if pod.network_volume else None
            pod.host = Host(pod.root, env=container_env, volume=shared,
                            mount_path=pod.mount if pod.volume_gb or pod.network_volume else None,
                            keep_container_disk=False, new_host_keys_each_boot=True,
                            env_file="/etc/rp_environment", bashrc_tail="source /etc/rp_environment\n")
            pod.host.files.update(self.image_files)
        return pod.host

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

    # -- REST API v2: pods -----------------------------------------------------------------
    def _v2_status(self, pod: Pod) -> str:
        """v2's status: PROVISIONING/STARTING until the container is up (RunPod's ports arrive late;
        a container that never starts stays STARTING), then RUNNING; EXITED; TERMINATED."""
        if pod.status != "RUNNING":
            return pod.status
        if pod.stuck:
            return "STARTING"
        if pod.late_polls > 0:
            pod.late_polls -= 1
            return "STARTING"
        return "RUNNING"

    def _v2_pod_view(self, pod: Pod) -> dict:
        status = self._v2_status(pod)
        direct = None
        if status == "RUNNING":
            direct = {"host": pod.host.address, "port": pod.port, "username": "root",
                      "command": f"ssh root@{pod.host.address} -p {pod.port}"}
        mounts: dict = {}
        if pod.network_volume:
            mounts = {"network": [{"volumeId": pod.network_volume, "path": pod.mount}]}
        elif pod.volume_gb:
            mounts = {"persistent": {"size": pod.volume_gb, "path": pod.mount}}
        actions = {"RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
                   "TERMINATED": []}.get(status, ["stop", "terminate"])
        view = {
            "id": pod.id, "name": pod.name, "status": status, "actions": actions, "image": pod.image, "args": "",
            "disk": pod.container_gb, "mounts": mounts, "ports": ["22/tcp"], "env": dict(pod.env), "registry": None,
            "cloud": pod.cloud, "dataCenterId": pod.data_center, "cudaVersion": pod.host_cuda,
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": f"{pod.id}-64410f9c",
                              "command": f"ssh {pod.id}-64410f9c@ssh.runpod.io"}, "direct": direct},
            "template": None, "cost": pod.cost_per_hr if status not in ("EXITED", "TERMINATED") else 0.0,
            "locked": False, "globalNetworking": {"enabled": False},
            "runtime": {"uptime": int(time.time() - pod.started), "gpus": [], "ports": [
                {"private": 22, "public": pod.port, "type": "tcp", "ip": pod.host.address}]} if direct else None,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pod.started)),
            "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pod.started)) if direct else None,
        }
        if pod.gpu_type:
            view["gpu"] = {"id": pod.gpu_type["id"], "count": pod.gpu_count}
        else:
            view["cpu"] = {"id": pod.cpu_flavor or "cpu3c", "vcpuCount": pod.vcpus}
        if pod.cluster:
            view["cluster"] = {"id": pod.cluster, "rank": pod.rank, "ip": pod.cluster_ip}
        return view

    def _v2_listing(self, include_cluster: bool) -> list[dict] | None:
        if self.fail_listing > 0:
            self.fail_listing -= 1
            if self.listing_failure == "null":
                return None
            raise V2Error(500, SOMETHING_WRONG)
        out = []
        for p in list(self.pods.values()):
            if p.cluster and not include_cluster:  # "excluded from GET /v2/pods by default" (the Pod schema)
                continue
            if p.hidden_listings > 0:  # not listed yet (listing lag)
                p.hidden_listings -= 1
            elif p.status != "TERMINATED":
                out.append(self._v2_pod_view(p))
        return out

    def _v2_pod(self, pod_id: str | None) -> Pod:
        pod = self.pods.get(pod_id)
        if pod is None or pod.status == "TERMINATED":
            raise V2Error(404, "pod not found")
        return pod

    def _v2_member_check(self, pod_id: str | None) -> Pod:
        pod = self._v2_pod(pod_id)
        if pod.cluster:  # "Pods that belong to a Cluster cannot be terminated here" (deletePod: 409)
            raise V2Error(409, "Pod belongs to a cluster and cannot be modified or terminated via the pod "
                               "endpoints: delete the cluster")
        return pod

    def _v2_lookup(self, pod_id: str | None) -> dict:
        pod = self.pods.get(pod_id)
        if pod is None:
            raise V2Error(404, "pod not found")
        if pod.hidden_lookups > 0:  # made, not visible to a lookup yet
            pod.hidden_lookups -= 1
            raise V2Error(404, "pod not found")
        if pod.status == "TERMINATED":
            if pod.gone_polls <= 0:
                raise V2Error(404, "pod not found")
            pod.gone_polls -= 1
        return self._v2_pod_view(pod)

    def _v2_gpu_center(self, gpu: dict, cloud: str, count: int, centers: list[str], stock: str = "") -> dict:
        """The data center a pod (or a cluster) of ``gpu`` goes to: the first of ``centers`` (any when
        empty) where its cloud has it in stock; none is a 400 and nothing is made."""
        key = stock or ("stock" if cloud == "SECURE" else "community")
        if count <= gpu.get("maxGpuCount", 8):
            for c in self.data_centers:
                if (not centers or c["id"] in centers) and c[key].get(gpu["id"]):
                    return c
        raise V2Error(400, NO_CAPACITY)

    def _v2_create_pod(self, given: dict) -> dict:
        if ("gpu" in given) == ("cpu" in given):
            raise V2Error(400, "exactly one of gpu or cpu must be set")
        if not given.get("image") and not given.get("templateId"):
            raise V2Error(400, "image is required unless templateId is set")
        if self.no_capacity > 0:
            self.no_capacity -= 1
            raise V2Error(400, NO_CAPACITY)
        mounts = given.get("mounts") or {}
        if "persistent" in mounts and "network" in mounts:
            raise V2Error(400, "mounts.persistent and mounts.network are mutually exclusive")
        if "cpu" in given and "persistent" in mounts:
            raise V2Error(400, "mounts.persistent is invalid when cpu is set")
        cloud, centers = given.get("cloud") or "SECURE", list(given.get("dataCenterIds") or [])
        network = None
        if mounts.get("network"):
            vid = mounts["network"][0]["volumeId"]
            network = self.network_volumes.get(vid)
            if network is None:
                raise V2Error(404, f"network volume {vid} not found")
            if cloud != "SECURE":  # docs: network volumes are Secure Cloud only
                raise V2Error(400, "Network volumes are only available on Secure Cloud")
            if centers and network["dataCenterId"] not in centers:
                raise V2Error(400, f"network volume {vid} is in data center {network['dataCenterId']}, not in "
                                   f"{', '.join(centers)}")
            centers = [network["dataCenterId"]]
        if "cpu" in given:
            vcpus = int(given["cpu"]["vcpuCount"])
            if vcpus & (vcpus - 1):
                raise V2Error(400, "vcpuCount must be a power of two")
            gpu, count, host_cuda, cost = None, 0, None, round(0.03 * vcpus, 3)
            center = next((c for c in self.data_centers if not centers or c["id"] in centers), self.data_centers[0])
        else:
            gpu = next((g for g in self.gpus if g["id"] == given["gpu"]["id"]), None)
            if gpu is None:
                raise V2Error(400, f"unknown GPU type {given['gpu']['id']!r}")
            count = int(given["gpu"].get("count") or 1)
            vcpus = 8 * count
            price = gpu.get("securePrice" if cloud == "SECURE" else "communityPrice")
            if not price:
                raise V2Error(400, NO_CAPACITY)
            center = self._v2_gpu_center(gpu, cloud, count, centers)
            try:
                host_cuda = self._place(given["gpu"])
            except GraphQLError:
                raise V2Error(400, NO_CAPACITY) from None
            cost = round(price * count, 4)
        persistent = mounts.get("persistent") or {}
        pod = self._new_pod(str(given["name"]), gpu, count, cost, str(given.get("image") or ""),
                            dict(given.get("env") or {}), int(persistent.get("size") or 0), int(given.get("disk") or 0),
                            persistent.get("path"), host_cuda, vcpus, cloud, center["id"])
        if network is not None:  # in place of the volume disk, at the path asked
            pod.network_volume, pod.mount = network["id"], mounts["network"][0]["path"]
        if "cpu" in given:
            pod.cpu_flavor = given["cpu"]["id"]
        self.pods[pod.id] = pod
        self._v2_boot(pod)
        if self.fail_create_after > 0:  # RunPod has answered 500 after making the pod
            self.fail_create_after -= 1
            raise V2Error(500, SOMETHING_WRONG)
        return self._v2_pod_view(pod)

    def _new_pod(self, name, gpu, count, cost, image, env, volume_gb, container_gb, mount, host_cuda, vcpus, cloud,
                 center) -> Pod:
        pod_id = _pod_id()
        root = self.root / pod_id
        root.mkdir(parents=True)
        return Pod(id=pod_id, name=name, pod_type="RESERVED", gpu_type=gpu, gpu_count=count, cost_per_hr=cost,
                   image=image, env=env, volume_gb=volume_gb, container_gb=container_gb,
                   mount=mount if volume_gb else None, root=root, key="rpa_pod_" + secrets.token_hex(12), vcpus=vcpus,
                   memory_gb=4 * vcpus, host_cuda=host_cuda, hidden_listings=self.listing_lag,
                   hidden_lookups=self.lookup_lag, cloud=cloud, data_center=center)

    def _v2_boot(self, pod: Pod) -> None:
        try:
            self._boot(pod)
        except GraphQLError as e:
            raise V2Error(500, str(e)) from None

    def _v2_action(self, pod: Pod, action: str) -> tuple[int, Any]:
        status = self._v2_status(pod)
        if action == "terminate":
            self._v2_terminate(pod)
            return 204, None
        if action == "stop":
            if status == "EXITED":
                raise V2Error(409, "pod is EXITED: stop is not a valid action")
            if self.fail_stop > 0:
                self.fail_stop -= 1
                raise V2Error(500, SOMETHING_WRONG)
            self._halt(pod)
        elif action == "start":
            if status != "EXITED":
                raise V2Error(409, f"pod is {status}: start is not a valid action")
            if self.refuse_resume > 0:
                self.refuse_resume -= 1
                raise V2Error(400, NOT_ENOUGH_GPUS)
            self._v2_boot(pod)  # "resumes onto the same host": the same CUDA as before
        elif action == "restart":
            if status != "RUNNING":
                raise V2Error(409, f"pod is {status}: restart is not a valid action")
            self._halt(pod)
            self._v2_boot(pod)
        return 200, self._v2_pod_view(pod)

    def _v2_terminate(self, pod: Pod) -> None:
        if self.fail_terminate > 0:
            self.fail_terminate -= 1
            raise V2Error(500, SOMETHING_WRONG)
        if self.terminate_ignored > 0:
            self.terminate_ignored -= 1
            return
        self._end(pod)

    def _end(self, pod: Pod) -> None:
        if pod.host is not None:
            pod.host.destroy()
        shutil.rmtree(pod.root, ignore_errors=True)
        pod.status, pod.changed, pod.gone_polls = "TERMINATED", time.time(), self.terminate_lag

    # -- REST API v2: network volumes and the catalog --------------------------------------
    def _v2_volume(self, v: dict) -> dict:
        return {"id": v["id"], "name": v["name"], "size": v["size"], "dataCenter": v["dataCenterId"], "type": "STANDARD"}

    def _v2_create_volume(self, given: dict) -> dict:
        center = next((c for c in self.data_centers if c["id"] == given["dataCenter"]), None)
        if center is None or not center["storageSupport"]:
            raise V2Error(400, f"data center {given['dataCenter']!r} does not support network volumes")
        vid = "".join(random.choices(string.ascii_lowercase + string.digits, k=10))
        self.network_volumes[vid] = {"id": vid, "name": given["name"], "size": given["size"],
                                     "dataCenterId": center["id"], "hidden": self.volume_listing_lag}
        self.volume_dir(vid).mkdir(parents=True)
        if self.fail_volume_create_after > 0:  # made, and the answer is a 500
            self.fail_volume_create_after -= 1
            raise V2Error(500, SOMETHING_WRONG)
        return self._v2_volume(self.network_volumes[vid])

    def _v2_catalog(self, q: dict) -> list[dict]:
        include, product = q.get("include"), q.get("product")
        if bool(include) != bool(product):  # "Required with include=AVAILABILITY, and valid only with it"
            raise V2Error(400, "product is required with include=AVAILABILITY, and valid only with it")
        count, cloud = int(q.get("count") or 1), str(q.get("cloud") or "SECURE").upper()
        key = "cluster" if product == "CLUSTER" else ("stock" if cloud == "SECURE" else "community")
        levels = ["NONE", "LOW", "MEDIUM", "HIGH"]
        out = []
        for g in self.gpus:
            secure, community = g.get("securePrice") is not None, g.get("communityPrice") is not None
            row = {"id": g["id"], "name": g["displayName"], "pool": None, "manufacturer": "NVIDIA",
                   "memory": g["memoryInGb"], "secure": secure, "community": community,
                   "price": {"secure": g.get("securePrice") or 0.0, "community": g.get("communityPrice") or 0.0},
                   "maxCount": {"secure": g.get("maxGpuCount", 8) if secure else 0,
                                "community": g.get("maxGpuCount", 8) if community else 0}}
            if include:
                offered = (secure if cloud == "SECURE" else community) and count <= g.get("maxGpuCount", 8)
                centers = [{"id": c["id"], "name": c["name"], "availability": c[key][g["id"]].upper()}
                           for c in self.data_centers if offered and c[key].get(g["id"])]
                row["availability"] = max((c["availability"] for c in centers), key=levels.index, default="NONE")
                if centers:  # "omitted entirely when the configuration is unavailable everywhere"
                    row["dataCenters"] = centers
            out.append(row)
        return out

    def _v2_center(self, c: dict) -> dict:
        return {"id": c["id"], "name": c["name"], "region": {"id": c["id"][:2], "name": c["name"]},
                "globalNetwork": False, "networkVolumeTypes": ["STANDARD"] if c["storageSupport"] else [],
                "compliance": []}

    # -- REST API v2: Instant Clusters ------------------------------------------------------
    def _cluster(self, cluster_id: str | None) -> dict:
        cluster = self.clusters.get(cluster_id)
        if cluster is None:
            raise V2Error(404, "cluster not found")
        return cluster

    def _v2_create_cluster(self, given: dict) -> dict:
        """All or nothing, in one data center: ``compute.podCount`` pods of one shape, each told the
        cluster's own variables (docs.runpod.io/instant-clusters, "Environment variables"), with a
        private address on the cluster's network: here each member's own 127.x address, where its
        sshd and anything it serves listen."""
        compute = given["compute"]
        gpu = next((g for g in self.gpus if g["id"] == compute["gpuTypeId"]), None)
        if gpu is None:
            raise V2Error(400, f"unknown GPU type {compute['gpuTypeId']!r}")
        if self.no_capacity > 0:
            self.no_capacity -= 1
            raise V2Error(400, NO_CAPACITY)
        per_pod, count = int(compute["gpuCountPerPod"]), int(compute["podCount"])
        center = self._v2_gpu_center(gpu, "SECURE", per_pod, list(given.get("dataCenterIds") or []), "cluster")
        cid = "cl" + "".join(random.choices(string.ascii_lowercase + string.digits, k=12))
        cluster = {"id": cid, "name": given["name"], "type": given["type"], "compute": compute,
                   "dataCenterId": center["id"], "pods": [], "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
        env = {k: str(v) for k, v in (given.get("env") or {}).items()}
        members = []
        for rank in range(count):
            pod = self._new_pod(f"{given['name']}-{rank}", gpu, per_pod, round((gpu.get("securePrice") or 0) * per_pod, 4),
                                str(given.get("image") or ""), dict(env), 0, int(given.get("disk") or 0), None,
                                self.host_cudas[-1], 8 * per_pod, "SECURE", center["id"])
            pod.cluster, pod.rank = cid, rank
            members.append(pod)
        for pod in members:
            pod.cluster_ip = self._host_for(pod).address
        primary = members[0].cluster_ip
        for pod in members:
            cluster_env = {"PRIMARY_ADDR": primary, "MASTER_ADDR": primary, "PRIMARY_PORT": "29500",
                           "MASTER_PORT": "29500", "NODE_ADDR": pod.cluster_ip, "NODE_RANK": str(pod.rank),
                           "NUM_NODES": str(count), "NUM_TRAINERS": str(per_pod), "HOST_NODE_ADDR": f"{primary}:29400",
                           "WORLD_SIZE": str(count * per_pod)}
            pod.env.update(cluster_env)
            pod.host.env.update(cluster_env)
            self.pods[pod.id] = pod
            cluster["pods"].append(pod.id)
        self.clusters[cid] = cluster
        if self.fail_cluster_member > 0:
            self.fail_cluster_member -= 1
            members[-1].stuck = True
        for pod in members:
            self._v2_boot(pod)
        return self._v2_cluster(cluster)

    def _v2_cluster(self, cluster: dict) -> dict:
        members = [self.pods[p] for p in cluster["pods"] if self.pods[p].status != "TERMINATED"]
        by: dict[str, int] = {}
        for p in members:
            status = "STARTING" if p.stuck or (p.status == "RUNNING" and p.late_polls > 0) else p.status
            by[status] = by.get(status, 0) + 1
        out = {"id": cluster["id"], "name": cluster["name"], "type": cluster["type"], "compute": cluster["compute"],
               "dataCenterId": cluster["dataCenterId"], "pods": {"total": len(members), "byStatus": by},
               "network": {"cidr": "127.0.0.0/8"}, "createdAt": cluster["createdAt"]}
        head = next((p for p in members if p.rank == 0), None)
        if head is not None:
            out["primary"] = {"podId": head.id, "status": head.status}
        return out

    def _v2_delete_cluster(self, cluster: dict) -> None:
        """"Permanently deletes a cluster and terminates all of its member pods." """
        for pod_id in cluster["pods"]:
            if self.pods[pod_id].status != "TERMINATED":
                self._end(self.pods[pod_id])
        del self.clusters[cluster["id"]]

    def live_clusters(self) -> list[dict]:
        with self._lock:
            return list(self.clusters.values())


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
