"""``orch export modal|beam NAME``: the same training job as ``orch run``, written as one readable
Modal or Beam app file that the user runs with the platform's own CLI.

Serverless platforms run a decorated function on a GPU and scale to zero when it returns; their traps
are few and costly, and the file avoids each: an explicit per-attempt timeout (no unbounded bill when
it hangs), a deadline over every attempt (``--max-hours``), a volume for the run and for ``HF_HOME``
(the container's disk is ephemeral; Modal keeps only what ``volume.commit()`` saved), and a resume
from the volume's ``last.pt`` (Modal caps one attempt at 24 h).

The file is built from the templates in ``export_templates/`` plus orch's own on-instance code
(data extraction, checkpoint check, LibreYOLO model building, hub push), copied in by name so there
is one source of each. After writing, ``verify`` loads the file with the platform's SDK in a child
process, offline (nothing leaves 127.0.0.1, no account), and reads back its GPU, timeout and volume.
"""

from __future__ import annotations

import ast
import json
import math
import os
import pprint
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from string import Template

from orchestrator.errors import OrchError, UsageError

TEMPLATES = Path(__file__).with_name("export_templates")
ON_INSTANCE = Path(__file__).resolve().parent.parent / "playbooks" / "on_instance"
# What orch itself runs on an instance, copied into the file: (module, top-level names).
EMBEDDED = (
    ("train_entry.py", ("LAZY_FAMILIES", "name_map_without_lazy_families", "build")),
    ("hub_push.py", ("OrchHubPush",)),
    ("extract.py", ("orch_extract", "point")),
    ("checkpoint.py", ("_DTYPES", "_STORAGES", "_QSCHEMES", "ALLOWED", "_REAL", "MAX_PICKLE", "MAX_OPS", "_STRINGS",
                       "_GETS", "_PUTS", "_NEUTRAL", "_resolved", "allowed", "refused_global", "_Stub", "_bytearray",
                       "_encode", "_clipped", "_GUARDED", "_Inert", "_epoch_of", "NotTorch", "_RECORDS",
                       "_MAX_DIRECTORY", "MAX_RECORDS", "_fields", "_zip64", "torch_pickle", "read_zip", "check")),
)
PACKAGES = ["libreyolo>=1.6,<2", "huggingface_hub>=0.24"]
HOUR = 3600


@dataclass(frozen=True)
class Platform:
    name: str
    sdk: str  # the module that `import` finds
    install: str  # what the user installs
    gpus: dict[str, int]  # the platform's GPU names -> most GPUs of that type in one container
    max_attempt_s: int | None  # the longest one attempt may run, where the platform caps it
    run: str  # how the user runs the file ({file})
    source: str  # where the names and limits are written


PLATFORMS = {
    # modal.com/docs/guide/gpu: "B200, H200, H100, A100, L4, T4 and L40S instances support up to 8 GPUs,
    # and A10 instances support up to 4"; the SDK passes the string through (modal/_utils/function_utils.py,
    # parse_gpu_config: "TYPE" or "TYPE:COUNT", upper-cased) and the server judges it, so orch checks here.
    # One attempt runs at most 24 h (modal.com/docs/guide/timeouts).
    "modal": Platform("modal", "modal", "pip install 'orch-gpu[modal]'", {
        "T4": 8, "L4": 8, "A10": 4, "L40S": 8, "A100": 8, "A100-40GB": 8, "A100-80GB": 8, "RTX-PRO-6000": 8,
        "H100": 8, "H100!": 8, "H200": 8, "B200": 8, "B200+": 8}, 24 * HOUR, "modal run {file}",
        "modal.com/docs/guide/gpu"),
    # beta9/type.py, GpuType (beam-client 0.2.233 re-exports beta9's): the names @function(gpu=...) takes;
    # gpu_count is a separate argument (beta9/abstractions/base/runner.py). GAUDI2 is Intel's, not CUDA:
    # LibreYOLO cannot train on it. No documented per-type count limit: 8, as on one machine.
    "beam": Platform("beam", "beam", "pip install 'orch-gpu[beam]'", {
        "T4": 8, "L4": 8, "L40": 8, "A10": 8, "A10G": 8, "A100": 8, "A100-40": 8, "A100-80": 8, "A16": 8,
        "A30": 8, "A40": 8, "H100": 8, "H200": 8, "GH200": 8, "B200": 8, "B300": 8, "A4000": 8, "A5000": 8,
        "A6000": 8}, None, "python {file}", "beta9/type.py GpuType"),
}

