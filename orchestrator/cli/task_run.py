"""``orch run -f task.yaml`` and ``orch run NAME -- CMD ARGS...``: a task file (or a command line)
read, checked whole, merged with the flags (a flag given wins over the file), then planned and
started as a job of the command kind, or handed back to ``orch run``'s training path for a
``train:`` task. Everything is refused before anything is opened or rented: one line, exit 2.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.cli.app import open_orch, out, say
from orchestrator.errors import UsageError
from orchestrator.text import clean

# `orch up` options that make sense only for a LibreYOLO training.
TRAINING_FLAGS = {"data": "--data", "model": "--model", "epochs": "--epochs", "imgsz": "--imgsz", "batch": "--batch",
                  "save_period": "--save-period", "train_arg": "--train-arg", "push_to": "--push-to",
                  "resume": "--resume"}
RESOURCE_FLAGS = ("gpu", "gpus", "cpu", "disk", "image", "spot", "bid")
OFFERS_SHOWN = 10


@dataclass
class Resolved:
    """What `orch run` goes on with: a training (its options, as `orch up` takes them), a command
    job started here (``job``), or nothing (a dry run printed)."""

    name: str | None = None
    options: dict = field(default_factory=dict)
    max_cost: float | None = None
    max_hours: float | None = None
    retries: int = 3
    keep: bool = False
    providers: list[str] = field(default_factory=list)
    max_price: float | None = None
    job: Any = None


_CTX: list = []  # the `orch run` invocation's context, for _given


def _given(param: str) -> bool:
    """Whether the user typed this option (a flag given wins over the task file; a default does not)."""
    source = _CTX[-1].get_parameter_source(param) if _CTX else None
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT")


def resolve(ctx, name, command, file, dry_run, env, secret, workdir, provider, max_cost, max_hours, retries, keep,
            wait, as_json, options):
    """A train: task comes back as options for `orch run`'s training path; a command task is
    planned and started (or, with --dry-run, printed) here."""
    from orchestrator import task

    _CTX.append(ctx)
    if file is not None:
        t, lines = task.load(file)
        path, base = Path(file), Path(file).resolve().parent
    else:
        t, lines, path, base = task.Task(), None, None, Path.cwd()
    if command:
        if t.run is not None or t.train is not None:
            raise UsageError(f"{path}: has its own run:/train:; give the command there or after --, not both")
        t.run = shlex.join(command)
    res = t.resources
    for key in RESOURCE_FLAGS:
        if _given(key):
            setattr(res, key, options[key])
    if _given("gpu") and not _given("cpu"):  # a GPU asked for on the command line wins over the file's cpu: true
        res.cpu = False
    if _given("cpu") and options["cpu"] and not _given("gpu"):
        res.gpu = None
    if _given("provider"):
        res.provider = list(dict.fromkeys(provider or []))
    for key, value in (("max_cost", max_cost), ("max_hours", max_hours), ("retries", retries), ("keep", keep)):
        if _given(key):
            setattr(t, key, value)
    for key in ("idle_minutes", "on_idle"):
        if _given(key):
            setattr(t, key, options[key])
    if env:
        t.env.update(task.env_pairs(env))
    if secret:
        t.secrets = list(dict.fromkeys(t.secrets + list(secret)))
    if workdir is not None:
        t.workdir, base = workdir, Path.cwd()
    if t.run is None and t.train is None:
        raise UsageError(f"{task.where(path, lines) if path else 'orch run'}: nothing to run: give run: (a command) "
                         "or train: (a LibreYOLO training)")
    task.check(t, path, lines)
    name = name or t.name
    if not name:
        raise UsageError(f"{task.where(path, lines) if path else 'orch run'}: the job needs a name: name: in the "
                         "file, or NAME on the command line")
    from orchestrator import jobs

    try:
        jobs.check_job_name(name)
    except UsageError as e:
        raise UsageError(f"{task.where(path, lines, 'name') if path and t.name == name else 'orch run'}: {e}") from None
    providers = [res.provider] if isinstance(res.provider, str) else list(res.provider or [])
    if t.nodes > 1 and (not dry_run or t.train is not None):
        raise UsageError(f"{task.where(path, lines, 'nodes')}: nodes: {t.nodes}: a job runs on one node in this "
                         "orch (multi-node groups are not here yet); --dry-run shows a command's plan")
    if t.train is not None:
        return Resolved(name, _train_options(t, options), t.max_cost, t.max_hours, t.retries, t.keep, providers,
                        res.max_price)
    given = [flag for key, flag in TRAINING_FLAGS.items() if _given(key)]
    if given:
        raise UsageError(f"{', '.join(given)}: for a train: job, not a command")
    return Resolved(job=_start(name, t, path, lines, base, providers, dry_run, wait, options))


def _train_options(t, options: dict) -> dict:
    """The train: section and the resources as `orch up` options, where no flag was given."""
    tr, res = t.train, t.resources
    fill = {"data": tr.data, "model": tr.model, "epochs": tr.epochs, "imgsz": tr.imgsz, "batch": tr.batch,
            "save_period": tr.save_period, "push_to": tr.push_to, "resume": tr.resume,
            "train_arg": [f"{k}={_scalar(v)}" for k, v in tr.args.items()],
            "gpu": res.gpu, "gpus": res.gpus, "cpu": res.cpu, "disk": res.disk, "image": res.image, "spot": res.spot,
            "bid": res.bid, "idle_minutes": t.idle_minutes, "on_idle": t.on_idle}
    merged = dict(options)
    for key, value in fill.items():
        if not _given(key):
            merged[key] = value
    return merged


def _scalar(v) -> str:
    from orchestrator.task import scalar

    return scalar(v)


def _start(name, t, path, lines, base: Path, providers, dry_run, wait, options):
    """The command job planned, recorded and started (followed with --wait); None for a dry run."""
    import sys

    from orchestrator import config, job_views, jobs, plugins, task, workdir
    from orchestrator.cli import instances

    res = t.resources
    for p in providers:
        plugins.provider_class(p)
    folder = None
    if t.workdir is not None:
        folder = (base / Path(t.workdir).expanduser()).resolve()
        workdir.measure(folder, t.workdir_max_mb, task.where(path, lines, "workdir"))
    cmd = task.CommandSpec(run=t.run, setup=t.setup, env={k: task.scalar(v) for k, v in t.env.items()},
                           secrets=list(t.secrets), workdir=str(folder) if folder else None,
                           outputs=[task.under_workdir(o, "output", "") for o in t.outputs],
                           checkpoint=task.under_workdir(t.checkpoint, "checkpoint", "") if t.checkpoint else None,
                           checkpoint_minutes=t.checkpoint_minutes, nodes=t.nodes, workdir_max_mb=t.workdir_max_mb)
    policy, _, request = instances.check_up_options(
        name, provider=None, gpu=res.gpu, gpus=res.gpus, cpu=res.cpu, disk=res.disk, image=res.image, spot=res.spot,
        bid=res.bid, offer=options.get("offer"), ssh_timeout=options.get("ssh_timeout"), data=None, model="yolo9-t",
        epochs=10, imgsz=None, batch=None, save_period=None, train_arg=None, push_to=None, resume=False,
        idle_minutes=t.idle_minutes, max_hours=None, on_idle=t.on_idle, rebuild_cost=options.get("rebuild_cost"))
    runs = config.home() / "runs" / name
    if not dry_run and runs.is_dir() and any(runs.iterdir()):
        raise UsageError(f"{runs} already holds a job's files: name the job otherwise")
    orch = open_orch()
    if not dry_run:
        taken = orch.ledger.job(name)
        if taken is not None and taken.state in jobs.ACTIVE:
            raise UsageError(f"a job named {name!r} is already {taken.state} (`orch jobs show {name}`)")
    ssh_timeout = options.get("ssh_timeout")
    js = jobs.JobSpec(train=None, request=request, providers=providers or None,
                      ssh_timeout=ssh_timeout * 60 if ssh_timeout else None, policy=policy, command=cmd,
                      max_price=res.max_price)
    t0 = time.monotonic()
    choice = jobs.plan(orch, js)
    jobs.check_plan(choice, t.max_cost)
    if dry_run:
        _print_plan(name, t, cmd, choice)
        print_offers(orch, js, choice)
        return None
    from orchestrator import command_job

    command_job.prepare(cmd, orch.home, say)
    say(f"plan: {choice.line}")
    job = jobs.create(orch, name, js, choice, t.max_cost, t.max_hours, t.retries, t.keep, time.monotonic() - t0)
    try:
        job = jobs.start(orch, job)
        if wait and job.state in jobs.ACTIVE:
            job = job_views.follow(orch, job)
    except KeyboardInterrupt:
        say(f"\norch: the job goes on: `orch jobs show {name}` follows it, `orch jobs cancel {name}` stops it")
        sys.exit(130)
    return job


def _print_plan(name, t, cmd, choice) -> None:
    res = t.resources
    what = "CPU only" if res.cpu else f"{res.gpus}x {res.gpu or 'any GPU'}"
    out(f"task {name}: {t.nodes} node(s), {what}" + (", spot" if res.spot else "")
        + (f", disk {res.disk} GB" if res.disk else ""))
    for key, script in (("setup", cmd.setup), ("run", cmd.run)):
        for i, line in enumerate((script or "").strip().splitlines()[:20]):
            out(f"  {key if i == 0 else '':8} {clean(line, 200)}")
    if cmd.workdir:
        from orchestrator import workdir

        total, count = workdir.measure(Path(cmd.workdir), cmd.workdir_max_mb, "workdir")
        out(f"  workdir  {cmd.workdir}: {count} file(s), {total / 1e6:.2f} MB (cap {cmd.workdir_max_mb:g} MB)")
    if cmd.env:
        out(f"  env      {', '.join(sorted(cmd.env))}")
    if cmd.secrets:
        out(f"  secrets  {', '.join(cmd.secrets)} (read from this environment at launch, never stored)")
    if cmd.outputs:
        out(f"  outputs  {', '.join(cmd.outputs)} -> $ORCH_HOME/runs/{name}/")
    if cmd.checkpoint:
        out(f"  checkpoint {cmd.checkpoint}: copied home every {cmd.checkpoint_minutes:g} min, restored before a "
            "relaunch ($ORCH_CHECKPOINT_DIR)")
    caps = [f"max_cost ${t.max_cost:g}" if t.max_cost is not None else None,
            f"max_hours {t.max_hours:g}" if t.max_hours else None, f"retries {t.retries}"]
    out(f"  caps     {', '.join(c for c in caps if c)}")
    per_node = f" x{t.nodes} nodes" if t.nodes > 1 else ""
    out(f"  plan     {clean(choice.line, 300)}{per_node}")
    if t.nodes > 1:
        out(f"  nodes    each node gets ORCH_NODE_RANK, ORCH_NUM_NODES={t.nodes}, ORCH_NODE_IPS, ORCH_MASTER_ADDR, "
            "ORCH_GPUS_PER_NODE; launching more than one node is not in this orch yet")
    out("  dry run: nothing rented, nothing recorded")


def print_offers(orch, js, choice) -> None:
    """The ranked offers the plan chose from (GPU jobs; a CPU job or --offer has nothing to rank)."""
    from orchestrator import offers

    req = js.request
    if req.cpu or req.offer:
        out(f"offers: nothing to rank ({'a CPU-only instance' if req.cpu else 'an offer given'} on {choice.provider})")
        return
    mode = "spot" if req.spot else "on-demand"
    job = None
    if js.train is not None:
        spec = js.train
        job = offers.Job(model=spec.model, epochs=spec.epochs, data=spec.data, data_bytes=spec.data_bytes,
                         images=js.images, imgsz=spec.imgsz)
    answer = offers.search(orch, offers.Query(gpu=req.gpu, gpus=req.gpus, mode=mode, disk_gb=req.disk_gb,
                                              providers=js.providers, max_price=js.max_price), job, fresh=False)
    out(f"offers ({mode}, {'per job' if job else 'per hour'}), best first:")
    for i, row in enumerate(answer.rows[:OFFERS_SHOWN], 1):
        out(f"  {i:2d}. {offers.describe(row, mode)}")
    if len(answer.rows) > OFFERS_SHOWN:
        out(f"  ... and {len(answer.rows) - OFFERS_SHOWN} more (`orch offers`)")


def show_command(d: dict) -> None:
    """`orch jobs show`'s lines for a command job."""
    lines = [line for line in (d.get("command") or "").splitlines() if line.strip()]
    out(f"  command  {clean(lines[0] if lines else '', 200)}"
        + (f" (+{len(lines) - 1} line(s))" if len(lines) > 1 else ""))
    state = d.get("run_state") or "-"
    if d.get("exit_code") is not None:
        state += f", exit code {d['exit_code']}" + (f" in {d['exit_phase']}" if d.get("exit_phase") else "")
    if d.get("elapsed_s") is not None:
        state += f", {_duration(d['elapsed_s'])} elapsed"
    out(f"  run      {state}")
    if d.get("outputs"):
        out(f"  outputs  {', '.join(d['outputs'])}")
    if d.get("checkpoint"):
        copy = d.get("checkpoint_epoch")
        out(f"  checkpoint {d['checkpoint']}"
            + (f": copy {copy} at home" if copy and d["state"] != "completed" else ""))


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


