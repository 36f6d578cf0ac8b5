"""A training run from the controller's side: data staged, LibreYOLO started, watched, pulled.

What runs on the instance is in ``playbooks/``; this module decides what to run, keeps the
ledger's ``runs`` row in step, and turns ``status.json`` (untrusted: the instance wrote it) into
what a user wants to see.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator import claims, config, volume_mounts
from orchestrator.errors import OrchError, UsageError
from orchestrator.text import clean

DEFAULT_SEED = 0
# status.json is rewritten every epoch; a live process whose file has not moved for this long is
# shown as stalled (an epoch can be long, so this only informs, it never kills).
STALL_SECONDS = 30 * 60
# LibreYOLO train keys that orch sets itself, each with the flag that sets it (None: orch alone).
OWNED = {"data": "--data", "project": None, "name": None, "exist_ok": None, "resume": "--resume", "model": "--model",
         "epochs": "--epochs", "imgsz": "--imgsz", "batch": "--batch", "save_period": "--save-period",
         "device": "--gpus/--cpu", "seed": None}
ENDED = ("completed", "failed", "crashed")


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
        from orchestrator.hub import check_repo_id

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
        from orchestrator.hub import dataset_size

        spec.data_bytes = dataset_size(spec.data)
        return spec
    from orchestrator import dataset

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
    from orchestrator.dataset import suggest_disk_gb

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

    from orchestrator import dataset, staged_data

    from playbooks import train

    if spec.data.startswith("hf://"):
        from orchestrator.hub import parse_hf

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
        local = pulled_dir(orch, inst.name) / "weights" / "last.pt"
        if not local.exists():
            raise OrchError(f"nothing to resume: no last.pt on the instance nor in {local.parent}")
        from orchestrator import checkpoint_vet, remote

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


# -- watch -------------------------------------------------------------------------------------
def pulled_dir(orch, name: str, dest: Path | None = None) -> Path:
    return Path(dest) if dest else orch.home / "runs" / name


def read(orch, inst, run) -> dict:
    """The run as the user wants to see it, from status.json and the process; updates the ledger."""
    from playbooks import train

    with orch.connect(inst) as c:
        raw = train.status(c, run.run_dir, run.pid)
    return digest(orch, run, raw)


def _num(v, kind=(int, float)):
    return v if isinstance(v, kind) and not isinstance(v, bool) else None


def digest(orch, run, raw: dict) -> dict:
    """What run_status.py answered, checked field by field: a field of the wrong type is dropped
    and reported in ``problems``, never a crash (which would then block ``orch down``)."""
    problems = []
    st = raw.get("status") if isinstance(raw, dict) else None
    if st is not None and not isinstance(st, dict):
        problems.append("status.json is not an object")
        st = None
    st = st or {}

    def field_(key, kind):
        v = st.get(key)
        if v is None:
            return None
        ok = _num(v, kind) if kind in ((int, float), int) else (v if isinstance(v, kind) else None)
        if ok is None:
            problems.append(f"status.json {key} has the wrong type")
        return ok

    state = field_("state", str)
    if state not in (None, "running", "completed", "failed"):
        problems.append(f"status.json state {clean(state, 20)!r} is not one LibreYOLO writes")
        state = None
    alive = bool(raw.get("alive")) if isinstance(raw, dict) else False
    moved = _num(raw.get("moved_s")) if isinstance(raw, dict) else None
    if state == "running" or state is None:
        if not alive:
            state = "crashed"  # killed: status.json still says "running" forever
        elif state is None:
            state = "starting"
        elif moved and moved > STALL_SECONDS:
            state = "stalled"
    current, completed, start = field_("current_epoch", int), field_("completed_epochs", int), field_("start_epoch", int)
    error = st.get("error")
    if isinstance(error, dict):
        error = ": ".join(clean(error.get(k), 300) for k in ("type", "message") if error.get(k))
    elif error is not None:
        error = clean(error, 300)
    from playbooks.pull import run_files

    files, refused = run_files(raw.get("files") if isinstance(raw, dict) else None)
    view = {
        # A finished (possibly resumed) run reports epochs done in its last session, from start_epoch.
        "state": state, "epoch": current or ((start or 1) - 1 + completed if completed else None),
        "epochs": field_("total_epochs", int) or run.epochs, "completed_epochs": completed,
        "eta_seconds": field_("eta_seconds", (int, float)), "loss": field_("train_loss", (int, float)),
        "best_metric": field_("best_metric", (int, float)), "best_metric_name": clean(st.get("best_metric_name"), 40),
        "mean_epoch_seconds": field_("mean_epoch_seconds", (int, float)),
        "pid": field_("pid", int) or run.pid, "run_dir": run.run_dir,
        "updated_at": clean(st.get("updated_at"), 40), "error": error or None,
        "files": files, "problems": problems + refused, "notice": notice_of(raw),
        "preempted": st.get("preempted") is True,
    }
    total = field_("total_seconds", (int, float))
    if state == "completed" and total and completed:
        view["mean_epoch_seconds"] = view["mean_epoch_seconds"] or total / completed
    fields = {"state": state, "completed_epochs": completed, "best_metric": view["best_metric"],
              "mean_epoch_seconds": view["mean_epoch_seconds"]}
    if run.args and "orch_trial" in run.args:
        fields.pop("mean_epoch_seconds")  # a trial keeps its warm epoch time, not the mean with warm-up
    if state in ENDED and run.ended_at is None:
        # The run's own last word on when it ended, so idle waste is counted from then, not from
        # whenever orch first looked (and never from a time in the future).
        ended = parse_time(view["updated_at"]) if state != "crashed" else None
        now = datetime.now(timezone.utc)
        fields["ended_at"] = min(ended, now) if ended else now
    orch.ledger.update_run(run.id, **{k: v for k, v in fields.items() if v is not None})
    return view


def notice_of(raw) -> dict | None:
    """The spot notice the instance's watchdog wrote (``preempt.json``), its fields checked and made
    printable (the instance is untrusted); None without one."""
    got = raw.get("notice") if isinstance(raw, dict) else None
    if not isinstance(got, dict) or got.get("kind") not in ("instance-action", "rebalance"):
        return None
    return {"kind": got["kind"], "action": clean(got.get("action"), 20), "time": clean(got.get("time"), 40)}


def parse_time(value) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


PULL_WAIT_S = 120.0  # how long a full pull waits for another process's (a milestone pull's) claim


def pull(orch, inst, run, dest: Path | None = None, view: dict | None = None, only_milestones: bool = False):
    """Bring the run home under the instance's claim (one writer per file); returns (files pulled
    now, where). A milestone pull that finds another orch process working on the instance skips it;
    a full pull waits for it a while."""
    # A group's run is its head's (rank 0 alone writes it): home under the group's name.
    target = pulled_dir(orch, inst.group_name if (inst.group_size or 1) > 1 else inst.name, dest)
    if only_milestones:
        with claims.try_hold(orch.ledger, inst.name) as mine:
            if not mine:
                return [], target
            return _pull(orch, inst, run, target, view, True)
    with claims.hold(orch.ledger, inst.name, wait=PULL_WAIT_S):
        return _pull(orch, inst, run, target, view, False)


def run_secrets(run) -> list[str]:
    """The names of the secrets the run's command got (its args say, from its launch); a training none."""
    try:
        args = json.loads(run.args or "{}") if run is not None else {}
    except (ValueError, TypeError, RecursionError):
        return []
    names = args.get("secrets") if isinstance(args, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _pull(orch, inst, run, target: Path, view: dict | None, only_milestones: bool):
    from orchestrator.task import held_secrets
    from playbooks import pull as pulling
    from playbooks import train

    # What the run printed may show a secret its command got: hidden in every text file that comes
    # home, and where this process does not hold one (a scheduled reaper), no text file comes.
    hide, missing = held_secrets(run_secrets(run))
    with orch.connect(inst) as c:
        if view is None:
            view = digest(orch, run, train.status(c, run.run_dir, run.pid))
        files = [f for f in view["files"] if not only_milestones or pulling.MILESTONE.fullmatch(f.rel)]
        left = []
        if missing and any(not f.rel.endswith(".pt") for f in files):
            left.append(f"left on the instance: {', '.join(f.rel for f in files if not f.rel.endswith('.pt'))} "
                        f"(this orch process does not hold {', '.join(missing)} to hide it)")
            files = [f for f in files if f.rel.endswith(".pt")]
        got = pulling.pull(c, run.run_dir, files, target, strict=not only_milestones, bounds=run_bounds(run),
                           log=lambda m: left.append(m) if m.startswith("left on the instance") else None, hide=hide)
    for line in left if not only_milestones else []:  # what the bounds left: said, and on the instance's record
        orch.say(f"      {line}")
        orch.ledger.note(inst.id, line[:500], orch.actor)
    if got or not only_milestones:
        orch.ledger.update_run(run.id, pulled_at=datetime.now(timezone.utc))
    return got, target


def run_bounds(run):
    """What ``run`` could have written (its epochs, its save period) and the pull caps."""
    from playbooks import pull as pulling

    try:
        period = json.loads(run.args or "{}").get("save_period")
    except (ValueError, AttributeError, RecursionError):
        period = None
    return pulling.Bounds.of_run(run.epochs, period)


def progress_line(view: dict) -> str:
    parts = [view["state"]]
    if view.get("epoch"):
        parts.append(f"epoch {view['epoch']}/{view['epochs']}")
    if view.get("loss") is not None:
        parts.append(f"loss {view['loss']:.4f}")
    if view.get("best_metric") is not None:
        parts.append(f"best {view.get('best_metric_name') or 'metric'} {view['best_metric']:.4f}")
    if view.get("eta_seconds") and view["state"] == "running":
        parts.append(f"ETA {_duration(view['eta_seconds'])}")
    return "  ".join(parts)


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def follow(orch, inst, run, interval: float = 3.0, out=None) -> dict:
    """--wait: a live progress line until the run ends, pulling milestones as they appear."""
    import sys

    out = out or sys.stderr
    last = ""
    while True:
        view = read(orch, inst, run)
        pull(orch, inst, run, view=view, only_milestones=True)
        line = progress_line(view)
        if line != last:
            print(f"      {line}", file=out, flush=True)
            last = line
        if view["state"] in ENDED:
            return view
        time.sleep(interval)
