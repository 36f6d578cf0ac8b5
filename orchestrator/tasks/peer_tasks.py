"""SkyPilot task YAML and dstack ``type: task`` files, read as their users wrote them.

People arrive with these files, and neither peer reads the other's. ``native`` (called by
``task.load`` on every file) tells the dialect apart, translates every key orch can honour into
orch's own task keys (``task.Task``), keeps what it translated for the command to say once
(``said``), and refuses by name
what orch cannot honour (a bucket mount, a port, a service, a dev environment), each refusal one
line with the file and line and orch's nearest equivalent. What the peer would have given without
being asked comes too (its default disk); what would run otherwise than under the peer is warned
of before anything is rented (a dstack file whose commands name files of a folder no ``repos:``
attaches). A file in orch's own dialect passes unchanged. Their commands find the variables they
read on every node (``nodes.peer_env``, ``nodes.run_env``).

The dialects, from the peers' own references:

- **SkyPilot**: "SkyPilot YAML" (https://docs.skypilot.co/en/latest/reference/yaml-spec.html):
  ``num_nodes``, ``workdir`` (read relative to the task file's folder, as orch's own), ``envs`` (a null or empty
  value must be given at launch), ``secrets``, ``file_mounts``, ``volumes``, ``setup``, ``run``,
  and ``resources.accelerators`` as ``NAME:COUNT``, ``NAME``, ``{NAME: COUNT}`` or a list/set of
  candidates; a resources section without accelerators is a CPU machine.
- **dstack**: the ``task`` reference (https://dstack.ai/docs/reference/dstack.yml/task/) and its
  models (github.com/dstackai/dstack, ``src/dstack/_internal/core/models/``): ``type: task``,
  ``commands`` (joined with `` && `` as its job configurator does, ``_join_shell_commands`` in
  ``server/services/jobs/configurators/base.py``), ``env`` as a list (``KEY=VALUE``, or ``KEY``:
  taken from the environment at ``dstack apply``) or a mapping, ``nodes``, and ``resources.gpu``
  as ``GPUSpec.parse`` reads it (``resources.py``): ``:``-separated tokens, a name starting with a
  letter (``A100``, ``A100,H100``), a memory with a unit (``24GB``, ``24GB..80GB``), a count or a
  range (``2``, ``1..2``), or a mapping ``{name, memory, count}``; without a GPU, a CPU machine.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError

SKYPILOT_ONLY = frozenset({"envs", "num_nodes", "file_mounts", "service", "config", "event_callback"})
SKYPILOT_RESOURCES = frozenset({"accelerators", "use_spot", "disk_size", "cloud", "region", "zone", "infra",
                                "instance_type", "cpus", "memory", "ports", "image_id", "any_of", "ordered", "labels",
                                "autostop", "job_recovery", "disk_tier", "network_tier", "accelerator_args",
                                "max_hourly_cost", "spot_recovery"})
BUCKETS = ("s3://", "gs://", "gcs://", "r2://", "cos://", "oci://", "https://", "http://", "az://", "nebius://")
SKYPILOT_DISK_GB = 256  # github.com/skypilot-org/skypilot, sky/resources.py: _DEFAULT_DISK_SIZE_GB
# github.com/dstackai/dstack, src/dstack/_internal/core/models/resources.py:
DSTACK_DISK_GB = 100  # DEFAULT_DISK = DiskSpec(size=Range(min=100GB)), at least
GPU_VENDORS = ("nvidia", "amd", "google", "tpu", "intel", "tenstorrent")
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
NEAREST = {
    "bucket": "a volume for data that outlives the machine (`volumes: {PATH: NAME}`, `orch volume create`), "
              "outputs: for what comes home, or fetch it in setup:",
    "copied": "put it in the workdir (uploaded as the command's working directory), or a volume "
             "(`volumes: {PATH: NAME}`)",
    "ports": "orch opens no port to the internet: write results to outputs: (brought home verified), or reach the "
             "machine with `orch ssh NAME`",
    "service": "orch runs jobs that end: run it as a task (run:/commands:) whose results come home in outputs:",
}

_said: set[str] = set()  # what this process already printed (a file read twice is said once)


def dialect(data: dict) -> str | None:
    """"dstack", "skypilot", or None for orch's own dialect (keys only SkyPilot has, or ``type:``)."""
    if "type" in data:
        return "dstack"
    if SKYPILOT_ONLY & data.keys() or isinstance(data.get("secrets"), dict):
        return "skypilot"
    res = data.get("resources")
    if isinstance(res, list) or (isinstance(res, dict) and SKYPILOT_RESOURCES & res.keys()):
        return "skypilot"
    return None


def native(data: dict, lines, path: Path, schema) -> dict:
    """``data`` as orch's task keys (``schema``: ``task.Task``, whose own keys a peer's file may
    carry too): a peer's file translated, orch's own returned as it is.
    ``lines`` learns where each translated key came from, so a refusal further on still names the
    line the user wrote, and what was translated (``said``). UsageError: what orch cannot honour."""
    kind = dialect(data)
    if kind is None:
        return data
    tr = _Translation(Path(path), lines, schema)
    (_dstack if kind == "dstack" else _skypilot)(tr, data)
    tr.alias_lines()
    if lines is not None:
        lines.peer = (kind, tr.notes, json.dumps(data, sort_keys=True, default=str), tr.warnings)
    return tr.data


