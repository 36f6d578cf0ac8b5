"""``orch offers`` (live prices everywhere, cost per job) and ``orch trial`` (measure before renting big).

Exit codes of ``orch offers``: 0 every asked provider answered; 3 the answer is partial (a
provider failed or has no key: one error line each on stderr, the others' offers are shown);
1 no provider answered; 2 bad input.

``orch trial`` and what it calls the bottleneck: while the trial trains, a sampler on the
instance records GPU utilisation and memory (nvidia-smi, once a second) and how busy all CPU
cores are (/proc/stat). Samples from before LibreYOLO's training start are dropped (loading and
autobatch leave the GPU idle), then:

- no GPU on the instance: **host (CPU-only)**;
- the GPU busy (median utilisation >= 80 %): **GPU**, a faster GPU shortens the epoch;
- the GPU waiting while every core is busy (median >= 85 %): **host**, decoding and augmenting
  images is the limit, more vCPUs help and more loader workers do not;
- the GPU waiting while cores are idle: **data loader**, raise ``workers=``, cache the images,
  or put the data on a faster disk.

Images per second (training images / warm epoch time) is shown beside it, with what the
throughput table expects of that GPU, as a second opinion.

``--steps N`` trains two epochs on a copy of the first N x batch training images with validation
off (LibreYOLO's CLI has no step limit) and scales the second, warm, epoch to the whole training
split: it leaves validation time out, so it reads a little low.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from statistics import mean, median
from typing import List, Optional

import typer

from orchestrator.cli.app import app, emit_json, instance_named, open_orch, say
from orchestrator.errors import OrchError, UsageError
from orchestrator.text import clean

PARTIAL = 3
GPU_BUSY = 80.0  # % median utilisation
HOST_BUSY = 0.85  # fraction of all CPU cores


@app.command()
def offers(
    gpu: Optional[str] = typer.Option(None, help="GPU type in any spelling ('RTX 4090', '4090'); a family ('A100') matches its variants."),
    gpus: int = typer.Option(1, help="GPUs per machine."),
    min_vram: Optional[float] = typer.Option(None, help="Least VRAM per GPU, GB."),
    spot: bool = typer.Option(False, "--spot", help="Spot / interruptible prices only."),
    on_demand: bool = typer.Option(False, "--on-demand", help="On-demand prices only."),
    both: bool = typer.Option(False, "--both", help="Both (the default); ranks by the cheaper of the two."),
    disk: Optional[int] = typer.Option(None, help="Disk in GB, priced into every row (default: from --data, else 20)."),
    max_price: Optional[float] = typer.Option(None, help="Most $/hr for the whole machine, disk included."),
    provider: Optional[List[str]] = typer.Option(None, "--provider", "-p", help="Ask only these providers (repeatable)."),
    sort: Optional[str] = typer.Option(None, help="hourly or job (default: job when --epochs is given)."),
    epochs: Optional[int] = typer.Option(None, help="Estimate hours and $ for a training of this many epochs."),
    model: str = typer.Option("yolo9-t", help="LibreYOLO model of the job."),
    data: Optional[str] = typer.Option(None, help="The job's dataset: a local folder or hf://ORG/REPO/FILE.tar."),
    dataset_gb: Optional[float] = typer.Option(None, help="The job's dataset size in GB, when --data is not at hand."),
    imgsz: Optional[int] = typer.Option(None, help="The job's training image size (as `orch up --imgsz`)."),
    fresh: bool = typer.Option(False, "--fresh", help="Ask every provider now, not the cache."),
    nodes: int = typer.Option(1, "--nodes", help="Price a group of N machines of each offer (`orch up --nodes N`)."),
    scaling: Optional[float] = typer.Option(None, "--scaling", help="With --nodes: the share of one machine each "
                                            "added node adds (default: node_scaling in config.toml, else 0.8)."),
    as_json: bool = typer.Option(False, "--json", help="Rows, errors and sources as JSON."),
):
    """Live on-demand and spot offers from every configured provider, ranked by $/hr or by $ per job.

    Exit code 3: a partial answer (a provider failed or has no key; one error line each).
    """
    from orchestrator import gpus as gpu_table
    from orchestrator.money import offers as o

    mode = _mode(spot, on_demand, both)
    if not 1 <= gpus <= 16:
        raise UsageError(f"--gpus must be between 1 and 16, not {gpus}")
    for flag, value, top in (("--min-vram", min_vram, 10_000), ("--max-price", max_price, 10_000),
                             ("--dataset-gb", dataset_gb, 1e6)):
        if value is not None and not 0 < value <= top:
            raise UsageError(f"{flag} must be above 0 and at most {top:g}, not {value:g}")
    if imgsz is not None and not 32 <= imgsz <= 8192:
        raise UsageError(f"--imgsz must be between 32 and 8192, not {imgsz}")
    from orchestrator import config
    from orchestrator.instances import groups

    groups.check_nodes(nodes)
    if scaling is not None and nodes == 1:
        raise UsageError("--scaling is the speedup of a group: add --nodes N")
    efficiency = o.check_scaling(scaling if scaling is not None else config.get("node_scaling", o.NODE_EFFICIENCY))
    job = None
    if epochs is not None:
        job = o.workload_for(model, epochs, data=data, dataset_gb=dataset_gb, imgsz=imgsz)
    elif data or dataset_gb:
        raise UsageError("--data/--dataset-gb price a job: add --epochs N")
    if disk is None:
        disk = 20
        if job and job.data_bytes:
            from orchestrator.tasks.dataset import suggest_disk_gb

            disk, why = suggest_disk_gb(job.data_bytes, model, epochs, None)
            say(f"disk: {why}")
    if not 1 <= disk <= 20_000:
        raise UsageError(f"--disk must be between 1 and 20000 GB, not {disk}")
    query = o.Query(gpu=gpu, gpus=gpus, min_vram=min_vram, mode=mode, disk_gb=disk, max_price=max_price, nodes=nodes,
                    providers=provider or None, sort=sort)
    o.check_query(query, job)
    orch = open_orch(lazy=True)  # the ledger opens only for a job's measured epoch times
    answer = o.search(orch, query, job, fresh=fresh)
    if nodes > 1:
        # The same factor on every row: the ranking stands. Providers that cannot rent a group are no answer.
        unable = [n for n in answer.asked if not _can_group(orch, n)]
        if unable:
            say(f"left out: {', '.join(unable)} (cannot rent a group of machines)")
        answer = replace(answer, rows=[r for r in o.for_nodes(answer.rows, nodes, efficiency)
                                       if r.offer.provider not in unable],
                         asked=[n for n in answer.asked if n not in unable])
    for name, error in answer.errors:
        print(f"orch: {name}: {error}", file=sys.stderr)
    for name, why in answer.skipped:
        say(f"skipped {name}: {why}")
    if gpu:  # the GPU asked for, where a provider has it in stock nowhere right now
        for name, what, why in dict.fromkeys(answer.out_of_stock):
            say(f"{name}: {what} {why}")
    if answer.cached:
        ages = ", ".join(f"{n} {age:.0f} s old" for n, age in sorted(answer.cached.items()))
        say(f"cached answers: {ages} (--fresh asks again)")
    if as_json:
        emit_json({"query": {"gpu": gpu, "gpus": gpus, "min_vram": min_vram, "mode": mode, "disk_gb": disk,
                              "max_price": max_price, "providers": answer.asked, "epochs": epochs, "model": model,
                              "data": data, "dataset_gb": dataset_gb, "nodes": nodes,
                              "node_scaling": efficiency if nodes > 1 else None},
                    "offers": [r.to_dict() for r in answer.rows],
                    "errors": [{"provider": n, "error": e} for n, e in answer.errors],
                    "skipped": [{"provider": n, "why": w} for n, w in answer.skipped],
                    "out_of_stock": [{"provider": n, "gpu": g, "why": w} for n, g, w in answer.out_of_stock],
                    "partial": answer.partial,
                    "throughput_source": gpu_table.THROUGHPUT_SOURCE if answer.used_table else None})
    else:
        if nodes > 1:
            print(f"a group of {nodes} machines of each offer: every $ below is the group's; hours assume each "
                  f"added node adds {efficiency:.0%} of one machine (--scaling sets it)")
        _table(answer, mode, disk, job is not None)
        if answer.used_table:
            print(f"throughput table: {gpu_table.THROUGHPUT_SOURCE}")
    if answer.partial:
        if not answer.asked:
            raise OrchError("no provider answered")
        sys.exit(PARTIAL)
    if not answer.asked:  # nothing failed, yet nobody could be asked: no keys (each skipped one is named above)
        raise OrchError("no provider could be asked for offers: add a provider's key (see `orch check`)")


def _can_group(orch, name: str) -> bool:
    """Whether the provider can rent a group (a feature it has): the others' offers are no answer to --nodes."""
    from orchestrator.provider import RentsGroups

    return isinstance(orch.provider(name), RentsGroups)


