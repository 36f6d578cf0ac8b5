"""``orch run -f task.yaml`` and ``orch run NAME -- CMD ARGS...``: a task file (or a command line)
read, checked whole and merged with the flags (a flag given wins over the file). A ``run:`` task
becomes a command job's ``Submission``; a ``train:`` task goes back to ``orch run``'s training
options. Everything is refused before anything is opened or rented: one line, exit 2.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cli.app import out, say
from orchestrator.errors import UsageError
from orchestrator.text import clean

# `orch up` options that make sense only for a LibreYOLO training.
TRAINING_FLAGS = {"data": "--data", "model": "--model", "epochs": "--epochs", "imgsz": "--imgsz", "batch": "--batch",
                  "save_period": "--save-period", "train_arg": "--train-arg", "push_to": "--push-to",
                  "resume": "--resume"}
COMMAND_FLAGS = ("allow_secret", "workdir_max_mb")  # a command's, given to `resolve` beside `orch up`'s options
RESOURCE_FLAGS = ("gpu", "gpus", "cpu", "disk", "image", "spot", "bid")
OFFERS_SHOWN = 10


def workdir_max_mb_option():
    """``--workdir-max-mb``, as `orch run`, `orch exec` and `orch schedule add` take it."""
    import typer

    return typer.Option(None, "--workdir-max-mb", help="The cap on what the workdir sends, in MB (default 200; a task "
                                                       "file may lower it, not raise it).")


def allow_secret_option():
    """``--allow-secret``, as `orch run`, `orch exec` and `orch schedule add` take it."""
    import typer

    return typer.Option(None, "--allow-secret", help="NAME of one of orch's own credentials (a provider's key, "
                                                     "HF_TOKEN) handed to the command as a secret, on purpose "
                                                     "(repeatable).")


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
        from orchestrator import groups

        groups.check_nodes(options["nodes"])
        t.nodes = options["nodes"]
    base = merge_flags(t, env, secret, workdir, base, path, lines, options.get("allow_secret") or [],
                       options.get("workdir_max_mb"))
    if t.run is None and t.train is None:
        raise UsageError(f"{task.where(path, lines) if path else 'orch run'}: nothing to run: give run: (a command) "
                         "or train: (a LibreYOLO training)")
    task.check(t, path, lines, _dry_run_environ(t, dry_run))
    _say_translation(path, lines)
    _warn_gpu_counts(t, path, lines)
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
    if t.train is not None:
        for key in ("min_vram", "max_vram"):
            if getattr(res, key) is not None:
                raise UsageError(f"{task.where(path, lines, 'resources', key)}: resources.{key} is for a command "
                                 "(run:); a train: job names its gpu")
        up = {k: v for k, v in options.items() if k not in COMMAND_FLAGS}
        return Training(name, _train_options(t, up), t.max_cost, t.max_hours, t.retries, t.keep, providers,
                        res.max_price)
    given = [flag for key, flag in TRAINING_FLAGS.items() if _given(key)]
    if given:
        raise UsageError(f"{', '.join(given)}: for a train: job, not a command")
    return _command(name, t, path, lines, base, providers, dry_run, options)


def merge_flags(t, env, secret, workdir, base: Path, path=None, lines=None, allow=(), max_mb=None) -> Path:
    """``--env``, ``--secret``, ``--allow-secret``, ``--workdir`` and ``--workdir-max-mb`` over a task
    (``orch run``, ``orch exec``, ``orch schedule add``): the flags add to the file's env and
    secrets, and a workdir given is read from here; returns the folder the task's relative paths
    are read from. What a file may not say alone is refused here, with its line: a secret that is
    one of orch's own credentials (``credentials``) without ``--allow-secret NAME``, and a
    ``workdir_max_mb`` above the default without ``--workdir-max-mb``."""
    from orchestrator import credentials, task

    if env:
        t.env.update(task.env_pairs(env))
    from_file = list(t.secrets)
    if secret or allow:
        t.secrets = list(dict.fromkeys(t.secrets + list(secret or []) + list(allow or [])))
    for i, name in enumerate(t.secrets):
        at = task.where(path, lines, "secrets", i) if path is not None and i < len(from_file) else \
            ("--secret" if name in (secret or []) else "orch run")
        credentials.refuse(name, allow, at)
    if max_mb is not None:
        if not 0 < max_mb <= 100_000:
            raise UsageError(f"--workdir-max-mb is a size in MB above 0 and at most 100000, not {max_mb:g}")
        t.workdir_max_mb = max_mb
    elif t.workdir_max_mb > task.DEFAULT_WORKDIR_MB:
        raise UsageError(f"{task.where(path, lines, 'workdir_max_mb')}: workdir_max_mb: {t.workdir_max_mb:g} is above "
                         f"orch's cap of {task.DEFAULT_WORKDIR_MB:g} MB: a task file may lower the cap, not raise it; "
                         f"raise it on the command line (--workdir-max-mb {t.workdir_max_mb:g})")
    if workdir is not None:
        t.workdir, base = workdir, Path.cwd()
        t._workdir_given = True  # read from here, wherever it is (``command_spec``)
    return base


def _train_options(t, options: dict) -> dict:
    """The train: section and the resources as `orch up` options, where no flag was given."""
    from orchestrator.task import volume_flags

    tr, res = t.train, t.resources
    fill = {"data": tr.data, "model": tr.model, "epochs": tr.epochs, "imgsz": tr.imgsz, "batch": tr.batch,
            "save_period": tr.save_period, "push_to": tr.push_to, "resume": tr.resume,
            "train_arg": [f"{k}={_scalar(v)}" for k, v in tr.args.items()],
            "gpu": res.gpu, "gpus": res.gpus, "cpu": res.cpu, "disk": res.disk, "image": res.image, "spot": res.spot,
            "bid": res.bid, "idle_minutes": t.idle_minutes, "on_idle": t.on_idle, "nodes": t.nodes,
            "volume": volume_flags(t)}
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
    from orchestrator import config, jobs, plugins, task
    from orchestrator import policy as policies
    from orchestrator.cli import instances

    res = t.resources
    for p in providers:
        plugins.provider_class(p)
    instances.refuse_spot_on(providers, res.spot)
    cmd = command_spec(t, path, lines, base)
    policy = policies.from_flags(idle_minutes=t.idle_minutes, max_hours=None, on_idle=t.on_idle,
                                 rebuild_cost=options.get("rebuild_cost"))
    instances.check_ssh_timeout(options.get("ssh_timeout"))
    request = instances.request_from(name, gpu=res.gpu, gpus=res.gpus, cpu=res.cpu, disk=res.disk, image=res.image,
                                     spot=res.spot, bid=res.bid, offer=options.get("offer"))
    if t.nodes > 1:  # a group: every provider it may rent on can (checked before anything is made)
        providers = instances.group_providers(name, t.nodes, providers, request)
    if request.cpu or request.offer:  # nothing to rank: the provider that rents says now what it cannot (--cpu --spot)
        instances.renter(providers[0] if providers else plugins.default_provider()).validate(request)
    from orchestrator.jobs.record import refuse_taken

    refuse_taken(config.home(), name, dry_run, options.get("replace", False), say)
    ssh_timeout = options.get("ssh_timeout")
    from orchestrator import volume_mounts

    volumes = volume_mounts.for_flags(options.get("volume") if _given("volume") else task.volume_flags(t), t.nodes,
                                      providers)
    js = jobs.JobSpec(kind="command", work=cmd, request=request, providers=providers or None,
                      ssh_timeout=ssh_timeout * 60 if ssh_timeout else None, policy=policy, max_price=res.max_price,
                      nodes=t.nodes, volumes=volumes, min_vram=res.min_vram, max_vram=res.max_vram)
    return jobs.Submission(name, js, max_cost=t.max_cost, max_hours=t.max_hours, retries=t.retries, keep=t.keep,
                           disk_given=res.disk is not None, replace=options.get("replace", False),
                           allowed_secrets=frozenset(options.get("allow_secret") or []))


def command_spec(t, path, lines, base: Path):
    """The command a task runs (``task.CommandSpec``), its workdir found and measured: what `orch run`
    submits and `orch exec` starts on a machine of yours."""
    from orchestrator import task, workdir

    folder = None
    if t.workdir is not None:  # ~nouser, a NUL, a task file's folder elsewhere (not --workdir): refused
        within = path is not None and not t._workdir_given
        at = "--workdir" if t._workdir_given else task.where(path, lines, "workdir")
        folder = workdir.folder(base, t.workdir, at, within=within)
        workdir.measure(folder, t.workdir_max_mb, at)
    return task.CommandSpec(run=t.run, setup=t.setup, env={k: task.scalar(v) for k, v in t.env.items()},
                            secrets=list(t.secrets), workdir=str(folder) if folder else None,
                            outputs=[task.under_workdir(o, "output", "") for o in t.outputs],
                            checkpoint=task.under_workdir(t.checkpoint, "checkpoint", "") if t.checkpoint else None,
                            checkpoint_minutes=t.checkpoint_minutes, nodes=t.nodes, workdir_max_mb=t.workdir_max_mb,
                            keep_checkpoints=t.keep_checkpoints, preempt_signal=t.preempt_signal)


def _say_translation(path, lines) -> None:
    """What orch translated of a SkyPilot or dstack task file, said once the file is accepted."""
    from orchestrator import peer_tasks

    for line in peer_tasks.said(path, lines):
        say(line)


def _warn_gpu_counts(t, path, lines) -> None:
    """A group on CPU machines whose command counts processes by GPUs (``DSTACK_GPUS_NUM``, ...): each
    is 0 there, and a launcher given 0 starts nothing, or falls back to a world of one on every node,
    trains apart and reports success. Said before anything is rented."""
    from orchestrator import nodes, task

    read = nodes.gpu_counts_read(t.setup, t.run)
    if t.nodes > 1 and t.resources.cpu and read:
        where = task.where(path, lines, "run") if path else "orch run"
        say(f"orch: warning: {where}: {', '.join(read)} {'is' if len(read) == 1 else 'are'} 0 on CPU machines: a "
            f"launcher started with that many processes per node starts none, or falls back to one world per node "
            f"(the {t.nodes} nodes train apart); count processes with $ORCH_PROCS_PER_NODE (the GPUs, 1 on a CPU "
            "machine)")


def _dry_run_environ(t, dry_run: bool):
    """The environment ``task.check`` reads the secrets from: a dry run warns of each secret not set
    now (the launch refuses it then) and plans on; a launch reads this one."""
    import os

    if not dry_run:
        return None
    missing = [s for s in t.secrets if isinstance(s, str) and not os.environ.get(s)]
    for name in missing:
        say(f"orch: warning: secret {name} is not set in this environment: export it before the launch, which "
            "refuses without it (its value is read at launch, never stored)")
    return {**os.environ, **{name: "-" for name in missing}}


def print_plan(sub, choice) -> None:
    """A dry run: what would run where, at what cost, and the offers the plan chose from."""
    js = sub.spec
    nodes = js.nodes
    _head(sub)
    out(f"  plan     {clean(choice.line, 300)}")
    if nodes > 1:
        out(f"  nodes    {nodes}, rented together (all or nothing) on {choice.provider}; each gets ORCH_NODE_RANK, "
            f"ORCH_NUM_NODES={nodes}, ORCH_NODE_IPS, ORCH_MASTER_ADDR, ORCH_MASTER_PORT, ORCH_GPUS_PER_NODE; "
            "a lost node is replaced alone")
        dropped = _cannot_group(js.providers)
        if dropped:
            out(f"  nodes    not asked, as they rent no group: {', '.join(dropped)}")
    _volumes(js)
    _offers(js, choice)
    out("  dry run: nothing rented, nothing recorded")


def _cannot_group(asked) -> list[str]:
    """The providers a group job left out where none was named (``instances.group_providers`` asks
    every one that rents groups): those that rent none. Nothing where the job names its own."""
    from orchestrator.cli import instances
    from orchestrator.provider import RentsGroups

    known = sorted(_provider_names())
    able = [p for p in known if isinstance(instances.renter(p), RentsGroups)]
    if not set(able) <= set(asked or []):
        return []
    return [p for p in known if p not in able]


def _volumes(js) -> None:
    """Which volume each path mounts, and where ``HF_HOME`` goes (``volume_mounts.env``: the first
    volume's ``hf``, unless the task sets its own)."""
    from orchestrator.volume_mounts import HF_DIR
    from orchestrator.volume_uses import Use

    uses = [Use.from_dict(u) for u in js.volumes or []]
    if not uses:
        return
    def names(use) -> str:
        return ", ".join(use.volume(r) for r in range(js.nodes)) if use.per_node else use.name

    for use in uses:
        out(f"  volume   {names(use)} at {use.path}" + (", one per node (node R mounts its own)" if use.per_node else ""))
    work = js.work
    if "HF_HOME" not in (getattr(work, "env", None) or {}) and "HF_HOME" not in (getattr(work, "secrets", None) or []):
        out(f"  HF_HOME  {uses[0].path}/{HF_DIR}: the hub's downloads stay on the volume ({names(uses[0])})")


def _vram(low: float | None, high: float | None) -> str:
    if low and high:
        return f" with {low:g} GB each" if low == high else f" with {low:g} to {high:g} GB each"
    return f" with at least {low:g} GB each" if low else f" with at most {high:g} GB each" if high else ""


def _head(sub) -> None:
    """What the task is: its machines, what it runs, its caps."""
    js = sub.spec
    req = js.request
    what = "CPU only" if req.cpu else f"{req.gpus}x {req.gpu or 'any GPU'}" + _vram(js.min_vram, js.max_vram)
    out(f"task {sub.name}: {js.nodes} node(s), {what}" + (", spot" if req.spot else "")
        + (f", disk {req.disk_gb} GB" if sub.disk_given else ""))
    for line in js.kind_of().plan_lines(sub.name):
        out(line)
    caps = [f"max_cost ${sub.max_cost:g}" if sub.max_cost is not None else None,
            f"max_hours {sub.max_hours:g}" if sub.max_hours else None, f"retries {sub.retries}"]
    out(f"  caps     {', '.join(c for c in caps if c)}")


def print_list_prices(sub) -> bool:
    """A dry run that could ask no provider for offers, for want of a key here: the task, then the
    list prices orch ships for what it asks (``catalogue``), each marked "list price, DATE, not
    live". False where that is not so (a provider with a key answered, or the catalogue lists
    nothing of the kind): the plan's own refusal stands."""
    from orchestrator import catalogue
    from orchestrator.cli import instances

    js = sub.spec
    req = js.request
    if req.cpu or req.offer:
        return False
    unkeyed = []
    for name in js.providers or sorted(_provider_names()):
        provider = instances.renter(name)
        if provider.missing_credentials():
            unkeyed.append(name)
        elif not provider.embedded:  # a provider with a key was asked: its answer stands
            return False
    date, _ = catalogue.load()
    rows = catalogue.matching(req.gpu, req.gpus, js.min_vram, unkeyed, js.max_vram)
    if not unkeyed or not rows:
        return False
    _head(sub)
    dropped = _cannot_group(js.providers) if js.nodes > 1 else []
    if dropped:
        out(f"  nodes    not asked, as they rent no group: {', '.join(dropped)}")
    out(f"  plan     no live offer: no key here for {', '.join(unkeyed)} (`orch check` says what each needs); "
        "a launch asks the providers live")
    per = f"per hour for {js.nodes} nodes" if js.nodes > 1 else "per hour"
    out(f"list prices from orch's catalogue (on-demand, {per}; {catalogue.label(date)})"
        + (": spot prices move and are not listed" if req.spot else "") + ", cheapest first:")
    for i, row in enumerate(rows[:OFFERS_SHOWN], 1):
        out(f"  {i:2d}. {row.provider}: {row.gpus}x {row.gpu} {row.vram_gb:g} GB ({row.offer}), "
            f"${row.usd_hr * js.nodes:.2f}/hr, {catalogue.label(date)}")
    for source in dict.fromkeys(row.source for row in rows[:OFFERS_SHOWN]):
        out(f"  source   {source}")
    out("  dry run: nothing rented, nothing recorded")
    return True


def _provider_names() -> list[str]:
    from orchestrator import plugins

    return list(plugins.providers())


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