def said(path: Path, lines) -> list[str]:
    """What orch translated of a peer's file, to be said once the whole task is accepted (nothing
    for orch's own dialect, or for a file this process has already said it of)."""
    peer = getattr(lines, "peer", None)
    if peer is None:
        return []
    kind, notes, text, warnings = peer
    key = hashlib.sha256(f"{Path(path).resolve()}\0{text}".encode()).hexdigest()
    if key in _said:
        return []
    _said.add(key)
    return [f"orch: {path} is a {'dstack' if kind == 'dstack' else 'SkyPilot'} task; read as orch's:",
            *(f"  {note}" for note in notes), *(f"orch: warning: {path}: {w}" for w in warnings)]


class _Translation:
    """orch's keys being filled in, what was said of each, and where each came from in the file."""

    def __init__(self, path: Path, lines, schema):
        self.path, self.lines = path, lines
        self.task_keys = list(schema.model_fields)
        self.resource_keys = list(schema.model_fields["resources"].annotation.model_fields)
        self.data: dict[str, Any] = {}
        self.notes: list[str] = []
        self.warnings: list[str] = []  # what would run otherwise than its author expects, said before renting
        self.came_from: dict[tuple, tuple] = {}  # orch's key path -> the peer's

    def at(self, *key) -> str:
        return f"{self.path}:{self.lines.line(key) or 1}" if self.lines is not None else str(self.path)

    def refuse(self, key: tuple, what: str, nearest: str):
        raise UsageError(f"{self.at(*key)}: {what}: orch cannot honour it; nearest in orch: {nearest}")

    def wrong(self, key: tuple, expected: str, value):
        text = repr(value)
        raise UsageError(f"{self.at(*key)}: {'.'.join(map(str, key))}: expected {expected}, not "
                         f"{text if len(text) <= 60 else text[:57] + '...'}")

    def put(self, orch_key: tuple, value, peer_key: tuple, note: str | None = None) -> None:
        target = self.data
        for part in orch_key[:-1]:
            target = target.setdefault(part, {})
        target[orch_key[-1]] = value
        self.came_from[orch_key] = peer_key
        if note:
            self.notes.append(note)

    def skip(self, key: tuple, why: str) -> None:
        self.notes.append(f"{'.'.join(map(str, key))}: not used ({why})")

    def alias_lines(self) -> None:
        """Every translated key's line is its source's: ``task.check`` and the schema's refusals
        name the line the user wrote (``envs.X`` for ``env.X``, ``commands`` for ``run``)."""
        if self.lines is None:
            return
        at = self.lines.at
        below: dict[tuple, list[tuple]] = {}  # each path -> the paths under it (one pass over the file)
        for key in list(at):
            for n in range(len(key)):
                below.setdefault(key[:n], []).append(key)
        for orch_key, peer_key in sorted(self.came_from.items(), key=lambda kv: len(kv[0])):
            line = self.lines.line(peer_key)
            for key in below.get(peer_key, []):
                at.setdefault(orch_key + key[len(peer_key):], at[key])
            if line:
                at[orch_key] = line


# -- pieces both dialects use --------------------------------------------------------------------
def _name(tr: _Translation, value, key: tuple) -> None:
    if not isinstance(value, str):
        tr.wrong(key, "a string", value)
    fixed = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", value.lower())).strip("-")[:36].strip("-")
    tr.put(("name",), fixed or value, key, None if fixed == value else f"name: {value} -> {fixed} (orch's names "
                                                                       "are lowercase letters, digits and '-')")


def _int(tr: _Translation, value, key: tuple, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        tr.wrong(key, f"an integer of at least {low}", value)
    return value


def _gb(value, unit: str = "gb") -> float | None:
    """A size in GB: ``24GB``, ``1TB``, ``512MB``, ``80`` (in ``unit``); None when it is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) * (1024 if unit == "tb" else 1)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]i?b?)?\s*", str(value).lower())
    if not m:
        return None
    scale = {"k": 1 / 1024 ** 2, "m": 1 / 1024, "g": 1, "t": 1024, "p": 1024 ** 2}[(m.group(2) or unit)[0]]
    return float(m.group(1)) * scale


def _range(value) -> tuple[str | None, str | None]:
    """``A..B`` (either side may be empty), else the value as both ends."""
    text = str(value).replace(" ", "")
    if ".." in text:
        low, _, high = text.partition("..")
        return low or None, high or None
    return text, text


def _minutes(value) -> float | None:
    """A duration in minutes: seconds as a number (dstack), ``90s``, ``30m``, ``2h``, ``1d``, ``1w``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) / 60
    m = DURATION.fullmatch(str(value).strip().lower())
    if not m:
        return None
    return float(m.group(1)) * {"s": 1 / 60, "": 1 / 60, "m": 1, "h": 60, "d": 1440, "w": 10080}[m.group(2)]


def _gpu_name(name: str) -> str:
    """A peer's GPU name as orch's table knows it where it can (SkyPilot's ``RTX4090``, ``A10G``)."""
    from orchestrator import gpus

    for candidate in (name, re.sub(r"(?<=[A-Za-z])(?=\d)", " ", name)):
        if gpus.lookup(candidate):
            return gpus.canonical(candidate)
    return name