# orch's GPU names (orchestrator/gpus.py, canonical) -> each platform's, where it offers that type.
# The A100 and the H100 come in PCIe and SXM: the platforms name only the type (and the A100's memory).
_FROM_ORCH = {
    "modal": {"T4": "T4", "L4": "L4", "A10": "A10", "L40S": "L40S", "A100 SXM": "A100", "A100 PCIe": "A100",
              "H100 SXM": "H100", "H100 PCIe": "H100", "H200": "H200", "B200": "B200"},
    "beam": {"T4": "T4", "L4": "L4", "L40": "L40", "A10": "A10", "A40": "A40", "A100 SXM": "A100",
             "A100 PCIe": "A100", "H100 SXM": "H100", "H100 PCIe": "H100", "H200": "H200", "B200": "B200",
             "RTX A4000": "A4000", "RTX A5000": "A5000", "RTX A6000": "A6000"},
}
_A100_MEMORY = {"modal": {"40": "A100-40GB", "80": "A100-80GB"}, "beam": {"40": "A100-40", "80": "A100-80"}}


@dataclass
class ExportSpec:
    platform: str
    name: str
    data: str  # hf://ORG/REPO/FILE.tar
    gpu: str  # the platform's name
    gpus: int
    max_hours: float
    retries: int
    volume: str
    train: dict  # LibreYOLO train keys, as orch's training.train_keys makes them (data/project/name at run time)
    epochs: int
    model: str
    push_to: str | None
    hf_secret: str = "orch-hf"

    @property
    def timeout_s(self) -> int:
        """One attempt's timeout: the whole deadline, within the platform's cap."""
        cap = PLATFORMS[self.platform].max_attempt_s
        seconds = max(60, math.ceil(self.max_hours * HOUR))
        return min(seconds, cap) if cap else seconds

    @property
    def calls(self) -> int:
        """How many calls it takes to cover --max-hours when one attempt is capped."""
        return max(1, math.ceil(self.max_hours * HOUR / self.timeout_s))


def platform(name: str) -> Platform:
    if name not in PLATFORMS:
        raise UsageError(f"orch export takes {' or '.join(PLATFORMS)}, not {name!r}")
    return PLATFORMS[name]


def gpu_name(platform_name: str, wanted: str | None, count: int) -> str:
    """The platform's name for ``--gpu`` (its own spelling, or orch's for the same type), refusing a
    type it does not offer or more of it than one container holds."""
    from orchestrator import gpus

    plat = platform(platform_name)
    offered = ", ".join(plat.gpus)
    if not wanted:
        raise UsageError(f"--gpu is required: {platform_name} offers {offered}")
    own = {k.upper(): k for k in plat.gpus}
    spelled = re.sub(r"[\s_]+", "-", wanted.strip()).upper()
    name = own.get(spelled)
    if name is None:
        canonical = gpus.canonical(wanted)
        name = _FROM_ORCH[platform_name].get(canonical) or ("A100" if spelled.startswith("A100") else None)
        memory = re.search(r"(40|80)\s*GB", wanted, re.I)
        if name == "A100" and memory:
            name = _A100_MEMORY[platform_name][memory.group(1)]
    if name is None:
        raise UsageError(f"{platform_name} does not offer {wanted!r} ({plat.source}): it offers {offered}")
    if not 1 <= count <= plat.gpus[name]:
        raise UsageError(f"--gpus {count}: {platform_name} puts 1 to {plat.gpus[name]} {name} in one container")
    return name


def check_data(data: str | None) -> tuple[str, str]:
    """An hf:// dataset (ORG/REPO, FILE); a local folder cannot reach the platform's servers."""
    from orchestrator.tasks.hub import parse_hf

    if not data:
        raise UsageError("--data is required: an hf://ORG/REPO/FILE.tar dataset (`orch data push FOLDER ORG/REPO` "
                         "makes one from a folder)")
    if not data.startswith("hf://"):
        raise UsageError(f"--data {data!r} is a local path, which a serverless function cannot read: push it first "
                         "with `orch data push FOLDER ORG/REPO` and export with the hf://ORG/REPO/FILE.tar it prints")
    return parse_hf(data)


