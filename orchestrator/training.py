"""A training run from the controller's side: data staged, LibreYOLO started, watched, pulled.

What runs on the instance is in ``playbooks/train.py``; this module decides what to run, keeps
the ledger's ``runs`` row in step, and turns ``status.json`` into what a user wants to see.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError, UsageError

DEFAULT_SEED = 0
# status.json is rewritten every epoch; a live process whose file has not moved for this long is
# shown as stalled (an epoch can be long, so this only informs, it never kills).
STALL_SECONDS = 30 * 60


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


def parse_train_args(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not key.replace("_", "").isalnum():
            raise UsageError(f"--train-arg takes key=value, not {pair!r}")
        out[key.strip()] = value.strip()
    reserved = {"data", "project", "name", "exist_ok", "resume"} & set(out)
    if reserved:
        raise UsageError(f"--train-arg cannot set {', '.join(sorted(reserved))}: orch manages them")
    return out


def check_spec(spec: TrainSpec) -> None:
    if not 1 <= spec.epochs <= 100_000:
        raise UsageError(f"--epochs must be between 1 and 100000, not {spec.epochs}")
    if spec.imgsz is not None and not 32 <= spec.imgsz <= 8192:
        raise UsageError(f"--imgsz must be between 32 and 8192, not {spec.imgsz}")
    if spec.batch is not None and (spec.batch == 0 or spec.batch < -1):
        raise UsageError(f"--batch must be -1 (autobatch) or a positive number, not {spec.batch}")
    if spec.save_period is not None and spec.save_period < 1:
        raise UsageError(f"--save-period must be at least 1, not {spec.save_period}")
    if spec.push_to:
        from orchestrator.hub import _check_repo_id

        if not spec.push_to.startswith("hf://"):
            raise UsageError(f"--push-to takes hf://ORG/REPO, not {spec.push_to!r}")
        _check_repo_id(spec.push_to[5:].strip("/"))


def prepare(spec: TrainSpec, home: Path, say) -> TrainSpec:
    """Everything about the data that can be checked before anything is rented."""
    check_spec(spec)
    if spec.data.startswith("hf://"):
        from orchestrator.hub import parse_hf

        parse_hf(spec.data)
        return spec
    from orchestrator import dataset

    info = dataset.validate(Path(spec.data).expanduser(), imgsz=spec.imgsz)
    cache = home / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"pack-{os.getpid()}.tar"
    dataset.pack(info, tmp)
    digest = _sha256(tmp)[:16]
    final = cache / f"{digest}.tar"
    os.replace(tmp, final)
    spec.local_tar, spec.data_bytes = final, final.stat().st_size
    spec.dataset_name = f"ds-{digest}"
    say(f"      data: {sum(info.n_images.values())} images, {info.nc} classes, {spec.data_bytes / 1e6:.1f} MB packed")
    return spec


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def disk_for(spec: TrainSpec) -> tuple[int, str]:
    from orchestrator.dataset import suggest_disk_gb

    return suggest_disk_gb(spec.data_bytes or 0, spec.model, spec.epochs, spec.save_period)


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
    keys["seed"] = DEFAULT_SEED  # an unseeded run cannot be repeated: the seed lists it as money lost
    keys.update({k: _value(v) for k, v in spec.train_args.items()})
    if spec.resume:
        keys["model"] = f"{project}/{name}/weights/last.pt"
        keys["resume"] = True
        keys.pop("pretrained", None)
    return keys


def entry_spec(keys: dict[str, Any], name: str, gpus: int, push_to: str | None) -> dict:
    """What train_entry.py runs: the CLI for one device, the Python API for a device list or a push."""
    if gpus > 1 or push_to:
        return {"mode": "api", "name": name, "kwargs": keys, "push": bool(push_to)}
    argv = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]
    return {"mode": "cli", "name": name, "argv": argv}


HUB_ENV = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")


def secrets_env() -> dict[str, str]:
    """The hub settings the instance needs; they travel in a 0600 file, never on a command line."""
    return {k: os.environ[k] for k in HUB_ENV if os.environ.get(k)}


# -- launch ------------------------------------------------------------------------------------
def launch(orch, inst, spec: TrainSpec) -> Any:
    """Stage the data and start training on a ready instance; returns the ledger's run row."""
    from playbooks import train

    run = orch.ledger.latest_run(inst.id) if spec.resume else None
    with orch.connect(inst) as c:
        work = train.workdir(c)
        orch.say("      staging the data")
        if spec.data.startswith("hf://"):
            from orchestrator.hub import parse_hf

            train.ensure_hub_client(c)
            repo_id, filename = parse_hf(spec.data)
            data_yaml = train.stage_hf(c, repo_id, filename, secrets_env())
        else:
            data_yaml = train.stage_tar(c, spec.local_tar, spec.dataset_name, log=lambda m: orch.say(f"      {m}"))
        if run is None:
            run = orch.ledger.add_run(instance_id=inst.id, model=spec.model, data=spec.data,
                                      data_bytes=spec.data_bytes, epochs=spec.epochs, gpu_name=inst.gpu_name,
                                      state="starting")
        name = f"r{run.id}"
        project = f"{work}/runs"
        if spec.resume:
            _ensure_checkpoint(orch, inst, c, f"{project}/{name}")
        keys = train_keys(spec, data_yaml, project, name, inst.gpus or 1, inst.cpu_only)
        from orchestrator.lifecycle import kill_point

        entry = entry_spec(keys, name, inst.gpus or 1, spec.push_to)
        if spec.push_to:
            train.ensure_hub_client(c)
            from orchestrator.hub import upload_callback_source

            entry["push"] = train.put_module(c, "orch_push.py", upload_callback_source(spec.push_to[5:].strip("/")))
        kill_point("before-train")
        pid = train.start(c, entry, secrets_env())
    public = {k: v for k, v in keys.items() if k != "data"}
    run = orch.ledger.update_run(run.id, run_dir=f"{project}/{name}", pid=pid, state="running",
                                 args=json.dumps(public, sort_keys=True), ended_at=None)
    orch.ledger.note(inst.id, f"training {'resumed' if spec.resume else 'started'}: {spec.model}, "
                              f"{spec.epochs} epochs, pid {pid}", orch.actor)
    orch.say(f"      training {spec.model} for {spec.epochs} epochs, pid {pid}, run {run.run_dir}")
    return run