def _one_gpu(tr: _Translation, names: list[str], key: tuple) -> str:
    if len(names) != 1:
        tr.refuse(key, f"a choice of GPUs ({', '.join(names)})",
                  "one GPU type per task: name one in resources (`orch offers --gpu NAME` compares them)")
    return names[0]


def _env(tr: _Translation, value, key: tuple) -> None:
    """SkyPilot's ``envs`` or dstack's ``env``: plain values to ``env``, a variable without a value
    (to be given at launch) to ``secrets`` (read from this environment at each launch, never stored)."""
    pairs: list[tuple[str, Any, tuple]] = []
    if isinstance(value, dict):
        pairs = [(str(k), v, key + (k,)) for k, v in value.items()]
    elif isinstance(value, list) and key[0] == "env":
        for i, item in enumerate(value):
            if not isinstance(item, str):
                tr.wrong(key + (i,), "KEY=VALUE or KEY", item)
            name, sep, val = item.partition("=")
            pairs.append((name, val if sep else None, key + (i,)))
    else:
        tr.wrong(key, "a mapping" + (" or a list of KEY=VALUE" if key[0] == "env" else ""), value)
    plain, given = {}, []
    before = len(tr.data.get("secrets", []))
    for name, val, where in pairs:
        if val is None or (key[0] == "envs" and val == ""):
            tr.came_from[("secrets", before + len(given))] = where
            given.append(name)
        else:
            plain[name] = val
            tr.came_from[("env", name)] = where
    if plain:
        tr.data.setdefault("env", {}).update(plain)
        tr.notes.append(f"{key[0]}: {', '.join(plain)} -> env")
    if given:
        tr.data["secrets"] = list(dict.fromkeys(tr.data.get("secrets", []) + given))
        tr.notes.append(f"{key[0]}: {', '.join(given)} (no value: given at launch) -> secrets (read from this "
                        "environment at each launch, never stored)")


def _volume(tr: _Translation, path, name, key: tuple) -> None:
    if not isinstance(name, str):
        tr.wrong(key, "a volume name", name)
    tr.data.setdefault("volumes", {})[str(path)] = name
    tr.came_from[("volumes", str(path))] = key
    tr.notes.append(f"{'.'.join(map(str, key))}: volume {name} at {path} -> volumes")


def _orch_key(tr: _Translation, key: str, value) -> bool:
    """A key of orch's own in a peer's file (``checkpoint:`` beside ``num_nodes:``): kept as it is."""
    if key in tr.task_keys:
        tr.put((key,), value, (key,))
        return True
    return False


def _unknown(tr: _Translation, key: tuple, known, what: str):
    near = difflib.get_close_matches(str(key[-1]), sorted(known), n=1, cutoff=0.6)
    raise UsageError(f"{tr.at(*key)}: unknown key {key[-1]!r} in {what}"
                     + (f" (did you mean {near[0]!r}?)" if near else ""))


# -- SkyPilot ------------------------------------------------------------------------------------
def _skypilot(tr: _Translation, data: dict) -> None:
    for key, value in data.items():
        k = (key,)
        if key == "name":
            _name(tr, value, k)
        elif key in ("setup", "run"):
            if value is not None:
                tr.put(k, value, k)
        elif key == "num_nodes":
            tr.put(("nodes",), _int(tr, value, k), k, f"num_nodes: {value} -> nodes")
        elif key == "workdir":
            if not isinstance(value, str):
                tr.refuse(k, "a git workdir (url/ref)", "clone the repository in setup:, or a local workdir:")
            # Read beside the file, as orch's own workdir: is (a folder elsewhere: --workdir).
            tr.put(k, value, k, f"workdir: {value} (relative to the task file's folder)")
        elif key == "envs":
            _env(tr, value, k)
        elif key == "secrets":
            _sky_secrets(tr, value, k)
        elif key == "resources":
            _sky_resources(tr, value, k)
        elif key == "file_mounts":
            _file_mounts(tr, value, k)
        elif key == "volumes":
            if not isinstance(value, dict):
                tr.wrong(k, "a mapping PATH: NAME", value)
            for path, name in value.items():
                _volume(tr, path, name, k + (path,))
        elif key == "service":
            tr.refuse(k, "a SkyServe service (replicas behind an endpoint)", NEAREST["service"])
        elif key == "config":
            tr.refuse(k, "config: (SkyPilot's per-cloud options)", "resources.image for a container image; drop the rest")
        elif key == "event_callback":
            tr.refuse(k, "event_callback", "webhook_url under [notify] in config.toml (orch posts each job's end)")
        elif key in ("inputs", "outputs") and isinstance(value, dict):
            tr.skip(k, "SkyPilot's optimizer hints; orch's outputs: is a list of paths brought home")
        elif not _orch_key(tr, key, value):
            _unknown(tr, k, ["name", "workdir", "num_nodes", "resources", "envs", "secrets", "file_mounts",
                             "volumes", "setup", "run", *tr.task_keys], "a SkyPilot task")
    if "resources" not in data:
        tr.put(("resources", "cpu"), True, ("resources",), "no resources: a CPU machine (as SkyPilot rents)")
    if not isinstance(data.get("resources"), dict) or "disk_size" not in data["resources"]:
        # SkyPilot's default disk (``_DEFAULT_DISK_SIZE_GB = 256``; github.com/skypilot-org/skypilot,
        # sky/resources.py): what its users expect to have.
        tr.put(("resources", "disk"), SKYPILOT_DISK_GB, ("resources",), f"no resources.disk_size: resources.disk: "
               f"{SKYPILOT_DISK_GB} (GB, SkyPilot's default)")


