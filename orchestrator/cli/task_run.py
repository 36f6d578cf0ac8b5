"""``orch run -f task.yaml`` and ``orch run NAME -- CMD ARGS...``: a task file (or a command line)
read, checked whole and merged with the flags (a flag given wins over the file). A ``run:`` task
becomes a command job's ``Submission``; a ``train:`` task goes back to ``orch run``'s training
options. Everything is refused before anything is opened or rented: one line, exit 2.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cli.app import out
from orchestrator.errors import UsageError
from orchestrator.text import clean

# `orch up` options that make sense only for a LibreYOLO training.
TRAINING_FLAGS = {"data": "--data", "model": "--model", "epochs": "--epochs", "imgsz": "--imgsz", "batch": "--batch",
                  "save_period": "--save-period", "train_arg": "--train-arg", "push_to": "--push-to",
                  "resume": "--resume"}
RESOURCE_FLAGS = ("gpu", "gpus", "cpu", "disk", "image", "spot", "bid")
OFFERS_SHOWN = 10


@dataclass
class Training:
    """A ``train:`` task, as `orch run`'s training options (the flags given win over the file)."""

    name: str
    options: dict = field(default_factory=dict)
    max_cost: float | None = None
    max_hours: float | None = None
    retries: int = 3
    keep: bool = False
    providers: list[str] = field(default_factory=list)
    max_price: float | None = None


_CTX: list = []  # the `orch run` invocation's context, for _given


def _given(param: str) -> bool:
    """Whether the user typed this option (a flag given wins over the task file; a default does not)."""
    source = _CTX[-1].get_parameter_source(param) if _CTX else None
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT")


def resolve(ctx, name, command, file, dry_run, env, secret, workdir, provider, max_cost, max_hours, retries, keep,
            options):
    """A ``train:`` task as ``Training`` options; a command task as a ``jobs.Submission``."""
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
    if _given("nodes"):
        t.nodes = options["nodes"]
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
        where = task.where(path, lines, "nodes") if path and not _given("nodes") else "orch run"
        raise UsageError(f"{where}: nodes: {t.nodes}: a job runs on one node in this orch (multi-node groups are "
                         "not here yet); --dry-run shows a command's plan")
    if t.train is not None:
        return Training(name, _train_options(t, options), t.max_cost, t.max_hours, t.retries, t.keep, providers,
                        res.max_price)
    given = [flag for key, flag in TRAINING_FLAGS.items() if _given(key)]
    if given:
        raise UsageError(f"{', '.join(given)}: for a train: job, not a command")
    return _command(name, t, path, lines, base, providers, dry_run, options)


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


def _command(name, t, path, lines, base: Path, providers, dry_run, options):
    """The command job's submission, every part of it checked."""
    from orchestrator import config, jobs, plugins, task, workdir
    from orchestrator import policy as policies
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
    policy = policies.from_flags(idle_minutes=t.idle_minutes, max_hours=None, on_idle=t.on_idle,
                                 rebuild_cost=options.get("rebuild_cost"))
    instances.check_ssh_timeout(options.get("ssh_timeout"))
    request = instances.request_from(name, gpu=res.gpu, gpus=res.gpus, cpu=res.cpu, disk=res.disk, image=res.image,
                                     spot=res.spot, bid=res.bid, offer=options.get("offer"))
    runs = config.home() / "runs" / name
    if not dry_run and runs.is_dir() and any(runs.iterdir()):
        raise UsageError(f"{runs} already holds a job's files: name the job otherwise")
    ssh_timeout = options.get("ssh_timeout")
    js = jobs.JobSpec(kind="command", work=cmd, request=request, providers=providers or None,
                      ssh_timeout=ssh_timeout * 60 if ssh_timeout else None, policy=policy, max_price=res.max_price)
    return jobs.Submission(name, js, max_cost=t.max_cost, max_hours=t.max_hours, retries=t.retries, keep=t.keep,
                           disk_given=res.disk is not None)


def print_plan(sub, choice) -> None:
    """A dry run: what would run where, at what cost, and the offers the plan chose from."""
    js = sub.spec
    req = js.request
    nodes = max(js.nodes, getattr(js.work, "nodes", 1) or 1)  # a command's nodes: shown, launched one per job
    what = "CPU only" if req.cpu else f"{req.gpus}x {req.gpu or 'any GPU'}"
    out(f"task {sub.name}: {nodes} node(s), {what}" + (", spot" if req.spot else "")
        + (f", disk {req.disk_gb} GB" if sub.disk_given else ""))
    for line in js.kind_of().plan_lines(sub.name):
        out(line)
    caps = [f"max_cost ${sub.max_cost:g}" if sub.max_cost is not None else None,
            f"max_hours {sub.max_hours:g}" if sub.max_hours else None, f"retries {sub.retries}"]
    out(f"  caps     {', '.join(c for c in caps if c)}")
    per_node = f" x{nodes} nodes" if nodes > js.nodes else ""
    out(f"  plan     {clean(choice.line, 300)}{per_node}")
    if nodes > js.nodes:
        out(f"  nodes    each node gets ORCH_NODE_RANK, ORCH_NUM_NODES={nodes}, ORCH_NODE_IPS, ORCH_MASTER_ADDR, "
            "ORCH_GPUS_PER_NODE; launching more than one node is not in this orch yet")
    _offers(js, choice)
    out("  dry run: nothing rented, nothing recorded")


def _offers(js, choice) -> None:
    """The ranked offers the plan chose from, from its own listing (a CPU job or --offer ranks none)."""
    from orchestrator import offers

    req = js.request
    if req.cpu or req.offer or choice.answer is None:
        out(f"offers: nothing to rank ({'a CPU-only instance' if req.cpu else 'an offer given'} on {choice.provider})")
        return
    mode = "spot" if req.spot else "on-demand"
    rows = choice.answer.rows
    per = "per job" if rows and rows[0].epochs else "per hour"
    out(f"offers ({mode}, {per}), best first:")
    for i, row in enumerate(rows[:OFFERS_SHOWN], 1):
        out(f"  {i:2d}. {offers.describe(row, mode)}")
    if len(rows) > OFFERS_SHOWN:
        out(f"  ... and {len(rows) - OFFERS_SHOWN} more (`orch offers`)")