def check_max_hours(max_hours: float | None) -> float:
    if max_hours is None:
        raise UsageError("--max-hours is required: without an explicit timeout a hung serverless job bills "
                         "without bound")
    if not 0 < max_hours <= 10_000:
        raise UsageError(f"--max-hours must be above 0 and at most 10000, not {max_hours:g}")
    return max_hours


def check_volume(name: str) -> str:
    # Both platforms name volumes with letters, digits, '-' and '_' (Modal: at most 64 characters).
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}", name or ""):
        raise UsageError(f"--volume takes letters, digits, '-' and '_' (at most 63), not {name!r}")
    return name


# -- writing -------------------------------------------------------------------------------------------
def render(spec: ExportSpec, file_name: str) -> str:
    """The whole app file, as text."""
    repo, filename = check_data(spec.data)
    settings = {
        "NAME": spec.name,
        "APP": f"orch-{spec.name}",
        "DATA_REPO": repo,
        "DATA_FILE": filename,
        "EPOCHS": spec.epochs,
        "GPU": spec.gpu if spec.platform == "beam" or spec.gpus == 1 else f"{spec.gpu}:{spec.gpus}",
        "GPUS": spec.gpus,
        "CPU": 4 * spec.gpus,  # data loading workers; both platforms default to a fraction of a core
        "MEMORY_MIB": 16384 * spec.gpus,
        "MAX_HOURS": spec.max_hours,
        "TIMEOUT_S": spec.timeout_s,
        "CALLS": spec.calls,
        "RETRIES": spec.retries,
        "VOLUME": spec.volume,
        "HF_SECRET": spec.hf_secret,
        "PUSH_TO": spec.push_to[5:].strip("/") if spec.push_to else None,
        "PACKAGES": PACKAGES,
    }
    if spec.platform == "beam":
        for key in ("CALLS", "HF_SECRET"):
            settings.pop(key)
    lines = ["# -- what orch was asked for (edit here) " + "-" * 60]
    lines += [f"{k} = {v!r}" for k, v in settings.items()]
    lines.append("# LibreYOLO's train() keys, as orch's own `orch run` sets them; data, project and name come at run time")
    lines.append("TRAIN = " + pprint.pformat(spec.train, sort_dicts=False, width=100) + "\n")
    hours = f"{spec.timeout_s} s" + (f", {spec.calls} calls" if spec.calls > 1 else "")
    push_note = (f"\n    (HF_TOKEN also pushes milestones to {_doc(spec.push_to)}: it needs write access)"
                 if spec.push_to else "")
    head = Template((TEMPLATES / f"{spec.platform}.py.tmpl").read_text()).substitute(
        name=_doc(spec.name), model=_doc(spec.model), data=_doc(spec.data), epochs=spec.epochs,
        file=_doc(shlex.quote(file_name)), hf_secret=_doc(spec.hf_secret), push_note=push_note, timeout_text=hours,
        max_hours=f"{spec.max_hours:g}", volume_name=_doc(spec.volume), settings="\n".join(lines))
    return head + (TEMPLATES / "train.py.tmpl").read_text() + "\n\n" + embedded() + "\n"


def _doc(text: str) -> str:
    """``text`` as it may stand inside the module's docstring: shown as it is, and never code. Three
    double quotes in a file name would end the docstring (and what follows would run on import), a
    backslash would make an escape of it (a bad one, such as a backslash and N, a file that does not
    compile): each is escaped, and what is not printable is written as its escape."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))
    return shown.replace("\\", "\\\\").replace('"', '\\"')


def check_train(train: dict) -> dict:
    """LibreYOLO's train keys as the file writes them (``repr``): a number that is not finite
    (``--train-arg lr0=1e999``, ``nan``) would be written as a bare ``inf`` or ``nan``, a file that
    does not import. Refused (exit 2) before anything is written."""
    for key, value in train.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--train-arg {key}: {value!r} is not a finite number")
    return train


def embedded() -> str:
    """orch's on-instance functions and classes the file needs, copied from their modules by name."""
    parts = []
    for module, names in EMBEDDED:
        text = (ON_INSTANCE / module).read_text()
        found = []
        for node in ast.parse(text).body:
            named = getattr(node, "name", None) or (
                node.targets[0].id if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) else None)
            if named in names:
                found.append(ast.get_source_segment(text, node, padded=False))
        if len(found) != len(names):  # a renamed function there must not leave a file that fails at run time
            raise OrchError(f"playbooks/on_instance/{module} no longer defines all of {names}")
        parts.append(f"# {module}\n" + "\n\n\n".join(found))
    return "\n\n\n".join(parts)