def _sky_secrets(tr: _Translation, value, key: tuple) -> None:
    if isinstance(value, list):  # orch's own form
        tr.put(key, value, key)
        return
    if not isinstance(value, dict):
        tr.wrong(key, "a mapping NAME: null", value)
    names = []
    for name, val in value.items():
        if val not in (None, ""):
            tr.refuse(key + (name,), f"secrets.{name} holds its value in the file",
                      f"secrets: are read from this environment at each launch and never stored: export {name} "
                      f"and write `{name}: null`")
        tr.came_from[("secrets", len(tr.data.get("secrets", [])) + len(names))] = key + (name,)
        names.append(str(name))
    tr.data["secrets"] = list(dict.fromkeys(tr.data.get("secrets", []) + names))
    tr.notes.append(f"secrets: {', '.join(names)} -> secrets (read from this environment at each launch)")


def _accelerators(tr: _Translation, value, key: tuple) -> tuple[str, int, float | None]:
    """(GPU name, count per node, least VRAM) from ``NAME[:COUNT]``, ``{NAME: COUNT}`` or one candidate."""
    if isinstance(value, list):
        choices = [str(v) for v in value]
    elif isinstance(value, dict):
        choices = [f"{k}:{v}" if v is not None else str(k) for k, v in value.items()]
    elif isinstance(value, str):
        choices = [value]
    else:
        tr.wrong(key, "NAME:COUNT", value)
    name, _, count = _one_gpu(tr, choices, key).partition(":")
    try:
        number = float(count) if count else 1.0
    except ValueError:
        tr.wrong(key, "NAME:COUNT", value)
    if number != int(number) or number < 1:
        tr.refuse(key, f"a fraction of a GPU ({count})", "a whole GPU (resources.gpus: 1)")
    vram = None
    m = re.fullmatch(r"(.+?)-(\d+)GB", name.strip(), re.IGNORECASE)  # SkyPilot's A100-80GB, V100-32GB
    if m:
        name, vram = m.group(1), float(m.group(2))
    return _gpu_name(name.strip()), int(number), vram


def _sky_resources(tr: _Translation, res, key: tuple) -> None:
    if isinstance(res, list):
        tr.refuse(key, "a list of candidate resources", "one resources: mapping (orch ranks every provider's "
                                                        "offers itself; resources.provider takes a list)")
    if not isinstance(res, dict):
        tr.wrong(key, "a mapping", res)
    gpu_given = any(k in res for k in ("accelerators", "gpu", "cpu", "instance_type"))
    for name, value in res.items():
        k = key + (name,)
        if name == "accelerators":
            if value is None:
                continue
            gpu, count, vram = _accelerators(tr, value, k)
            tr.put(("resources", "gpu"), gpu, k)
            tr.put(("resources", "gpus"), count, k)
            if vram:
                tr.put(("resources", "min_vram"), vram, k)
            tr.notes.append(f"resources.accelerators: {value} -> resources.gpu: {gpu}, gpus: {count}"
                            + (f", min_vram: {vram:g}" if vram else ""))
        elif name == "use_spot":
            if not isinstance(value, bool):
                tr.wrong(k, "true or false", value)
            tr.put(("resources", "spot"), value, k, f"resources.use_spot: {str(value).lower()} -> resources.spot")
        elif name == "disk_size":
            size = _gb(value)
            if size is None or size < 1:
                tr.wrong(k, "a size in GB (256, 256GB)", value)
            tr.put(("resources", "disk"), int(size), k, f"resources.disk_size: {value} -> resources.disk: {int(size)}")
        elif name in ("infra", "cloud"):
            _infra(tr, value, k)
        elif name in ("region", "zone"):
            tr.skip(k, "orch ranks every region of the provider; a volume pins where it runs")
        elif name in ("cpus", "memory"):
            tr.skip(k, "orch rents by GPU type and count, not by CPUs or memory")
        elif name == "instance_type":
            tr.refuse(k, f"instance_type {value}", "resources.gpu and gpus, or `orch run --offer ID` (`orch offers` "
                                                   "lists them)")
        elif name == "ports":
            tr.refuse(k, f"ports {value}", NEAREST["ports"])
        elif name == "image_id":
            image = str(value)
            if not image.startswith("docker:"):
                tr.refuse(k, f"a machine image ({image})", "resources.image: a container image, where the provider "
                                                           "runs one")
            tr.put(("resources", "image"), image[len("docker:"):], k, f"resources.image_id: {image} -> resources.image")
        elif name == "autostop":
            _autostop(tr, value, k)
        elif name == "max_hourly_cost":
            tr.put(("resources", "max_price"), value, k, "resources.max_hourly_cost -> resources.max_price ($/hr)")
        elif name in ("any_of", "ordered"):
            tr.refuse(k, f"{name}: candidate resources", "one resources: mapping (orch ranks every provider's offers "
                                                         "itself; resources.provider takes a list)")
        elif name in ("labels", "disk_tier", "network_tier", "accelerator_args", "job_recovery", "spot_recovery"):
            tr.skip(k, "orch tags what it rents itself and relaunches a lost attempt (retries)"
                    if name in ("labels", "job_recovery", "spot_recovery") else "no such choice in orch")
        elif name in tr.resource_keys:
            tr.put(("resources", name), value, k)
        else:
            _unknown(tr, k, [*SKYPILOT_RESOURCES, *tr.resource_keys], "SkyPilot's resources")
    if not gpu_given:
        tr.put(("resources", "cpu"), True, key, "resources without accelerators: a CPU machine (as SkyPilot rents)")


