"""A task file (``orch run -f task.yaml``): what to run, where, and what comes home, in one YAML file.

Modelled on what SkyPilot's and dstack's users already write (SkyPilot's "YAML Configuration
Specification", docs.skypilot.co/en/latest/reference/yaml-spec.html; dstack's ``type: task``
reference, dstack.ai/docs/reference/dstack.yml/task):
``resources``, ``setup`` once per instance, ``run`` detached, ``env``/``secrets``, a ``workdir``
uploaded, ``outputs`` home, and a ``checkpoint`` folder that orch itself carries across a lost
machine. ``train:`` instead of ``run:`` is today's LibreYOLO job. The README's "Task files" section
is the field reference; this module is the schema, and it refuses a whole file before anything is
rented: each refusal is one line, with the file and line (an unknown key names the nearest known
one, a wrong type what was expected).
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from orchestrator.errors import UsageError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
RESERVED_ENV = ("ORCH_",)  # orch's own (nodes.node_env, ORCH_CHECKPOINT_DIR)
DEFAULT_WORKDIR_MB = 200.0  # workdir_max_mb: a workdir is code and small files; data goes by other ways
# What orch writes home beside the outputs (the run's log and status): an output of that name is refused.
RESERVED_OUTPUTS = ("train.log", "status.json", ".orch-pull.json")
PREEMPT_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "none")  # preempt_signal: what a spot notice sends


class _Strict(BaseModel):
    """No key the schema does not know, no type coerced from another ('2' is not 2)."""

    model_config = ConfigDict(extra="forbid", strict=True)


Scalar = Union[str, bool, int, float]


class Resources(_Strict):
    provider: Optional[Union[str, list[str]]] = None  # one, or several to rank
    gpu: Optional[str] = None
    gpus: int = Field(1, ge=1, le=64)
    cpu: bool = False
    disk: Optional[int] = Field(None, ge=1, le=65536)  # GB
    image: Optional[str] = None
    spot: bool = False
    bid: Optional[float] = Field(None, gt=0, lt=1000)
    max_price: Optional[float] = Field(None, gt=0, lt=10000)  # $/hr: offers above it are not ranked
    min_vram: Optional[float] = Field(None, gt=0, le=4096)  # GB per GPU (dstack's gpu: 24GB, SkyPilot's A100-80GB)
    max_vram: Optional[float] = Field(None, gt=0, le=4096)  # GB per GPU at most (dstack's gpu: 24GB, 24GB..80GB)


class Train(_Strict):
    """Today's LibreYOLO job: every option of `orch run --data`."""

    data: str
    model: str = "yolo9-t"
    epochs: int = Field(10, ge=1, le=100_000)
    imgsz: Optional[int] = None
    batch: Optional[int] = None
    save_period: Optional[int] = None
    args: dict[str, Scalar] = Field(default_factory=dict)  # --train-arg key=value
    push_to: Optional[str] = None
    resume: bool = False


class Schedule(_Strict):
    """``schedule:``, read by `orch schedule add -f task.yaml`: each flag given there wins over its key here."""

    cron: str
    tz: Optional[str] = None
    window: Optional[str] = None
    max_price: Optional[float] = Field(None, ge=0, lt=10000)
    max_cost: Optional[float] = Field(None, ge=0, lt=1e6)
    overlap: Literal["skip", "queue"] = "skip"
    misfire: Literal["skip", "run-once"] = "skip"


class VolumeSpec(_Strict):
    """``volumes: {PATH: {name: NAME, per_node: true}}``: one volume per node of a group (``NAME-R``)."""

    name: str
    per_node: bool = False


