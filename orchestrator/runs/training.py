"""A training run from the controller's side: data staged, LibreYOLO started, watched, pulled.

What runs on the instance is in ``playbooks/``; this module decides what to run, keeps the
ledger's ``runs`` row in step, and turns ``status.json`` (untrusted: the instance wrote it) into
what a user wants to see.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import config
from orchestrator.volumes import volume_mounts
from orchestrator.errors import OrchError, UsageError
from orchestrator.text import clean

DEFAULT_SEED = 0
# LibreYOLO train keys that orch sets itself, each with the flag that sets it (None: orch alone).
OWNED = {"data": "--data", "project": None, "name": None, "exist_ok": None, "resume": "--resume", "model": "--model",
         "epochs": "--epochs", "imgsz": "--imgsz", "batch": "--batch", "save_period": "--save-period",
         "device": "--gpus/--cpu", "seed": None}


@dataclass
class TrainSpec:
    data: str  # a local folder or hf://ORG/REPO/FILE.tar
    model: str = "yolo9-t"
    epochs: int = 10
    imgsz: int | None = None
    batch: int | None = None
    save_period: int | None = None
    train_args: dict[str, str] = field(default_factory=dict)
    push_to: str | None = None
    resume: bool = False
    # filled in by prepare()
    local_tar: Path | None = None
    data_bytes: int | None = None
    dataset_name: str | None = None


def default_save_period(epochs: int) -> int:
    """About ten epoch_N.pt milestones per job (every epoch for jobs of ten epochs or fewer): each is a
    whole checkpoint pulled home, so more would cost disk and transfer, fewer would leave long gaps.
    (Resuming never needs them: it uses the verified copy of last.pt.)"""
    return max(1, -(-epochs // 10))


def parse_train_args(pairs: list[str]) -> dict[str, str]:
    """``--train-arg key=value`` pairs. A value never begins with '-' (LibreYOLO's parser would read it
    as an option: ``amp=--project=/x`` moved the run folder), and no key orch owns is taken, however
    it is spelt."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,40}", key):
            raise UsageError(f"--train-arg takes key=value with a plain key, not {pair!r}")
        if value.startswith("-") and not re.fullmatch(r"-[0-9.]+(e-?[0-9]+)?", value):
            raise UsageError(f"--train-arg {key}: a value may not begin with '-' (it would be read as an option)")
        if not value or any(not c.isprintable() for c in value):
            raise UsageError(f"--train-arg {key} needs a printable value")
        canonical = key.lower()
        if canonical in OWNED:
            flag = OWNED[canonical]
            raise UsageError(f"--train-arg cannot set {key}: orch manages it" + (f" (use {flag})" if flag else ""))
        out[canonical] = value
    return out


def check_spec(spec: TrainSpec) -> None:
    if not spec.data or not spec.data.strip():
        raise UsageError("--data needs a dataset folder or hf://ORG/REPO/FILE.tar")
    if not spec.model or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}", spec.model):
        raise UsageError(f"--model takes a LibreYOLO model name such as yolo9-t, not {spec.model!r}")
    if not 1 <= spec.epochs <= 100_000:
        raise UsageError(f"--epochs must be between 1 and 100000, not {spec.epochs}")
    if spec.imgsz is not None and not 32 <= spec.imgsz <= 8192:
        raise UsageError(f"--imgsz must be between 32 and 8192, not {spec.imgsz}")
    if spec.batch is not None and (spec.batch == 0 or spec.batch < -1 or spec.batch > 65536):
        raise UsageError(f"--batch must be -1 (autobatch) or between 1 and 65536, not {spec.batch}")
    if spec.save_period is not None and not 1 <= spec.save_period <= 100_000:
        raise UsageError(f"--save-period must be between 1 and 100000, not {spec.save_period}")
    if not spec.data.startswith("hf://") and not _is_dir(spec.data):
        raise UsageError(f"dataset not found: {clean(spec.data, 200)!r} is no folder")  # before anything is opened
    if spec.push_to:
        from orchestrator.tasks.hub import check_repo_id

        if not spec.push_to.startswith("hf://"):
            raise UsageError(f"--push-to takes hf://ORG/REPO, not {spec.push_to!r}")
        check_repo_id(spec.push_to[5:].strip("/"))


def _is_dir(path: str) -> bool:
    try:
        return Path(path).expanduser().is_dir()
    except (OSError, ValueError, RuntimeError):  # a name too long, a NUL, a ~user that does not exist
        return False