def _infra(tr: _Translation, value, key: tuple) -> None:
    cloud, _, rest = str(value).partition("/")
    provider = cloud.lower()  # a cloud orch has no provider of is refused with the names it has
    tr.put(("resources", "provider"), provider, key, f"resources.{key[-1]}: {value} -> resources.provider: {provider}"
           + (f" ({rest}: not pinned; orch ranks every region)" if rest else ""))


def _autostop(tr: _Translation, value, key: tuple) -> None:
    down = False
    if isinstance(value, dict):
        down = bool(value.get("down"))
        value = value.get("idle_minutes", 5)
    if value is False or value is None:
        return
    minutes = 5.0 if value is True else (float(value) if isinstance(value, (int, float)) else _minutes(
        value if re.search(r"[a-z]$", str(value)) else f"{value}m"))
    if not minutes:
        tr.wrong(key, "minutes, 10h or {idle_minutes, down}", value)
    tr.put(("idle_minutes",), minutes, key)
    tr.put(("on_idle",), "destroy" if down else "stop", key,
           f"resources.autostop -> idle_minutes: {minutes:g}, on_idle: {'destroy' if down else 'stop'}")


def _file_mounts(tr: _Translation, mounts, key: tuple) -> None:
    if not isinstance(mounts, dict):
        tr.wrong(key, "a mapping REMOTE_PATH: SOURCE", mounts)
    for remote_path, source in mounts.items():
        k = key + (remote_path,)
        if isinstance(source, dict) and source.get("store") == "volume" and source.get("name"):
            _volume_store(tr, remote_path, source, k)  # SkyPilot's "Mount with existing volume"
            continue
        if isinstance(source, dict) or str(source).startswith(BUCKETS):
            tr.refuse(k, f"file_mounts {remote_path}: a bucket ({_bucket(source)})", NEAREST["bucket"])
        tr.refuse(k, f"file_mounts {remote_path}: a local path copied to the machine ({source})", NEAREST["copied"])


STORAGE_KEYS = ("name", "store", "source", "mode", "persistent", "config")


def _volume_store(tr: _Translation, path, spec: dict, key: tuple) -> None:
    """``{name, store: volume}`` with the rest of SkyPilot's storage mapping ("Cloud Buckets",
    docs.skypilot.co/en/latest/reference/storage.html: ``source`` uploaded into it, ``persistent``
    (default true) whether it outlives the task, ``mode``, ``config`` per-store options): what orch
    does as SkyPilot would is kept, the rest refused by name."""
    name = spec["name"]
    for field, value in spec.items():
        k = key + (field,)
        if field in ("name", "store"):
            continue
        if field == "source":
            tr.refuse(k, f"file_mounts {path}: source {_short(value)} synced into volume {name}",
                      f"put it in the workdir and copy it onto the volume in setup: (`cp -rn DIR {path}/`)")
        elif field == "config":
            tr.refuse(k, f"file_mounts {path}: config: (per-store options for volume {name})",
                      "drop it: orch mounts the volume as its provider makes it")
        elif field == "persistent":
            if value is False:
                tr.refuse(k, f"file_mounts {path}: persistent: false (volume {name} deleted when the task ends)",
                          f"orch keeps a volume until `orch volume rm {name}`: run that after the job (outputs: "
                          "brings home what the job leaves)")
            if value is not True:
                tr.wrong(k, "true or false", value)
            tr.notes.append(f"file_mounts.{path}.persistent: true, as orch keeps volume {name}: until `orch volume rm "
                            f"{name}`")
        elif field == "mode":
            if str(value).upper() != "MOUNT":
                tr.refuse(k, f"file_mounts {path}: mode {value} for volume {name}",
                          "a volume is mounted (mode: MOUNT), never copied")
        else:
            _unknown(tr, k, STORAGE_KEYS, "a file_mounts storage")
    _volume(tr, path, name, key)


def _bucket(source) -> str:
    if isinstance(source, dict):
        return str(source.get("source") or source.get("name") or source.get("store") or "storage")
    return str(source)