class Task(_Strict):
    name: Optional[str] = None
    resources: Resources = Field(default_factory=Resources)
    nodes: int = Field(1, ge=1, le=64)
    setup: Optional[str] = None
    run: Optional[str] = None
    train: Optional[Train] = None
    workdir: Optional[str] = None
    workdir_max_mb: float = Field(DEFAULT_WORKDIR_MB, gt=0, le=100_000)
    env: dict[str, Scalar] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    checkpoint: Optional[str] = None
    checkpoint_minutes: float = Field(10.0, gt=0, le=100_000)
    keep_checkpoints: int = Field(1, ge=0, le=1000)  # copies kept at home after success (newest first)
    preempt_signal: Literal["TERM", "INT", "HUP", "USR1", "USR2", "none"] = "TERM"  # on a spot notice
    max_cost: Optional[float] = Field(None, gt=0, lt=1e6)
    max_hours: Optional[float] = Field(None, gt=0, le=100_000)
    retries: int = Field(3, ge=0, le=20)
    idle_minutes: Optional[float] = Field(None, gt=0, le=100_000)
    on_idle: Optional[Literal["auto", "stop", "destroy"]] = None
    keep: bool = False
    schedule: Optional[Schedule] = None  # read by `orch schedule add` only
    volumes: dict[str, Union[str, VolumeSpec]] = Field(default_factory=dict)  # PATH: NAME (``volume_uses``)
    _workdir_given: bool = PrivateAttr(False)  # --workdir on the command line: read from there, wherever it is


# -- reading a file -----------------------------------------------------------------------------
class _Lines:
    """Where each key and value of the YAML document sits (1-based lines), by its path."""

    def __init__(self, node):
        self.at: dict[tuple, int] = {}
        self._walk(node, ())

    def _walk(self, node, path):
        import yaml

        self.at.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = path + (k.value,)
                self.at[key] = k.start_mark.line + 1
                self._walk(v, key)
                self.at[key] = k.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                self._walk(v, path + (i,))

    def line(self, path) -> int | None:
        path = tuple(path)
        while path:
            if path in self.at:
                return self.at[path]
            path = path[:-1]
        return self.at.get(())


def _expected(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    words = {"string_type": "a string", "int_type": "an integer", "float_type": "a number",
             "bool_type": "true or false",
             "dict_type": "a mapping (key: value)", "list_type": "a list", "model_type": "a mapping (key: value)",
             "int_from_float": "an integer", "literal_error": f"one of {ctx.get('expected', '')}",
             "missing": "a value (it is required)"}
    if kind in words:
        return words[kind]
    for bound, word in (("greater_than_equal", "at least"), ("greater_than", "above"), ("less_than_equal", "at most"),
                        ("less_than", "below")):
        if kind.startswith(bound):
            return f"a value {word} {next(iter(ctx.values()), '')}"
    return err["msg"].lower()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _known(model, path) -> list[str]:
    """The keys the schema knows at ``path`` (its last part is the unknown key)."""
    for part in path[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        ann = getattr(info, "annotation", None)
        for cand in (ann, *getattr(ann, "__args__", ())):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
        else:
            return []
    return list(model.model_fields)


def _refusal(path: Path, lines: _Lines, err: dict) -> str:
    loc = [p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in ("str", "list[str]")))]
    where = f"{path}:{lines.line(loc) or 1}"
    dotted = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        key = str(loc[-1])
        near = difflib.get_close_matches(key, _known(Task, loc), n=1, cutoff=0.5)
        return f"{where}: unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else
                                                  f" (known here: {', '.join(_known(Task, loc))})")
    return f"{where}: {dotted}: expected {_expected(err)}, not {_show(err.get('input'))}"


MAX_DEPTH = 32  # nesting a task file may have: its deepest key is three levels down