def write(spec: ExportSpec, output: Path, force: bool) -> Path:
    if output.exists() and not force:
        raise UsageError(f"{output} exists: name another with -o, or add --force to replace it")
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent} is not a folder")
    check_train(spec.train)
    text = render(spec, output.name)
    compile(text, str(output), "exec")  # a template mistake is orch's bug, never a file the user gets
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, output)
    return output


# -- reading back, offline -----------------------------------------------------------------------------
def sdk_installed(platform_name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(platform(platform_name).sdk) is not None
    except (ImportError, ValueError):  # a broken install counts as none
        return False


# Runs in a child process: loads the file as a module (not __main__, so nothing runs) and prints what the
# SDK made of its `train` function. Modal: Function.info(), filled in locally when the function is
# defined (modal/_functions.py, _from_local: FunctionInfo(gpus=..., timeout=..., volumes=...)); no
# network while the function is not hydrated. Beam: the wrapper's .parent, the Function whose
# __init__ (beta9/abstractions/base/runner.py) keeps gpu, gpu_count, volumes and task_policy.
_READ_BACK = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("orch_export_check", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
if sys.argv[1] == "modal":
    info = mod.train.info()
    out = {"app": mod.app.name, "gpu": [list(g) for g in info.gpus], "timeout": info.timeout,
           "retries": info.max_retries, "volumes": {p: v.name for p, v in info.volumes.items()}}
else:
    fn = mod.train.parent
    out = {"app": fn.name, "gpu": [[str(getattr(fn.gpu, "value", fn.gpu)), fn.gpu_count]],
           "timeout": fn.task_policy.timeout, "retries": fn.task_policy.max_retries,
           "volumes": {v.mount_path: v.name for v in fn.volumes}}
print("ORCH_RESULT " + json.dumps(out))
"""


def read_back(platform_name: str, path: Path, timeout: float = 120) -> dict:
    """What the platform's SDK reads from the file, loaded offline in a child process."""
    with tempfile.TemporaryDirectory(prefix="orch-export-") as tmp:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MODAL_", "BEAM_", "BETA9_")) and k not in ("GATEWAY_HOST", "GATEWAY_PORT", "CONFIG_PATH")}
        env.update({
            # Beam: decorating needs a token (beta9/config.py, get_config_context) and opens a gRPC channel
            # to the gateway; a dummy token, a loopback gateway nobody listens on, and no saved contexts
            # (CONFIG_PATH to an empty folder), so neither the user's account nor the network is touched.
            "BEAM_TOKEN": "orch-offline-check", "BETA9_GATEWAY_HOST": "127.0.0.1", "BETA9_GATEWAY_PORT": "9",
            "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": "9", "CONFIG_PATH": str(Path(tmp) / "beam.ini"),
            # Modal contacts nothing until a run; its server is loopback here all the same.
            "MODAL_SERVER_URL": "http://127.0.0.1:9", "MODAL_CONFIG_PATH": str(Path(tmp) / "modal.toml"),
        })
        try:
            proc = subprocess.run([sys.executable, "-c", _READ_BACK, platform_name, str(Path(path).resolve())], env=env, cwd=tmp,
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise OrchError(f"{platform_name}'s SDK did not load {path} within {timeout:g} s") from None
    for line in proc.stdout.splitlines():
        if line.startswith("ORCH_RESULT "):
            return json.loads(line[len("ORCH_RESULT "):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise OrchError(f"{platform_name}'s SDK could not load {path}: {tail}")


def verify(spec: ExportSpec, path: Path) -> dict:
    """Read the file back with the SDK and compare with what was asked; a difference is orch's bug."""
    got = read_back(spec.platform, path)
    mount = "/vol" if spec.platform == "modal" else f"./{spec.volume}"
    want = {"gpu": [[spec.gpu, spec.gpus]], "timeout": spec.timeout_s, "retries": spec.retries,
            "volumes": {mount: spec.volume}}
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    if wrong:
        raise OrchError(f"{path} does not say what was asked (read back, asked): {wrong}")
    return got