def prepare(spec: TrainSpec, home: Path, say) -> TrainSpec:
    """Everything about the data that can be checked before anything is rented."""
    check_spec(spec)
    if spec.data.startswith("hf://"):
        from orchestrator.tasks.hub import dataset_size

        spec.data_bytes = dataset_size(spec.data)
        return spec
    from orchestrator.tasks import dataset

    info = dataset.validate(Path(spec.data).expanduser(), doctor=False)
    cache = home / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"pack-{os.getpid()}.tar"
    say(f"      data: packing {len(info.files)} files ({info.bytes / 1e6:.1f} MB) into one tar")
    dataset.pack(info, tmp)
    whole = dataset.sha256(tmp)
    digest = whole[:16]
    # The doctor last, on the packed bytes' digest: an unchanged dataset is not checked twice.
    try:
        dataset.doctor(info, spec.imgsz, whole, config.cache_home() / "doctor", say)
    except BaseException:
        tmp.unlink(missing_ok=True)  # refused data leaves nothing in the cache
        raise
    final = cache / f"{digest}.tar"
    os.replace(tmp, final)
    spec.local_tar, spec.data_bytes = final, final.stat().st_size
    spec.dataset_name = f"ds-{digest}"
    say(f"      data: {sum(info.n_images.values())} images, {info.nc} classes, {spec.data_bytes / 1e6:.1f} MB packed")
    return spec


def disk_for(spec: TrainSpec) -> tuple[int, str]:
    from orchestrator.tasks.dataset import suggest_disk_gb

    return suggest_disk_gb(spec.data_bytes or 0, spec.model, spec.epochs, spec.save_period)


def extract_limits(disk_gb: int, data_bytes: int | None) -> tuple[int, int]:
    """(bytes, members) a dataset tar may unpack to on an instance of ``disk_gb``: what the disk
    was sized for (half of it, and never less than twice the known data), and a member count no
    real dataset of that size needs."""
    limit = max(int(disk_gb * 1e9 / 2), 2 * (data_bytes or 0), 64 * 2**20)
    return limit, max(limit // 512, 10_000)


def _value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def train_keys(spec: TrainSpec, data_yaml: str, project: str, name: str, gpus: int, cpu: bool) -> dict[str, Any]:
    keys: dict[str, Any] = {"data": data_yaml, "model": spec.model, "epochs": spec.epochs,
                            "project": project, "name": name, "exist_ok": True}
    if spec.imgsz:
        keys["imgsz"] = spec.imgsz
    # LibreYOLO's autobatch probes VRAM with a real backward pass; on a CPU it falls back to 16.
    keys["batch"] = spec.batch if spec.batch is not None else (16 if cpu else -1)
    if spec.save_period:
        keys["save_period"] = spec.save_period
    keys["device"] = "cpu" if cpu else ",".join(str(i) for i in range(gpus))
    if cpu:
        keys["pretrained"] = False  # the CPU demo and offline runs train from scratch
    keys["seed"] = DEFAULT_SEED  # an unseeded run cannot be repeated: a result nobody can reproduce is money lost
    keys.update({k: _value(v) for k, v in spec.train_args.items()})
    if spec.resume:
        keys["model"] = f"{project}/{name}/weights/last.pt"
        keys["resume"] = True
        keys.pop("pretrained", None)
    return keys


def entry_spec(keys: dict[str, Any], name: str, gpus: int, push_to: str | None) -> dict:
    """What train_entry.py runs: the CLI for one device, the Python API for a device list or a push."""
    if gpus > 1 or push_to:
        return {"mode": "api", "name": name, "kwargs": keys, "push_to": push_to[5:].strip("/") if push_to else None}
    argv = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]
    return {"mode": "cli", "name": name, "argv": argv}


HUB_ENV = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")


def hub_env() -> dict[str, str]:
    """The hub settings, for the commands that talk to the hub and no others; they travel in a
    0600 file, never on a command line."""
    return {k: os.environ[k] for k in HUB_ENV if os.environ.get(k)}