def _ensure_checkpoint(orch, inst, c, run_dir: str) -> None:
    """A resume on a new instance starts from the last.pt pulled home."""
    from orchestrator import remote

    present = remote.run(c, f"test -f {run_dir}/weights/last.pt && echo yes", check=False).strip()
    if present == "yes":
        return
    local = pulled_dir(orch, inst.name) / "weights" / "last.pt"
    if not local.exists():
        raise OrchError(f"nothing to resume: no last.pt on the instance nor in {local.parent}")
    remote.run(c, f"mkdir -p {run_dir}/weights")
    c.sftp().put(str(local), f"{run_dir}/weights/last.pt")


# -- watch -------------------------------------------------------------------------------------
def pulled_dir(orch, name: str, dest: Path | None = None) -> Path:
    return Path(dest) if dest else orch.home / "runs" / name


def read(orch, inst, run) -> dict:
    """The run as the user wants to see it, from status.json and the process; updates the ledger."""
    from playbooks import train

    with orch.connect(inst) as c:
        raw = train.status(c, run.run_dir, run.pid)
    return digest(orch, run, raw)


def digest(orch, run, raw: dict) -> dict:
    st = raw.get("status") or {}
    state = st.get("state")
    if state == "running" or state is None:
        if not raw["alive"]:
            state = "crashed"  # killed: status.json still says "running" forever
        elif state is None:
            state = "starting"
        elif raw.get("moved_s") and raw["moved_s"] > STALL_SECONDS:
            state = "stalled"
    view = {
        # A finished (possibly resumed) run reports epochs done in its last session, from start_epoch.
        "state": state, "epoch": st.get("current_epoch") or (
            (st.get("start_epoch") or 1) - 1 + st["completed_epochs"] if st.get("completed_epochs") else None),
        "epochs": st.get("total_epochs") or run.epochs, "completed_epochs": st.get("completed_epochs"),
        "eta_seconds": st.get("eta_seconds"), "loss": st.get("train_loss"),
        "best_metric": st.get("best_metric"), "best_metric_name": st.get("best_metric_name"),
        "mean_epoch_seconds": st.get("mean_epoch_seconds"), "pid": st.get("pid") or run.pid,
        "run_dir": run.run_dir, "updated_at": st.get("updated_at"), "error": st.get("error"),
        "files": raw.get("files", []),
    }
    if state == "completed" and st.get("total_seconds") and st.get("completed_epochs"):
        view["mean_epoch_seconds"] = view["mean_epoch_seconds"] or st["total_seconds"] / st["completed_epochs"]
    fields = {"state": state, "completed_epochs": st.get("completed_epochs"), "best_metric": st.get("best_metric"),
              "mean_epoch_seconds": view["mean_epoch_seconds"]}
    if run.args and "orch_trial" in run.args:
        fields.pop("mean_epoch_seconds")  # a trial keeps its warm epoch time, not the mean with warm-up
    if state in ("completed", "failed", "crashed") and run.ended_at is None:
        # The run's own last word on when it ended, so idle waste is counted from then, not from
        # whenever orch first looked.
        ended = _parse_time(st.get("updated_at")) if state != "crashed" else None
        fields["ended_at"] = ended or datetime.now(timezone.utc)
    orch.ledger.update_run(run.id, **{k: v for k, v in fields.items() if v is not None})
    return view


def _parse_time(value) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def milestones(view: dict) -> list:
    """Files that must not be lost: best.pt and every epoch_N.pt, plus the small run files."""
    keep = ("weights/best.pt", "status.json", "metrics.jsonl", "train.log", "results.csv", "summary.json")
    return [f for f in view["files"] if f[0] in keep or f[0].startswith("weights/epoch_")]


def pull(orch, inst, run, dest: Path | None = None, view: dict | None = None, only_milestones: bool = False):
    """Bring the run home; returns (files pulled now, where)."""
    from playbooks import train

    target = pulled_dir(orch, inst.name, dest)
    target.mkdir(parents=True, exist_ok=True)
    with orch.connect(inst) as c:
        if view is None:
            view = digest(orch, run, train.status(c, run.run_dir, run.pid))
        files = milestones(view) if only_milestones else view["files"]
        got = train.pull(c, run.run_dir, files, target, log=lambda m: None)
    if got or not only_milestones:
        orch.ledger.update_run(run.id, pulled_at=datetime.now(timezone.utc))
    return got, target


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
        if view["state"] in ("completed", "failed", "crashed"):
            return view
        time.sleep(interval)