def _mode(spot: bool, on_demand: bool, both: bool) -> str:
    if spot + on_demand + both > 1:
        raise UsageError("--spot, --on-demand and --both exclude each other")
    return "spot" if spot else "on-demand" if on_demand else "both"


def _money(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(answer, mode: str, disk: int, with_job: bool) -> None:
    if not answer.rows:
        print("no offer matches" + (f" (asked: {', '.join(answer.asked)})" if answer.asked else " (no provider asked)"))
        return
    head = ["PROVIDER", "GPU", "VRAM", "$/HR", "SPOT $/HR", "DISK $/GB-MO", "STOPPED $/HR", "RELIAB", "WHERE", "OFFER"]
    if with_job:
        head += ["EPOCH", "HOURS"] + (["JOB $"] if mode != "spot" else []) + (["JOB $ SPOT"] if mode != "on-demand" else [])
        head += ["SOURCE"]
    lines = []
    for r in answer.rows:
        o = r.offer
        where = clean(o.location, 40) or (f"stock {clean(o.stock, 20)}" if o.stock else "-")
        cells = [o.provider, f"{clean(r.gpu, 40)} x{o.gpus}", f"{r.vram_gb:g} GB", _money(r.price_hr), _money(r.spot_hr),
                 _money(o.disk_gb_month, 3), _money(r.stopped_hr), "-" if o.reliability is None else f"{o.reliability:.3f}",
                 where, clean(o.offer_id, 60)]
        if with_job:
            e = r.estimate
            cells += ["-" if e is None else f"{e.epoch_seconds:.1f} s", _money(r.hours, 2)]
            cells += [_money(r.job_usd(False), 2)] if mode != "spot" else []
            cells += [_money(r.job_usd(True), 2)] if mode != "on-demand" else []
            cells += ["-" if e is None else e.source]
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines)]
    print(f"prices: the whole machine per hour with its {disk} GB disk running; stopped: the disk alone")
    for cells in [head, *lines]:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    if with_job:
        notes = dict.fromkeys(f"  {r.gpu} x{r.offer.gpus}: {r.estimate.source}: {r.estimate.detail}"
                              for r in answer.rows if r.estimate)
        print("\n".join(notes))
        print("sources, most trusted first: ledger (runs of this job), trial (`orch trial`), scaled (a measurement "
              "on another GPU through the table), prior (an assumed base figure through the table)")