# -- launch ------------------------------------------------------------------------------------
def launch(orch, inst, spec: TrainSpec, notes: list | None = None) -> Any:
    """Stage the data and start training on a ready instance; returns the ledger's run row.
    ``notes``: what the job's history should keep of the staging (``stage``)."""
    from orchestrator.kill_points import kill_point
    from playbooks import host, train

    run = orch.ledger.latest_run(inst.id) if spec.resume else None
    limits = extract_limits(inst.disk_gb or 20, spec.data_bytes)
    volumes = volume_mounts.env(orch, inst)  # HF_HOME and ORCH_VOLUME_* where it mounts volumes
    with orch.connect(inst) as c:
        work = host.workdir(c)
        orch.say("      staging the data")
        data_yaml = stage(orch, inst, c, spec, limits, lambda m: orch.say(f"      {m}"), notes)
        if run is None:
            run = orch.ledger.add_run(instance_id=inst.id, model=spec.model, data=spec.data,
                                      data_bytes=spec.data_bytes, epochs=spec.epochs, gpu_name=inst.gpu_name,
                                      state="starting")
        name = f"r{run.id}"
        project = f"{work}/runs"
        if spec.resume:
            _ensure_checkpoint(orch, inst, c, f"{project}/{name}", spec.epochs)
        keys = train_keys(spec, data_yaml, project, name, inst.gpus or 1, inst.cpu_only)
        entry = entry_spec(keys, name, inst.gpus or 1, spec.push_to)
        if spec.push_to:
            train.ensure_hub_client(c)
        kill_point("before-train")
        pid = train.start(c, entry, {**volumes, **(hub_env() if spec.push_to else {})})
    public = {k: v for k, v in keys.items() if k != "data"}
    run = orch.ledger.update_run(run.id, run_dir=f"{project}/{name}", pid=pid, state="running",
                                 args=json.dumps(public, sort_keys=True), ended_at=None)
    orch.ledger.note(inst.id, f"training {'resumed' if spec.resume else 'started'}: {spec.model}, "
                              f"{spec.epochs} epochs, pid {pid}", orch.actor)
    orch.say(f"      training {spec.model} for {spec.epochs} epochs, pid {pid}, run {run.run_dir}")
    return run


def stage(orch, inst, c, spec: TrainSpec, limits: tuple[int, int], log, notes: list | None = None) -> str:
    """The dataset on the instance behind ``c``; returns its data.yaml there. Where the instance
    mounts a volume, a packed dataset is staged on the first one once and reused by every later
    job while every file is what orch's record says it staged (``staged_data``); a dataset staged
    again there says why in ``notes`` too (for the job's history). The hub's cache (``HF_HOME``)
    is there too (``volume_mounts``)."""
    import time

    from orchestrator.tasks import dataset
    from orchestrator.runs import staged_data

    from playbooks import train

    if spec.data.startswith("hf://"):
        from orchestrator.tasks.hub import parse_hf

        train.ensure_hub_client(c)
        repo_id, filename = parse_hf(spec.data)
        return train.stage_hf(c, repo_id, filename, {**volume_mounts.env(orch, inst), **hub_env()}, limits)
    t0 = time.monotonic()
    with volume_mounts.staging(orch, inst) as where:
        if where is None:
            data_yaml = train.stage_tar(c, spec.local_tar, spec.dataset_name, log=log, limits=limits)
            orch.ledger.note(inst.id, f"dataset {spec.dataset_name} staged on the instance in "
                                      f"{time.monotonic() - t0:.2f} s", orch.actor)
            return data_yaml
        data_dir, volume_id = where
        data_yaml, said = staged_data.stage(orch, c, volume_id, spec, data_dir, dataset.sha256(spec.local_tar),
                                            log, limits)
    log(f"data: {said}, {time.monotonic() - t0:.2f} s")
    orch.ledger.note(inst.id, f"dataset {spec.dataset_name} {said} in {time.monotonic() - t0:.2f} s", orch.actor)
    if notes is not None and said.startswith("staged again"):
        notes.append(f"data {said}")
    return data_yaml


def _ensure_checkpoint(orch, inst, c, run_dir: str, epochs: int) -> None:
    """A resume starts from last.pt: the instance's own, else the copy pulled home. One that
    already reached ``epochs`` is refused here, with the epoch it reached."""
    from playbooks import host

    info = host.script(c, "checkpoint.py", f"{run_dir}/weights/last.pt")
    if not info.get("exists"):
        from orchestrator.runs.runs import pulled_dir

        local = pulled_dir(orch, inst.name) / "weights" / "last.pt"
        if not local.exists():
            raise OrchError(f"nothing to resume: no last.pt on the instance nor in {local.parent}")
        from orchestrator.runs import checkpoint_vet
        from orchestrator.ssh import remote

        _, unsafe = checkpoint_vet.vet(local)  # checked here before it goes anywhere
        if unsafe:
            raise OrchError(f"not resuming: {unsafe}")
        remote.run(c, f"mkdir -p {_q(run_dir + '/weights')}")
        c.sftp().put(str(local), f"{run_dir}/weights/last.pt")
        info = host.script(c, "checkpoint.py", f"{run_dir}/weights/last.pt")
    if not info.get("loads"):
        raise OrchError(f"last.pt of {inst.name} does not load ({clean(info.get('error'), 200)}): it was cut "
                        "short while being written; not resuming from it")
    reached = info.get("epoch")
    if isinstance(reached, int) and reached >= epochs:
        raise UsageError(f"the checkpoint already reached epoch {reached} of {epochs}: resume with --epochs above "
                         f"{reached}")


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)