# -- dstack --------------------------------------------------------------------------------------
DSTACK_NOTES = {
    "python": "orch runs the machine's Python; a container image: resources.image",
    "nvcc": "orch runs the machine's own CUDA toolkit",
    "regions": "orch ranks every region of the provider; a volume pins where it runs",
    "availability_zones": "orch ranks every zone; a volume pins where it runs",
    "tags": "orch tags what it rents itself", "single_branch": "no repository is cloned",
    "stop_duration": "orch ends a command with SIGTERM when it stops the job",
    "creation_policy": "orch rents a machine for every job", "utilization_policy": "orch's watchdog counts idle time",
    "priority": "orch starts a job when it is run", "startup_order": "orch starts every node together",
    "stop_criteria": "orch ends the job once every node's command has ended",
    "termination_policy": "orch gives the machine back when the job ends",
    "termination_idle_time": "orch gives the machine back when the job ends",
}
DSTACK_REFUSED = {
    "ports": NEAREST["ports"],
    "files": "workdir: (a local folder, uploaded as the command's working directory)",
    "working_dir": "orch runs commands in its workdir: `cd DIR` as the first of the commands",
    "instance_types": "resources.gpu and gpus, or `orch run --offer ID` (`orch offers` lists them)",
    "reservation": "none: orch rents on demand or spot",
    "fleets": "`orch exec NAME -f FILE` runs it on a machine of yours that is up",
    "schedule": "`orch schedule add NAME -f FILE --cron EXPR`",
    "privileged": "none: orch runs the command as the machine's login user",
    "docker": "none: orch runs the command on the machine itself", "entrypoint": "run:/commands:",
    "user": "none: orch runs the command as the machine's login user", "home_dir": "none",
    "registry_auth": "a public resources.image", "replicas": NEAREST["service"], "gateway": NEAREST["service"],
}
DSTACK_KEYS = ("type", "name", "nodes", "commands", "setup", "env", "resources", "image", "repos", "spot_policy",
               "max_price", "max_duration", "retry", "volumes", "backends", "idle_duration", "shell",
               *DSTACK_NOTES, *DSTACK_REFUSED)


def _dstack(tr: _Translation, data: dict) -> None:
    kind = data.get("type")
    if kind == "service":
        tr.refuse(("type",), "a dstack service (an endpoint kept up)", NEAREST["service"])
    if kind == "dev-environment":
        tr.refuse(("type",), "a dstack dev environment (an IDE on a machine)",
                  "`orch up NAME --gpu GPU` then `orch ssh NAME` (or a task: type: task)")
    if kind != "task":
        tr.refuse(("type",), f"type: {kind}", "a dstack task (type: task) or orch's own task file")
    tr.notes.append("type: task -> a command job")
    for key, value in data.items():
        k = (key,)
        if key == "type":
            continue
        if key == "name":
            _name(tr, value, k)
        elif key == "nodes":
            tr.put(("nodes",), _int(tr, value, k), k, f"nodes: {value} -> nodes")
        elif key in ("commands", "setup"):
            script = _commands(tr, value, k)
            tr.put(("run" if key == "commands" else "setup",), script, k,
                   f"{key}: {len(value) if isinstance(value, list) else 1} line(s) -> "
                   f"{'run' if key == 'commands' else 'setup'} (joined with && as dstack runs them)")
        elif key == "env":
            _env(tr, value, k)
        elif key == "resources":
            _dstack_resources(tr, value, k)
        elif key == "image":
            tr.put(("resources", "image"), value, k, "image -> resources.image")
        elif key == "repos":
            _repos(tr, value, k)
        elif key == "spot_policy":
            if value not in ("spot", "on-demand", "auto"):
                tr.wrong(k, "spot, on-demand or auto", value)
            tr.put(("resources", "spot"), value == "spot", k, f"spot_policy: {value} -> resources.spot: "
                   f"{str(value == 'spot').lower()}" + (" (orch rents on-demand unless asked for spot)"
                                                        if value == "auto" else ""))
        elif key == "max_price":
            tr.put(("resources", "max_price"), value, k, "max_price -> resources.max_price ($/hr)")
        elif key == "max_duration":
            minutes = None if value == "off" else _minutes(value)
            if value != "off" and not minutes:
                tr.wrong(k, "a duration (2h, 30m, seconds) or off", value)
            if minutes:
                tr.put(("max_hours",), minutes / 60, k, f"max_duration: {value} -> max_hours: {minutes / 60:g}")
        elif key == "idle_duration":
            minutes = _minutes(value)
            if minutes:
                tr.put(("idle_minutes",), minutes, k, f"idle_duration: {value} -> idle_minutes: {minutes:g}")
        elif key == "retry":
            if value is False:
                tr.put(("retries",), 0, k, "retry: false -> retries: 0")
            else:
                tr.skip(k, "orch relaunches a lost attempt up to retries: (default 3); a command's own failure "
                           "is never relaunched")
        elif key == "volumes":
            _dstack_volumes(tr, value, k)
        elif key == "backends":
            names = value if isinstance(value, list) else [value]
            providers = [str(n).lower() for n in names]  # one orch has none of: refused with the names it has
            tr.put(("resources", "provider"), providers, k, f"backends -> resources.provider: {', '.join(providers)}")
        elif key == "shell":
            if str(value).rsplit("/", 1)[-1] not in ("bash", "sh"):
                tr.refuse(k, f"shell: {value}", "orch runs commands with bash")
            tr.skip(k, "orch runs commands with bash")
        elif key in DSTACK_NOTES:
            tr.skip(k, DSTACK_NOTES[key])
        elif key in DSTACK_REFUSED:
            tr.refuse(k, f"{key}: {_short(value)}", DSTACK_REFUSED[key])
        elif not _orch_key(tr, key, value):
            _unknown(tr, k, [*DSTACK_KEYS, *tr.task_keys], "a dstack task")
    if "resources" not in data:
        tr.put(("resources", "cpu"), True, ("type",), "no resources: a CPU machine (dstack's default has no GPU)")
    if not isinstance(data.get("resources"), dict) or "disk" not in data["resources"]:
        tr.put(("resources", "disk"), DSTACK_DISK_GB, ("type",), f"no resources.disk: resources.disk: {DSTACK_DISK_GB} "
               "(GB, dstack's default: 100GB..)")
    if "repos" not in data and "workdir" not in tr.data:
        named = _files_named(tr.path.parent, (tr.data.get("setup"), tr.data.get("run")))
        if named:
            tr.warnings.append(
                f"the commands name {', '.join(named)} (beside the file), but no repos: attaches its folder: the "
                "command starts in an empty workdir, as under dstack, and will not find them; add `repos: [.]` "
                "(the folder goes up as the workdir; `orch run --dry-run` says how big)")


