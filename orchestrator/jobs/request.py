"""Requests built in the core: what a user asked (the command line's flags, a task file, or both)
in, one ``jobs.Submission`` out, for every kind (a ``run:`` command, a ``train:`` or ``--data``
LibreYOLO training), every part of it checked before anything is opened or rented (one line, exit
2). `orch run` parses its flags into ``Flags`` and calls ``build``; `orch schedule add` calls the
same with the task file alone; `orch up` and `orch exec` share the machine checks and the task
merge. Which flags the user typed is data here (``Flags.given``): a flag typed wins over the task
file, a default does not.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from orchestrator.errors import UsageError

# `orch up` options that make sense only for a LibreYOLO training.
TRAINING_FLAGS = {"data": "--data", "model": "--model", "epochs": "--epochs", "imgsz": "--imgsz", "batch": "--batch",
                  "save_period": "--save-period", "train_arg": "--train-arg", "push_to": "--push-to",
                  "resume": "--resume"}
RESOURCE_FLAGS = ("gpu", "gpus", "cpu", "disk", "image", "spot", "bid")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Flags:
    """What the command line gave ``orch run`` (``orch schedule add``: its task file's defaults):
    ``up``, every option of `orch up` with its value (the machine, the training); the job's own;
    and ``given``, the names of those the user typed (they win over a task file)."""

    up: dict
    env: list[str] = field(default_factory=list)
    secret: list[str] = field(default_factory=list)
    workdir: str | None = None
    provider: list[str] = field(default_factory=list)
    max_cost: float | None = None
    max_hours: float | None = None
    retries: int = 3
    keep: bool = False
    replace: bool = False
    allow_secret: list[str] = field(default_factory=list)
    workdir_max_mb: float | None = None
    avoid_preempted: bool = False
    given: frozenset = frozenset()
    command: str = "orch run"  # the command asking, as its refusals name it ("orch schedule add")

    def typed(self, key: str) -> bool:
        return key in self.given


def build(name: str | None, command: list[str] | None, file: Path | None, flags: Flags, dry_run: bool = False,
          environ=None, say: Callable[[str], None] = _stderr):
    """The ``jobs.Submission`` of what was asked: a task file (or ``-- CMD``) merged with the flags,
    else a training from `orch up`'s options alone. ``environ``: where the task's secrets are
    checked to be set (this process's by default; a dry run only warns of those missing)."""
    if file is not None or command or flags.env or flags.secret or flags.workdir or flags.allow_secret:
        sub = _from_task(name, command, file, flags, dry_run, environ, say)
    else:
        sub = _training(name, flags.provider, flags.max_cost, flags.max_hours, flags.retries, flags.keep, None,
                        flags.up, dry_run, flags.replace, say)
    if flags.avoid_preempted:
        sub = replace(sub, spec=replace(sub.spec, avoid_preempted=True))
    _check_caps(sub)
    return sub


def _from_task(name, command, file, flags: Flags, dry_run, environ, say):
    """A task file (or a command line) read, checked whole and merged with the flags: a ``run:``
    task becomes a command job's submission, a ``train:`` one a training's."""
    from orchestrator.tasks import task

    given, options = flags.typed, flags.up
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
        if given(key):
            setattr(res, key, options[key])
    if given("gpu") and not given("cpu"):  # a GPU asked for on the command line wins over the file's cpu: true
        res.cpu = False
    if given("cpu") and options["cpu"] and not given("gpu"):
        res.gpu = None
    if given("provider"):
        res.provider = list(dict.fromkeys(flags.provider or []))
    for key in ("max_cost", "max_hours", "retries", "keep"):
        if given(key):
            setattr(t, key, getattr(flags, key))
    for key in ("idle_minutes", "on_idle"):
        if given(key):
            setattr(t, key, options[key])
    if given("nodes"):
        from orchestrator.instances import groups

        groups.check_nodes(options["nodes"])
        t.nodes = options["nodes"]
    base = merge_flags(t, flags.env, flags.secret, flags.workdir, base, path, lines, flags.allow_secret or [],
                       flags.workdir_max_mb, flags.command)
    if t.run is None and t.train is None:
        raise UsageError(f"{task.where(path, lines) if path else 'orch run'}: nothing to run: give run: (a command) "
                         "or train: (a LibreYOLO training)")
    task.check(t, path, lines, _dry_run_environ(t, dry_run, say) if dry_run else environ, flags.command)
    _say_translation(path, lines, say)
    _warn_gpu_counts(t, path, lines, say)
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
        return _training(name, providers, t.max_cost, t.max_hours, t.retries, t.keep, res.max_price,
                         _train_options(t, flags), dry_run, flags.replace, say)
    typed = [flag for key, flag in TRAINING_FLAGS.items() if given(key)]
    if typed:
        raise UsageError(f"{', '.join(typed)}: for a train: job, not a command")
    return _command(name, t, path, lines, base, providers, dry_run, flags, say)


def merge_flags(t, env, secret, workdir, base: Path, path=None, lines=None, allow=(), max_mb=None,
                command: str = "orch run") -> Path:
    """``--env``, ``--secret``, ``--allow-secret``, ``--workdir`` and ``--workdir-max-mb`` over a task
    (``orch run``, ``orch exec``, ``orch schedule add``): the flags add to the file's env and
    secrets, and a workdir given is read from here; returns the folder the task's relative paths
    are read from. What a file may not say alone is refused here, with its line: a secret that is
    one of orch's own credentials (``credentials``) without ``--allow-secret NAME``, and a
    ``workdir_max_mb`` above the default without ``--workdir-max-mb``. ``--allow-secret`` takes
    only one of orch's own credentials: any other name (a typo of one, a secret of your own, which
    ``--secret`` or ``secrets:`` gives) is refused, named with ``command``, the command asking."""
    from orchestrator.provider import credentials
    from orchestrator.tasks import task

    for name in allow or ():
        credentials.allowed(name, command)
    if env:
        t.env.update(task.env_pairs(env))
    from_file = list(t.secrets)
    if secret or allow:
        t.secrets = list(dict.fromkeys(t.secrets + list(secret or []) + list(allow or [])))
    for i, name in enumerate(t.secrets):
        at = task.where(path, lines, "secrets", i) if path is not None and i < len(from_file) else \
            ("--secret" if name in (secret or []) else f"{command} --allow-secret")
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


def _train_options(t, flags: Flags) -> dict:
    """The train: section and the resources as `orch up` options, where no flag was given."""
    from orchestrator.tasks.task import volume_flags

    tr, res = t.train, t.resources
    fill = {"data": tr.data, "model": tr.model, "epochs": tr.epochs, "imgsz": tr.imgsz, "batch": tr.batch,
            "save_period": tr.save_period, "push_to": tr.push_to, "resume": tr.resume,
            "train_arg": [f"{k}={_scalar(v)}" for k, v in tr.args.items()],
            "gpu": res.gpu, "gpus": res.gpus, "cpu": res.cpu, "disk": res.disk, "image": res.image, "spot": res.spot,
            "bid": res.bid, "idle_minutes": t.idle_minutes, "on_idle": t.on_idle, "nodes": t.nodes,
            "volume": volume_flags(t)}
    merged = dict(flags.up)
    for key, value in fill.items():
        if not flags.typed(key):
            merged[key] = value
    return merged


def _scalar(v) -> str:
    from orchestrator.tasks.task import scalar

    return scalar(v)


def _command(name, t, path, lines, base: Path, providers, dry_run, flags: Flags, say):
    """The command job's submission, every part of it checked."""
    from orchestrator import config, jobs
    from orchestrator.provider import plugins
    from orchestrator.tasks import task
    from orchestrator.money import policy as policies
    options = flags.up
    res = t.resources
    for p in providers:
        plugins.provider_class(p)
    refuse_spot_on(providers, res.spot)
    cmd = command_spec(t, path, lines, base)
    policy = policies.from_flags(idle_minutes=t.idle_minutes, max_hours=None, on_idle=t.on_idle,
                                 rebuild_cost=options.get("rebuild_cost"))
    check_ssh_timeout(options.get("ssh_timeout"))
    request = request_from(name, gpu=res.gpu, gpus=res.gpus, cpu=res.cpu, disk=res.disk, image=res.image,
                           spot=res.spot, bid=res.bid, offer=options.get("offer"))
    providers = group_providers(name, t.nodes, providers, request)  # checked before anything is made
    if request.cpu or request.offer:  # nothing to rank: the provider that rents says now what it cannot (--cpu --spot)
        renter(providers[0] if providers else plugins.default_provider()).validate(request)
    from orchestrator.jobs.record import refuse_taken

    refuse_taken(config.home(), name, dry_run, flags.replace, say)
    ssh_timeout = options.get("ssh_timeout")
    from orchestrator.volumes import volume_mounts

    volumes = volume_mounts.for_flags(options.get("volume") if flags.typed("volume") else task.volume_flags(t), t.nodes,
                                      providers)
    js = jobs.JobSpec(kind="command", work=cmd, request=request, providers=providers or None,
                      ssh_timeout=ssh_timeout * 60 if ssh_timeout else None, policy=policy, max_price=res.max_price,
                      nodes=t.nodes, volumes=volumes, min_vram=res.min_vram, max_vram=res.max_vram)
    return jobs.Submission(name, js, max_cost=t.max_cost, max_hours=t.max_hours, retries=t.retries, keep=t.keep,
                           disk_given=res.disk is not None, replace=flags.replace,
                           allowed_secrets=frozenset(flags.allow_secret or []))


def command_spec(t, path, lines, base: Path):
    """The command a task runs (the command kind's ``CommandSpec``), its workdir found and measured:
    what `orch run` submits and `orch exec` starts on a machine of yours."""
    from orchestrator.tasks import task, workdir
    from orchestrator.jobs.kinds import CommandSpec

    folder = None
    if t.workdir is not None:  # ~nouser, a NUL, a task file's folder elsewhere (not --workdir): refused
        within = path is not None and not t._workdir_given
        at = "--workdir" if t._workdir_given else task.where(path, lines, "workdir")
        folder = workdir.folder(base, t.workdir, at, within=within)
        workdir.measure(folder, t.workdir_max_mb, at)
    return CommandSpec(run=t.run, setup=t.setup, env={k: task.scalar(v) for k, v in t.env.items()},
                       secrets=list(t.secrets), workdir=str(folder) if folder else None,
                       outputs=[task.under_workdir(o, "output", "") for o in t.outputs],
                       checkpoint=task.under_workdir(t.checkpoint, "checkpoint", "") if t.checkpoint else None,
                       checkpoint_minutes=t.checkpoint_minutes, nodes=t.nodes, workdir_max_mb=t.workdir_max_mb,
                       keep_checkpoints=t.keep_checkpoints, preempt_signal=t.preempt_signal)


def _say_translation(path, lines, say=_stderr) -> None:
    """What orch translated of a SkyPilot or dstack task file, said once the file is accepted."""
    from orchestrator.tasks import peer_tasks

    for line in peer_tasks.said(path, lines):
        say(line)


def _warn_gpu_counts(t, path, lines, say) -> None:
    """A group on CPU machines whose command counts processes by GPUs (``DSTACK_GPUS_NUM``, ...): each
    is 0 there, and a launcher given 0 starts nothing, or falls back to a world of one on every node,
    trains apart and reports success. Said before anything is rented."""
    from orchestrator import nodes
    from orchestrator.tasks import task

    read = nodes.gpu_counts_read(t.setup, t.run)
    if t.nodes > 1 and t.resources.cpu and read:
        where = task.where(path, lines, "run") if path else "orch run"
        say(f"orch: warning: {where}: {', '.join(read)} {'is' if len(read) == 1 else 'are'} 0 on CPU machines: a "
            f"launcher started with that many processes per node starts none, or falls back to one world per node "
            f"(the {t.nodes} nodes train apart); count processes with $ORCH_PROCS_PER_NODE (the GPUs, 1 on a CPU "
            "machine)")


def _dry_run_environ(t, dry_run: bool, say):
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


def _training(name, provider, max_cost, max_hours, retries, keep, max_price, options, dry_run=False, replace=False,
              say=_stderr):
    """A LibreYOLO training's submission from `orch up`'s options, every one checked."""
    from orchestrator import config, jobs
    from orchestrator.runs import checkpoint_vet
    from orchestrator.provider import plugins
    from orchestrator.volumes import volume_mounts

    if name is None:
        raise UsageError("orch run needs a NAME (`orch run NAME --data ...`, `orch run NAME -- CMD`) or -f task.yaml")
    jobs.check_job_name(name)
    providers = list(dict.fromkeys(provider or []))
    named = list(providers)
    options = {k: v for k, v in options.items() if k != "cheapest"}  # a job always takes the offer cheapest per job
    policy, spec, request = check_up_options(name, provider=None, max_hours=None, need_data=True, **options)
    if _cpu_by_default(providers, options):
        # As `orch up` does on a laptop: no key to rent a GPU anywhere and none here, a CPU instance
        # on the default provider rather than a failed search for GPU offers.
        from dataclasses import replace as with_

        request = with_(request, cpu=True)
        say(f"no GPU on this machine and no provider key: job {name} trains on a CPU instance of "
            f"{plugins.default_provider()} (a provider's key, --provider or --gpu choose otherwise)")
    nodes = options["nodes"]
    providers = group_providers(name, nodes, providers, request)
    for p in named:
        need_credentials(p)  # unknown, wrong settings, or without its key: refused before anything is made
    refuse_spot_on(named, request.spot)
    if request.cpu or request.offer:  # nothing to rank: the first provider named (or the default one) rents
        first = renter(providers[0] if providers else plugins.default_provider())
        first.validate(request)
        first.require_credentials()
    folder = config.home() / "runs" / name
    if spec.resume:
        if replace:
            raise UsageError("--resume continues from the run's files, --replace removes them: one or the other")
        if not (folder / "weights" / "last.pt").is_file():
            raise UsageError(f"--resume starts from {folder / 'weights' / 'last.pt'}, which does not exist")
        refuse_reached(folder, spec.epochs)
        checkpoint_vet.refuse_unsafe(folder / "weights" / "last.pt")
    else:
        from orchestrator.jobs.record import refuse_taken

        refuse_taken(config.home(), name, dry_run, replace, say)  # --resume continues from them instead
    ssh_timeout = options["ssh_timeout"]
    js = jobs.JobSpec(kind="train", work=spec, request=request, providers=providers or None,
                      ssh_timeout=ssh_timeout * 60 if ssh_timeout else None, policy=policy, nodes=nodes,
                      max_price=max_price, volumes=volume_mounts.for_flags(options.get("volume"), nodes, named))
    return jobs.Submission(name, js, max_cost=max_cost, max_hours=max_hours, retries=retries, keep=keep,
                           resume_from=folder if spec.resume else None, disk_given=options["disk"] is not None,
                           replace=replace)


def _check_caps(sub) -> None:
    from orchestrator import jobs

    if sub.max_cost is not None and not 0 < sub.max_cost < 1e6:
        raise UsageError(f"--max-cost must be a $ amount above 0, not {sub.max_cost:g}")
    if sub.max_hours is not None and not 0 < sub.max_hours <= 100_000:
        raise UsageError(f"--max-hours must be above 0, not {sub.max_hours:g}")
    if not 0 <= sub.retries <= jobs.MAX_RETRIES:
        raise UsageError(f"--retries must be between 0 and {jobs.MAX_RETRIES}, not {sub.retries}")


def _cpu_by_default(providers: list[str], options: dict) -> bool:
    """No choice made (no --provider, --gpu, --gpus, --cpu or --offer), the default provider has no
    GPU here but runs CPU instances, and no other provider has a key: nothing to rank."""
    from orchestrator import config
    from orchestrator.provider import plugins

    if providers or options["gpu"] is not None or options["cpu"] or options["gpus"] != 1 or options["offer"]:
        return False
    default = plugins.default_provider()
    local = plugins.provider_class(default)(config.provider_settings(default))
    if local.capabilities.gpu or not local.capabilities.cpu_only:
        return False
    for name, cls in plugins.providers().items():
        if name != default and cls(config.provider_settings(name)).configured():
            return False
    return True


def check_up_options(name, *, provider, gpu, gpus, cpu, disk, image, spot, bid, offer, ssh_timeout, data, model,
                     epochs, imgsz, batch, save_period, train_arg, push_to, resume, idle_minutes, max_hours, on_idle,
                     rebuild_cost, need_data: bool = False, nodes: int = 1, volume=None):
    """Every check of `orch up`'s options, made before anything is opened: (the policy as JSON, the
    training spec or None, the request; its disk 20 GB when not given). `orch run` takes the same
    options (``need_data``: training is what it is for) and checks them here too."""
    from orchestrator.runs import training
    from orchestrator.money import policy as policies
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    from orchestrator.volumes.volume_uses import flags

    flags(volume)  # --volume as written (where each volume is: once the rest is checked)
    policy = policies.from_flags(idle_minutes=idle_minutes, max_hours=max_hours, on_idle=on_idle,
                                 rebuild_cost=rebuild_cost)
    check_ssh_timeout(ssh_timeout)
    spec = None
    if data is not None or resume or need_data:
        if not data:
            raise UsageError("--data needs a dataset folder or hf://ORG/REPO/FILE.tar" if data is not None or need_data
                             else "--resume needs --data (the dataset the run trains on)")
        spec = training.TrainSpec(data=data, model=model, epochs=epochs, imgsz=imgsz, batch=batch,
                                  save_period=save_period, train_args=training.parse_train_args(train_arg or []),
                                  push_to=push_to, resume=resume)
        training.check_spec(spec)
    else:
        _no_training_flags(train_arg, push_to, save_period, imgsz, batch, epochs, model)
    request = request_from(name, gpu=gpu, gpus=gpus, cpu=cpu, disk=disk, image=image, spot=spot, bid=bid, offer=offer)
    if provider is not None:
        refuse_spot(provider, spot)  # an unknown provider is refused before anything is opened
    # What a provider can never do (a group on RunPod) is said before a key it would need anyway.
    check_group_options(name, nodes, spec, request, provider, resume=resume, job=need_data)
    if provider is not None:
        need_credentials(provider)
    return policy, spec, request


def check_ssh_timeout(minutes: float | None) -> None:
    if minutes is not None and not 0 < minutes <= 24 * 60:
        raise UsageError(f"--ssh-timeout must be minutes above 0 and at most 1440, not {minutes}")


def request_from(name: str, *, gpu, gpus, cpu, disk, image, spot, bid, offer):
    """The machine asked for, checked (its disk 20 GB when not given)."""
    from orchestrator.instances.lifecycle import check_request
    from orchestrator.provider import Request

    request = Request(name=name, gpu=gpu, gpus=gpus, cpu=cpu, disk_gb=disk if disk is not None else 20,
                      image=image, spot=spot, bid=bid, offer=offer)
    check_request(name, request)
    return request


def refuse_spot(provider: str, spot: bool) -> None:
    """--spot on a provider named: refused up front when it has none (an unknown provider too). Its
    capabilities are the built provider's: the local one's depend on this machine."""
    if spot and not renter(provider).capabilities.spot:
        raise UsageError(f"{provider} has no spot instances (`orch check {provider}` lists what it lacks): drop --spot")


def refuse_spot_on(providers: list[str], spot: bool) -> None:
    """--spot on a job whose providers are named: refused when none of them has spot instances, as
    its launch would find (a dry run too)."""
    if spot and providers and not any(renter(p).capabilities.spot for p in providers):
        refuse_spot(providers[0], True)


def renter(provider: str):
    """The provider that will rent, built from its settings alone (no ledger opened), to ask what it can do."""
    from orchestrator import config
    from orchestrator.provider import plugins

    return plugins.provider_class(provider)(config.provider_settings(provider), config.home())


def need_credentials(provider: str) -> None:
    """A provider without its key is refused before anything is opened, checked or created."""
    renter(provider).require_credentials()


def check_group_options(name, nodes, spec, request, provider, resume: bool = False, job: bool = False):
    """--nodes N: its size, the names of its nodes, the global batch against the world size, and
    the provider's own word that it can rent a group, all before anything is opened. ``job``:
    `orch run` checks its names (NAME-aK) and its providers (a list) itself."""
    from orchestrator.instances import groups
    from orchestrator.provider import plugins

    groups.check_nodes(nodes)
    if nodes == 1:
        return
    if spec is not None:
        per_node = 1 if request.cpu else request.gpus
        groups.check_batch(spec.batch, nodes, per_node, 16 if request.cpu else None)
    if job:
        return
    groups.check_name(name, nodes)
    if resume:
        raise UsageError("--resume on a group: `orch run NAME --nodes N --resume` resumes it on every node")
    groups.check_provider(renter(provider or plugins.default_provider()), nodes, request)


def refuse_reached(folder, epochs: int) -> None:
    """--resume to --epochs the pulled run already reached is refused up front, with the epoch it
    reached (its status.json and metrics.jsonl say so, without torch here)."""
    from orchestrator.jobs.resume_copy import pulled_epoch

    reached = pulled_epoch(folder)
    if reached is not None and reached >= epochs:
        raise UsageError(f"the run already reached epoch {reached} of {epochs} (pulled in {folder}): resume with "
                         f"--epochs above {reached}")


def _no_training_flags(train_arg, push_to, save_period, imgsz, batch, epochs, model) -> None:
    """Training options without --data would be silently ignored: refuse them."""
    given = [flag for flag, value, default in (("--train-arg", train_arg, None), ("--push-to", push_to, None),
                                               ("--save-period", save_period, None), ("--imgsz", imgsz, None),
                                               ("--batch", batch, None), ("--epochs", epochs, 10),
                                               ("--model", model, "yolo9-t"))
             if value not in (default, [])]
    if given:
        raise UsageError(f"{', '.join(given)} {'is a training option' if len(given) == 1 else 'are training options'}: "
                         "add --data")


def group_providers(name: str, nodes: int, providers: list[str], request) -> list[str]:
    """The providers a job on ``nodes`` machines may rent on: one machine, those named (none: any).
    A group: its attempts' names fit (NAME-aK-R), and every provider it may rent on can rent a
    group (each one named is asked; none named: those that can, and the default for a CPU job)."""
    from orchestrator import jobs
    from orchestrator.instances import groups
    from orchestrator.provider import plugins
    from orchestrator.provider import RentsGroups

    if nodes <= 1:  # any provider rents one machine (a count out of range is refused with its own line)
        return providers
    longest = jobs.MAX_GROUP_JOB_NAME
    if len(name) > longest:
        raise UsageError(f"a job on --nodes {nodes} has a name of at most {longest} characters (its nodes are "
                         f"NAME-a1-0, NAME-a1-1, ...), not {len(name)}")
    if request.cpu and not providers:
        providers = [plugins.default_provider()]
    if providers:
        for p in providers:
            groups.check_provider(renter(p), nodes, request)
        return providers
    able = [p for p in plugins.providers() if isinstance(renter(p), RentsGroups)]
    if not able:
        raise UsageError(f"--nodes {nodes}: no provider orch knows can rent a group")
    return able