def _loader():
    """PyYAML's safe loader, refusing what only makes a small file huge: an alias (``*name``) makes
    a value another node's, and nine nested lists of nine aliases each are a billion values in 400
    bytes (walking, validating or printing them never ends). Each value written out is read once.
    And no deeper nesting than ``MAX_DEPTH`` (the composer recurses)."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in a task file: "
                                                  "write the value out", self.peek_event().start_mark)
            if self.depth >= MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return NoAliases


def load(path: Path) -> tuple[Task, _Lines]:
    """The file, validated as a whole; UsageError (one line with file:line) at the first problem."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the task file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    loader = _loader()(text)
    try:
        node = loader.get_single_node()  # composed once; the values are built from this very node
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise UsageError(f"{path}:{line}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    finally:
        loader.dispose()
    if node is None or data is None:
        raise UsageError(f"{path}:1: the task file is empty")
    lines = _Lines(node)
    if not isinstance(data, dict):
        raise UsageError(f"{path}:1: a task file is a mapping (name:, resources:, run:, ...), "
                         f"not {type(data).__name__}")
    from orchestrator.tasks import peer_tasks

    data = peer_tasks.native(data, lines, path, Task)  # a SkyPilot or dstack task file, read as orch's own
    try:
        task = Task.model_validate(data)
    except ValidationError as e:
        errors = sorted(e.errors(), key=lambda err: lines.line(err["loc"]) or 0)  # the first in the file
        raise UsageError(_refusal(path, lines, errors[0])) from None
    return task, lines


# -- the checks across fields -------------------------------------------------------------------
def under_workdir(rel: str, what: str, where: str) -> str:
    """A path the task names inside its workdir, normalised; refused when it leaves it."""
    norm = posixpath.normpath(rel.strip()) if rel and rel.strip() else ""
    if not norm or norm == "." or norm.startswith("/") or norm == ".." or norm.startswith("../") or "\0" in norm \
            or rel.strip().startswith("~"):
        raise UsageError(f"{where}: {what} {rel!r} leaves the workdir: name a path inside it (e.g. out/model.pt)")
    return norm


def where(path: Path, lines: _Lines, *key, command: str = "orch run") -> str:
    """``FILE:LINE`` of a key, for a refusal made outside this module (the job's name); with no
    file (``orch run NAME -- CMD``), the command line: ``command``, the one asking."""
    if lines is None:
        return command
    return f"{path}:{lines.line(key) or 1}"


def check(task: Task, path: Path | None, lines: _Lines | None, environ=None, command: str = "orch run") -> None:
    """What the schema alone cannot say, each with its line: nothing is opened or rented before."""
    environ = os.environ if environ is None else environ

    def at(*key) -> str:
        return where(path, lines, *key, command=command)

    if task.run is not None and task.train is not None:
        raise UsageError(f"{at('train')}: give run: (a command) or train: (a LibreYOLO training), not both")
    for key in ("run", "setup"):
        value = getattr(task, key)
        if value is not None and not value.strip():
            raise UsageError(f"{at(key)}: {key}: is empty")
    if task.train is not None:
        for key in ("setup", "workdir", "outputs", "checkpoint", "secrets", "env"):
            if getattr(task, key):
                raise UsageError(f"{at(key)}: {key}: is for a command (run:); a train: job stages its data itself")
    for i, out in enumerate(task.outputs):
        norm = under_workdir(out, "output", at("outputs", i))
        if norm in RESERVED_OUTPUTS:
            raise UsageError(f"{at('outputs', i)}: output {out!r} is a name orch writes home itself: rename it")
    if task.checkpoint is not None:
        under_workdir(task.checkpoint, "checkpoint folder", at("checkpoint"))
    for key, value in task.env.items():
        if not ENV_NAME.fullmatch(key) or key.startswith(RESERVED_ENV):
            raise UsageError(f"{at('env', key)}: env: {key!r} is not a variable name a command may set"
                             + (" (ORCH_ names are orch's)" if key.startswith(RESERVED_ENV) else ""))
        if "\0" in scalar(value):
            raise UsageError(f"{at('env', key)}: env: {key} holds a NUL character, which no environment variable can")
    for key in ("run", "setup"):
        if "\0" in (getattr(task, key) or ""):
            raise UsageError(f"{at(key)}: {key}: holds a NUL character")
    for i, name in enumerate(task.secrets):
        if not ENV_NAME.fullmatch(name) or name.startswith(RESERVED_ENV):
            raise UsageError(f"{at('secrets', i)}: secrets: {name!r} is not a variable name")
        if name in task.env:
            raise UsageError(f"{at('secrets', i)}: {name} is both in env: and in secrets:")
        if not environ.get(name):
            raise UsageError(f"{at('secrets', i)}: secret {name} is not set in this environment: export it before "
                             f"`{command}` (its value is read at launch and never stored)")
    if task.resources.cpu and task.resources.gpu:
        raise UsageError(f"{at('resources', 'gpu')}: resources: cpu: true and a gpu exclude each other")
    low, high = task.resources.min_vram, task.resources.max_vram
    if low is not None and high is not None and low > high:
        raise UsageError(f"{at('resources', 'max_vram')}: resources: max_vram {high:g} is below min_vram {low:g}: "
                         "no GPU has both")
    volume_flags(task, at)


def volume_flags(task: Task, at=lambda *key: "volumes") -> list[str]:
    """The task's ``volumes:`` checked (names, paths, nothing twice), as ``--volume`` flags write them."""
    from orchestrator.volumes import volume_uses

    uses = []
    for path, value in task.volumes.items():
        name, per_node = (value, False) if isinstance(value, str) else (value.name, value.per_node)
        volume_uses.check_volume_name(name, per_node, f"{at('volumes', path)}: volumes")
        uses.append(volume_uses.Use(name, volume_uses.check_path(path, f"{at('volumes', path)}: volumes"), per_node))
    volume_uses.check_uses(uses, f"{at('volumes')}: volumes")
    return [f"{u.name}:{u.path}" + (f":{volume_uses.PER_NODE}" if u.per_node else "") for u in uses]


def secret_values(names: list[str], environ=None) -> dict[str, str]:
    """The secrets' values, from this process's environment, at launch (a relaunch by the reaper
    reads the reaper's own): absent ones refused."""
    environ = os.environ if environ is None else environ
    missing = [n for n in names if not environ.get(n)]
    if missing:
        raise UsageError(f"secret {', '.join(missing)} is not set in this orch process's environment: the job "
                         "reads secrets at every launch and stores none")
    return {n: environ[n] for n in names}


# Values this process holds only to hide them, for the one job whose text it handles now
# (``hiding``): a context variable, so that a pass looking at many jobs hides each one's alone.
_HIDDEN_TOO: ContextVar[dict[str, set[str]]] = ContextVar("hidden_too", default={})


@contextmanager
def hiding(values: dict[str, str]) -> Iterator[None]:
    """While the block runs, ``held_secrets`` also holds ``values``: the secrets a job got without
    them being in this process's environment (a schedule's run: those stored for that schedule, and
    only while that run's step is taken, so another schedule's short value never masks this run's
    text). Never read at a launch (``secret_values``): nothing here is sent anywhere."""
    merged = {name: set(found) for name, found in _HIDDEN_TOO.get().items()}
    for name, value in values.items():
        merged.setdefault(name, set()).add(value)
    token = _HIDDEN_TOO.set(merged)
    try:
        yield
    finally:
        _HIDDEN_TOO.reset(token)


def held_secrets(names, environ=None) -> tuple[list[str], list[str]]:
    """(the values this process holds of the secrets ``names``, the names it does not hold): what
    ``text.redact`` hides in whatever came from an instance that got them. Where one is not held,
    nothing that may show it (a log's lines) is kept or shown."""
    environ = os.environ if environ is None else environ
    names = [n for n in names or () if isinstance(n, str)]
    values = [environ[n] for n in names if environ.get(n)]
    hidden = _HIDDEN_TOO.get()
    values += [v for n in names for v in sorted(hidden.get(n, ())) if v and v not in values]
    return values, [n for n in names if not environ.get(n) and not hidden.get(n)]


def env_pairs(pairs: list[str], flag: str = "--env") -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.fullmatch(key) or key.startswith(RESERVED_ENV):
            raise UsageError(f"{flag} takes NAME=VALUE with a plain variable name, not {pair!r}")
        if "\0" in value:
            raise UsageError(f"{flag} {key}: the value holds a NUL character, which no environment variable can")
        out[key] = value
    return out


def scalar(value: Any) -> str:
    """An env value as the shell sees it: YAML's true is 'true', not 'True'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