def _files_named(folder: Path, scripts) -> list[str]:
    """The words of ``scripts`` that are files in ``folder`` (``python train.py``, ``-r requirements.txt``,
    ``--config=cfg.yaml``), at most three: what a command expects to find in its workdir."""
    import shlex

    found: list[str] = []
    for script in scripts:
        try:
            words = shlex.split(script or "", comments=True)
        except ValueError:  # an unclosed quote: the plain words
            words = (script or "").split()
        for word in words:
            word = word.rsplit("=", 1)[-1]
            if not word or "$" in word or word.startswith(("-", "/", "~")) or word in found or len(word) > 255:
                continue
            try:
                if (folder / word).is_file():
                    found.append(word)
            except (OSError, ValueError):
                continue
    return found[:3]


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _commands(tr: _Translation, value, key: tuple) -> str:
    """dstack's own join (``_join_shell_commands``): each stripped, a background one braced, `` && ``."""
    lines = value if isinstance(value, list) else [value]
    out = []
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            tr.wrong(key + (i,), "a shell command (a string)", line)
        line = line.strip()
        out.append("{ %s }" % line if line.endswith("&") else line)
    return " && ".join(out)


def _dstack_gpu(tr: _Translation, value, key: tuple) -> tuple[str | None, int, float | None, float | None]:
    """(GPU name, count, least VRAM, most VRAM) from dstack's GPU spec; count 0: no GPU. A memory is a
    ``Range`` as dstack's resources.py reads it: ``24GB`` is exactly 24GB (min and max), ``24GB..``
    at least, ``..80GB`` at most; its offers are filtered on both ends (``min_gpu_memory`` and
    ``max_gpu_memory`` of the query, core/backends/base/offers.py)."""
    spec: dict[str, Any] = {}
    if isinstance(value, bool):
        tr.wrong(key, "a GPU spec (A100:2, 24GB, 2)", value)
    if isinstance(value, int):
        value = str(value)
    if isinstance(value, str):
        for token in value.replace(" ", "").split(":"):
            if not token:
                tr.wrong(key, "a GPU spec (A100:2, 24GB, 2)", value)
            if token.lower() in GPU_VENDORS:
                spec["vendor"] = token.lower()
            elif token[0].isalpha():
                spec["name"] = token.split(",")
            elif any(c.isalpha() for c in token):
                spec["memory"] = token
            else:
                spec["count"] = token
    elif isinstance(value, dict):
        spec = dict(value)
        if isinstance(spec.get("name"), str):
            spec["name"] = [spec["name"]]
    else:
        tr.wrong(key, "a GPU spec (A100:2, 24GB, 2)", value)
    if spec.get("vendor") not in (None, "nvidia"):
        tr.refuse(key, f"GPU vendor {spec['vendor']}", "resources.gpu: the GPU's name (orch matches GPUs by name)")
    for extra in ("total_memory", "compute_capability"):
        if spec.get(extra) is not None:
            tr.skip(key + (extra,), "orch matches a GPU by its name, count and memory")
    low, high = _range(spec.get("count", 1))
    try:
        count = int(low) if low is not None else 1
    except ValueError:
        tr.wrong(key, "a GPU count (2, 1..2)", spec.get("count"))
    if low != high:
        tr.notes.append(f"{'.'.join(key)}: count {spec.get('count')} -> {count} (orch rents an exact count: the least)")
    vram = most = None
    if spec.get("memory") is not None:
        mem_low, mem_high = _range(spec["memory"])
        vram = _gb(mem_low) if mem_low else None
        most = _gb(mem_high) if mem_high else None
        if (mem_low and vram is None) or (mem_high and most is None) or (vram and most and vram > most):
            tr.wrong(key, "a GPU memory (24GB, 24GB.., 24GB..80GB)", spec["memory"])
    names = spec.get("name")
    name = _gpu_name(_one_gpu(tr, [str(n) for n in names], key)) if names else None
    return name, count, vram, most