# -- trial ---------------------------------------------------------------------------------------
@app.command()
def trial(
    name: str = typer.Argument(..., help="A ready instance to measure on."),
    data: str = typer.Option(..., help="The dataset to train on: a local folder or hf://ORG/REPO/FILE.tar."),
    model: str = typer.Option("yolo9-t", help="LibreYOLO model."),
    epochs: Optional[int] = typer.Option(None, help="1 or 2 epochs (default 2: the first carries the warm-up)."),
    steps: Optional[int] = typer.Option(None, help="Only N training steps (of --batch images), scaled to an epoch."),
    imgsz: Optional[int] = typer.Option(None, help="Training image size."),
    batch: Optional[int] = typer.Option(None, help="Batch size (default: as `orch up`)."),
    train_arg: Optional[List[str]] = typer.Option(None, "--train-arg", help="Extra LibreYOLO train key=value."),
    as_json: bool = typer.Option(False, "--json", help="The measurement as JSON."),
):
    """A short training on an instance: time per epoch, peak VRAM, and what bounds it (GPU, data loader, host)."""
    from orchestrator.runs import runs, training

    if epochs is not None and steps is not None:
        raise UsageError("--epochs and --steps exclude each other")
    if epochs not in (None, 1, 2):
        raise UsageError(f"a trial is 1 or 2 epochs, not {epochs}: train with `orch up --data ... --epochs N`")
    if steps is not None and not 2 <= steps <= 10_000:
        raise UsageError(f"--steps must be between 2 and 10000, not {steps}")
    extra = training.parse_train_args(train_arg or [])
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    training.check_spec(training.TrainSpec(data=data, model=model, epochs=epochs or 2, imgsz=imgsz, batch=batch))
    orch = open_orch()
    inst = instance_named(orch, name)
    if inst.state != "ready":
        raise UsageError(f"{name} is {inst.state}: a trial needs a ready instance")
    subset = None
    if steps is not None:
        if batch is None and not inst.cpu_only:
            raise UsageError("--steps needs --batch on a GPU instance (autobatch decides it only once training starts)")
        subset = _subset(data, steps * (batch or 16), orch.home)  # 16: orch's CPU batch
        extra["val"] = "false"
    spec = training.TrainSpec(data=str(subset.path) if subset else data, model=model, epochs=epochs or 2,
                              imgsz=imgsz, batch=batch, train_args=extra)
    _refuse_if_training(orch, inst)
    training.prepare(spec, orch.home, say)
    run = training.launch(orch, inst, spec)
    if subset:  # the measurement is of the user's dataset, which is what later estimates look up
        run = orch.ledger.update_run(run.id, data=data, data_bytes=subset.data_bytes)
    samples_path = _start_sampler(orch, inst, run)
    view = runs.follow(orch, inst, run)
    if view["state"] != "completed":
        raise OrchError(f"the trial ended {view['state']}: see `orch logs {name}`"
                        + (f" ({view['error']})" if view.get("error") else ""))
    result = _measure(orch, inst, run, spec, samples_path, subset)
    args = json.loads(run.args or "{}")
    from orchestrator.money.offers import TRIAL_KEY

    args[TRIAL_KEY] = result
    orch.ledger.update_run(run.id, mean_epoch_seconds=result["epoch_seconds"], peak_vram_gb=result["peak_vram_gb"],
                           args=json.dumps(args, sort_keys=True))
    if as_json:
        emit_json({"instance": name, "run": run.id, "model": model, "data": data, "gpu": inst.gpu_name,
                    "gpus": 0 if inst.cpu_only else inst.gpus, **result})
        return
    _report(name, inst, run, model, result)