def _dstack_resources(tr: _Translation, res, key: tuple) -> None:
    if not isinstance(res, dict):
        tr.wrong(key, "a mapping", res)
    gpu = None
    for name, value in res.items():
        k = key + (name,)
        if name == "gpu":
            gpu, count, vram, most = _dstack_gpu(tr, value, k)
            if count == 0:
                tr.put(("resources", "cpu"), True, k, f"resources.gpu: {value} -> resources.cpu: true")
                continue
            if gpu:
                tr.put(("resources", "gpu"), gpu, k)
            tr.put(("resources", "gpus"), count, k)
            if vram:
                tr.put(("resources", "min_vram"), vram, k)
            if most:
                tr.put(("resources", "max_vram"), most, k)
            tr.notes.append(f"resources.gpu: {value} -> resources.gpu: {gpu or 'any'}, gpus: {count}"
                            + (f", min_vram: {vram:g}" if vram else "") + (f", max_vram: {most:g}" if most else "")
                            + (" (GB per GPU)" if vram or most else ""))
        elif name == "disk":
            size = value.get("size") if isinstance(value, dict) else value
            low, _ = _range(size)
            gb = _gb(low) if low else None
            if gb is None or gb < 1:
                tr.wrong(k, "a disk size (100GB, 100GB..)", value)
            tr.put(("resources", "disk"), int(-(-gb // 1)), k, f"resources.disk: {value} -> resources.disk: "
                                                               f"{int(-(-gb // 1))} (GB)")
        elif name in ("cpu", "memory", "shm_size") and not (name == "cpu" and isinstance(value, bool)):
            tr.skip(k, "orch rents by GPU type and count, not by CPUs or memory")
        elif name in tr.resource_keys:
            tr.put(("resources", name), value, k)
        else:
            _unknown(tr, k, ["gpu", "disk", "cpu", "memory", "shm_size", *tr.resource_keys], "dstack's resources")
    if "gpu" not in res and "gpus" not in res and not isinstance(res.get("cpu"), bool):
        tr.put(("resources", "cpu"), True, key, "resources without a gpu: a CPU machine (dstack's default has none)")


def _repos(tr: _Translation, value, key: tuple) -> None:
    repos = value if isinstance(value, list) else [value]
    if len(repos) != 1:
        tr.refuse(key, f"{len(repos)} repos", "one workdir: (a local folder)")
    repo = repos[0]
    local = repo.get("local_path") if isinstance(repo, dict) else str(repo)
    if isinstance(repo, dict) and repo.get("url") or (isinstance(repo, str) and re.match(r"^(\w+://|git@)", repo)):
        tr.refuse(key, f"a remote repository ({_short(repo.get('url') if isinstance(repo, dict) else repo)})",
                  "clone it in setup: (or commands:), or a local workdir:")
    if not local:
        tr.wrong(key, "a local path", repo)
    local = local.split(":", 1)[0]  # the short form LOCAL:PATH: where it lands is orch's workdir
    tr.put(("workdir",), local, key + (0,) if isinstance(value, list) else key,
           f"repos: {local} -> workdir: {local} (uploaded; the commands run in it)")


def _dstack_volumes(tr: _Translation, value, key: tuple) -> None:
    if not isinstance(value, list):
        tr.wrong(key, "a list of NAME:PATH", value)
    for i, vol in enumerate(value):
        k = key + (i,)
        if isinstance(vol, str):
            name, sep, path = vol.partition(":")
            instance = name.startswith(("/", "~"))
        elif isinstance(vol, dict):
            name, path, sep = vol.get("name"), vol.get("path"), ":"
            instance = "instance_path" in vol
        else:
            tr.wrong(k, "NAME:PATH", vol)
        if instance:
            tr.refuse(k, "an instance volume (a folder of the host)", "a network volume (`volumes: {PATH: NAME}`, "
                                                                      "`orch volume create`)")
        if isinstance(name, list):
            if len(name) != 1:
                tr.refuse(k, f"a choice of volumes ({', '.join(map(str, name))})", "one volume per path")
            name = name[0]
        if not sep or not path:
            tr.wrong(k, "NAME:PATH", vol)
        if isinstance(name, str) and "${{" in name:
            _per_node(tr, path, name, k)
            continue
        _volume(tr, path, name, k)


# dstack's volume name interpolation (``interpolate_job_volumes``, server/services/jobs/configurators/base.py:
# ``dstack.node_rank`` and its alias ``dstack.job_num``); orch names node R's volume NAME-R.
NODE_RANK = re.compile(r"([a-z0-9][a-z0-9-]*)-\$\{\{\s*dstack\.(?:node_rank|job_num)\s*\}\}")


def _per_node(tr: _Translation, path, name: str, key: tuple) -> None:
    """``NAME-${{ dstack.node_rank }}``: node R mounts ``NAME-R``, orch's ``per_node: true``."""
    m = NODE_RANK.fullmatch(name.strip())
    if not m:
        tr.refuse(key, f"volume name {name}", "one volume per node, named NAME-${{ dstack.node_rank }} here, or in "
                                              "orch's words `volumes: {PATH: {name: NAME, per_node: true}}` (node R "
                                              "mounts NAME-R)")
    base = m.group(1)
    tr.data.setdefault("volumes", {})[str(path)] = {"name": base, "per_node": True}
    tr.came_from[("volumes", str(path))] = key
    tr.notes.append(f"{'.'.join(map(str, key))}: volume {name} at {path} -> volumes: {{{path}: {{name: {base}, "
                    f"per_node: true}}}} (node R mounts {base}-R)")