def _refuse_if_training(orch, inst) -> None:
    from orchestrator.runs import runs

    latest = orch.ledger.latest_run(inst.id)
    if latest is None or latest.state not in ("starting", "running", "stalled") or not latest.run_dir:
        return
    if runs.read(orch, inst, latest)["state"] in ("starting", "running", "stalled"):
        raise UsageError(f"{inst.name} is training (run r{latest.id}): a trial beside it would time both")


def _start_sampler(orch, inst, run) -> str:
    """Start the sampler (on_instance/sampler.py) beside the training; returns where it writes."""
    from playbooks import host

    with orch.connect(inst) as c:
        # Not in the run's folder: LibreYOLO creates that only once its setup is done.
        work = host.workdir(c)
        out = f"{work}/trials/r{run.id}-samples.jsonl"
        host.detach(c, [host.python(c), host.upload(c, "sampler.py"), str(int(run.pid)), out],
                    f"{work}/sampler.log")
    return out


def _jsonl(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut short when the run ended mid-write
    return rows


def _measure(orch, inst, run, spec, samples_path: str, subset) -> dict:
    from orchestrator.ssh import remote

    q = shlex.quote
    with orch.connect(inst) as c:
        def cat(path: str) -> str:
            return remote.run(c, f"cat {q(path)} 2>/dev/null", check=False)

        samples = _jsonl(cat(samples_path))
        epochs = [r for r in _jsonl(cat(f"{run.run_dir}/metrics.jsonl")) if r.get("time")]
        status = json.loads(cat(f"{run.run_dir}/status.json") or "{}")
    started = _epoch_time(status.get("started_at"))
    samples = [s for s in samples if started is None or s.get("t", 0) >= started]
    if not epochs:
        raise OrchError("the trial finished without timing an epoch (no metrics.jsonl on the instance)")
    warm = epochs[1:] or epochs
    timed = mean(float(r["time"]) for r in warm)
    how = (f"epoch {', '.join(str(r['epoch']) for r in warm)} (epoch 1, with the warm-up, took "
           f"{float(epochs[0]['time']):.1f} s)" if len(epochs) > 1 else "epoch 1 (includes the warm-up)")
    if subset:
        images = subset.total
        epoch_seconds = timed * subset.total / subset.count
        how = f"{how} over {subset.count} of the {subset.total} training images, scaled to all"
        img_s = subset.count / timed
    else:
        images = _train_images(spec)
        epoch_seconds = timed
        img_s = images / timed if images else None
    gpu_util = [mean(s["gpu"]) for s in samples if s.get("gpu")]
    cpu_busy = [float(s["cpu"]) for s in samples if "cpu" in s]
    mem = [max(s["mem_mib"]) for s in samples if s.get("mem_mib")]
    peak = round(max(mem) / 1024, 2) if mem and not inst.cpu_only else None
    bound, why = bottleneck(inst.cpu_only, gpu_util, cpu_busy)
    from orchestrator import gpus as table
    from orchestrator.money.offers import prior_seconds_per_image

    rel = None if inst.cpu_only else table.relative(inst.gpu_name)
    expected = rel / prior_seconds_per_image(spec.model, spec.imgsz) if rel else None
    return {"epoch_seconds": round(epoch_seconds, 3), "timed": how,
            "images_per_second": round(img_s, 1) if img_s else None, "train_images": images,
            "prior_images_per_second": round(expected, 1) if expected else None,
            "peak_vram_gb": peak, "bound": bound, "why": why,
            "gpu_util_median": round(median(gpu_util), 1) if gpu_util else None,
            "cpu_busy_median": round(median(cpu_busy), 3) if cpu_busy else None,
            "samples": len(samples), "mode": "steps" if subset else "epochs"}


def bottleneck(cpu_only: bool, gpu_util: list[float], cpu_busy: list[float]) -> tuple[str, str]:
    """(GPU | data loader | host | host (CPU-only) | unknown, why) from the trial's samples."""
    if cpu_only:
        return "host (CPU-only)", "no GPU: the CPU does all the work, any GPU offer is faster"
    if not gpu_util:
        return "unknown", "no GPU utilisation samples (no nvidia-smi on the instance, or the run was too short)"
    g = median(gpu_util)
    c = median(cpu_busy) if cpu_busy else None
    seen = f"median GPU utilisation {g:.0f} %"
    if g >= GPU_BUSY:
        return "GPU", f"the GPU is busy ({seen}): a faster GPU shortens the epoch"
    if c is not None and c >= HOST_BUSY:
        return "host", (f"the GPU waits ({seen}) while every CPU core is busy ({c * 100:.0f} %): decoding and "
                        "augmenting images is the limit; more vCPUs help, more loader workers do not")
    cores = f" ({c * 100:.0f} % busy)" if c is not None else ""
    return "data loader", (f"the GPU waits ({seen}) while the CPU has idle cores{cores}: raise workers=, "
                           "cache the images, or use a faster disk")


def _epoch_time(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _train_images(spec) -> int | None:
    if spec.data.startswith("hf://"):
        return None
    from orchestrator.tasks import dataset

    return dataset.validate(Path(spec.data).expanduser(), doctor=False).n_images.get("train")


@dataclass
class _Subset:
    path: Path
    count: int  # training images in the copy
    total: int  # training images in the dataset
    data_bytes: int  # the whole dataset's


def _subset(data: str, count: int, home: Path) -> _Subset:
    """A copy of the dataset's first ``count`` training images and one validation image."""
    import hashlib
    import shutil

    import yaml

    from orchestrator.tasks import dataset

    if "://" in data:
        raise UsageError("--steps copies part of the dataset here: it needs a local folder, not a URI")
    info = dataset.validate(Path(data).expanduser(), doctor=False)
    train = sorted({img for e in info.splits["train"] for img in dataset._images("train", e, set())})
    val = sorted({img for e in info.splits["val"] for img in dataset._images("val", e, set())})[:1]
    picked = train[:count]
    key = hashlib.sha256(f"{info.yaml_path.resolve()}:{count}".encode()).hexdigest()[:16]
    dest = home / "cache" / f"trial-{key}" / info.name
    shutil.rmtree(dest.parent, ignore_errors=True)
    for split, images in (("train", picked), ("val", val)):
        for i, img in enumerate(images):
            target = dest / "images" / split / f"{i:06d}{img.suffix.lower()}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(img, target)
            label = dataset.label_path(img)
            if label.is_file():
                (dest / "labels" / split).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(label, dest / "labels" / split / f"{i:06d}.txt")
    (dest / "data.yaml").write_text(yaml.safe_dump({"train": "images/train", "val": "images/val", "nc": info.nc,
                                                   "names": list(info.names)}, sort_keys=False))
    return _Subset(path=dest, count=len(picked), total=len(train), data_bytes=info.bytes)


def _report(name: str, inst, run, model: str, r: dict) -> None:
    device = "CPU" if inst.cpu_only else f"{inst.gpu_name or inst.gpu or 'GPU'} x{inst.gpus}"
    print(f"trial r{run.id} on {name} ({device}): {model}, {r['mode']}")
    print(f"  epoch       {r['epoch_seconds']:.1f} s  from {r['timed']}")
    if r["images_per_second"]:
        prior = f"  (the table's prior for this GPU: {r['prior_images_per_second']:.0f})" if r["prior_images_per_second"] else ""
        print(f"  throughput  {r['images_per_second']:.1f} images/s ({r['train_images']} training images){prior}")
    print(f"  peak VRAM   {'none (CPU-only)' if inst.cpu_only else _gb(r['peak_vram_gb'])}")
    print(f"  bound by    {r['bound']}: {r['why']}")
    uses = ("CPU runs do not feed GPU estimates" if inst.cpu_only else
            f"`orch offers --epochs N --model {model} --data ...` now uses it for {device}")
    print(f"  recorded    in the ledger (run r{run.id}, marked trial): {uses}")


def _gb(x: float | None) -> str:
    return "unknown (no nvidia-smi samples)" if x is None else f"{x:.2f} GB"
