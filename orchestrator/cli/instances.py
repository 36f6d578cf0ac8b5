"""The commands on one instance: up, status, ssh, stop, start, down, pull, logs, monitor.

Every argument is checked before anything is opened or created: bad input leaves no ORCH_HOME,
no ledger and no instance behind.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import List, Optional

import typer

from orchestrator.cli.app import app, emit_json, instance_named, open_orch, out, say
from orchestrator.errors import OrchError, SSHError, UsageError
from orchestrator.text import clean
from orchestrator import parallel as par


@app.command()
def up(
    name: str = typer.Argument(..., help="Your name for the instance (lowercase letters, digits, '-')."),
    provider: Optional[str] = typer.Option(None, "--provider", "-p", help="local, runpod, vastai, ... (default: config or local)."),
    gpu: Optional[str] = typer.Option(None, help="GPU type, e.g. 'RTX 4090'."),
    gpus: int = typer.Option(1, help="Number of GPUs."),
    cpu: bool = typer.Option(False, "--cpu", help="A CPU-only instance."),
    disk: Optional[int] = typer.Option(None, help="Disk in GB (default: data + checkpoints + 30 %, else 20)."),
    image: Optional[str] = typer.Option(None, help="Container image, where the provider uses one."),
    spot: bool = typer.Option(False, "--spot", help="Spot / interruptible instance."),
    bid: Optional[float] = typer.Option(None, help="Spot bid in $/hr per GPU (default: live minimum + margin)."),
    offer: Optional[str] = typer.Option(None, help="A provider offer id picked by hand."),
    ssh_timeout: Optional[float] = typer.Option(None, help="Minutes to wait for SSH (default 20)."),
    data: Optional[str] = typer.Option(None, help="A local YOLO dataset folder (with data.yaml) or hf://ORG/REPO/FILE.tar."),
    model: str = typer.Option("yolo9-t", help="LibreYOLO model to train."),
    epochs: int = typer.Option(10, help="Epochs to train."),
    imgsz: Optional[int] = typer.Option(None, help="Training image size."),
    batch: Optional[int] = typer.Option(None, help="Batch size (default -1: LibreYOLO's autobatch on GPUs)."),
    save_period: Optional[int] = typer.Option(None, help="Save weights/epoch_N.pt every N epochs."),
    train_arg: Optional[List[str]] = typer.Option(None, "--train-arg", help="Extra LibreYOLO train key=value (repeatable)."),
    push_to: Optional[str] = typer.Option(None, help="Also upload milestones from the instance to hf://ORG/REPO."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run from its last.pt (this instance, or a new one)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the training to the end with a live progress line."),
    idle_minutes: Optional[float] = typer.Option(None, help="Stop/destroy after this long idle (default 10)."),
    max_hours: Optional[float] = typer.Option(None, help="Hard deadline: stop/destroy after this many hours."),
    on_idle: Optional[str] = typer.Option(None, help="auto (break-even decides), stop or destroy."),
    rebuild_cost: Optional[float] = typer.Option(None, help="$ to rebuild this instance (for stop vs destroy)."),
    cheapest: bool = typer.Option(False, "--cheapest", help="Launch the offer that is cheapest per job (or per hour)."),
    nodes: int = typer.Option(1, "--nodes", help="Machines: N > 1 rents a group NAME (nodes NAME-0 .. NAME-N-1) "
                                                 "that trains under torchrun, all or nothing."),
    volume: Optional[List[str]] = typer.Option(None, "--volume", help="NAME:PATH: mount volume NAME (`orch volume "
                                               "create`) at PATH before anything runs (repeatable; NAME:PATH:per-node "
                                               "gives each node of a group NAME-R)."),
    as_json: bool = typer.Option(False, "--json", help="Print the instance as JSON."),
):
    """Rent an instance, provision it, prove the device works, and (with --data) start training."""
    from orchestrator import config
    from orchestrator.provider import plugins
    from orchestrator.runs import training
    from orchestrator.jobs.request import check_up_options, refuse_reached, renter

    policy, spec, request = check_up_options(
        name, provider=provider, gpu=gpu, gpus=gpus, cpu=cpu, disk=disk, image=image, spot=spot, bid=bid, offer=offer,
        ssh_timeout=ssh_timeout, data=data, model=model, epochs=epochs, imgsz=imgsz, batch=batch,
        save_period=save_period, train_arg=train_arg, push_to=push_to, resume=resume, idle_minutes=idle_minutes,
        max_hours=max_hours, on_idle=on_idle, rebuild_cost=rebuild_cost, nodes=nodes, volume=volume)
    if volume:  # the volumes' provider rents, and its create mounts them (``volume_mounts``)
        from orchestrator.volumes import volume_mounts, volume_uses

        placed = volume_mounts.for_cli(volume_uses.flags(volume), nodes, [provider] if provider else None)
        request = placed.request(request)
        if provider is None and placed.provider != plugins.default_provider():
            provider = placed.provider
    refuse_over_budget(f"orch up {name}", None if cheapest else renter(provider or plugins.default_provider()),
                       request, nodes, max_hours)
    if nodes > 1:
        from orchestrator.cli import groups

        if cheapest:
            raise UsageError("--cheapest picks one machine: a group names its --provider (and --gpu)")
        renter(provider or plugins.default_provider()).validate(request)  # before anything is opened
        groups.up(name, provider, request, nodes, spec=spec, policy=policy, disk_given=disk is not None,
                  ssh_timeout=ssh_timeout, wait=wait, as_json=as_json)
        return
    chose = provider is not None or gpu is not None or cpu or gpus != 1 or offer is not None or cheapest
    auto_cpu = False
    if not cheapest:  # the provider that will rent is known: what it cannot do is refused before anything is opened
        named = plugins.default_provider() if provider is None else provider
        caps = renter(named).capabilities
        # A first `orch up NAME` on a laptop: a CPU instance rather than an error (an explicit --gpu is still refused).
        auto_cpu = not chose and not caps.gpu and caps.cpu_only
        renter(named).validate(replace(request, cpu=True) if auto_cpu else request)
        renter(named).require_credentials()  # a create without its key fails halfway: refused before anything
    if resume:
        refuse_reached(config.home() / "runs" / name, epochs)
        pulled = config.home() / "runs" / name / "weights" / "last.pt"
        if pulled.exists():  # the copy a new instance would be given: checked before anything is opened
            from orchestrator.runs import checkpoint_vet

            checkpoint_vet.refuse_unsafe(pulled)
    orch = open_orch()
    existing = orch.ledger.by_name(name)
    if resume and existing is not None:
        if existing.state != "ready":
            raise UsageError(f"{name} is {existing.state}: `orch start {name}` first")
        training.prepare(spec, orch.home, say)
        run = training.launch(orch, existing, spec)
        _after_launch(orch, existing, run, wait, as_json)
        return
    if spec is not None:
        training.prepare(spec, orch.home, say)
        if disk is None:
            disk, why = training.disk_for(spec)
            request = replace(request, disk_gb=disk)
            say(f"      disk: {why}")
    if cheapest:
        from orchestrator.money import offers

        provider, request = offers.pick_cheapest(orch, request, spec, providers=[provider] if provider else None)
    provider = plugins.default_provider() if provider is None else provider
    if auto_cpu:
        request = replace(request, cpu=True)
        say(f"{provider} has no GPU on this machine: {name} is a CPU instance (--provider and --gpu choose otherwise)")
    holder = {}

    def start_training(inst):
        holder["run"] = training.launch(orch, inst, spec)

    inst = orch.up(name, provider, request, ssh_timeout=ssh_timeout * 60 if ssh_timeout else None,
                   policy=policy, after_verify=start_training if spec else None)
    if spec is None:
        _summary(inst, as_json)
        return
    _after_launch(orch, inst, holder["run"], wait, as_json)


def refuse_over_budget(what: str, provider, request, nodes: int, hours: float | None) -> None:
    """``[budget]``: an instance whose known price for ``hours`` (``--max-hours``) does not fit what
    is left, or any once nothing is left, is refused (exit 2) before anything is made."""
    from orchestrator.money import budget

    if not budget.limits()[0]:
        return
    price = provider.known_price_hr(request) if provider is not None else None
    budget.check(open_orch().ledger, budget.estimate(None, None if price is None else price * nodes, hours), what)


def _after_launch(orch, inst, run, wait: bool, as_json: bool) -> None:
    from orchestrator.runs import runs

    view = runs.follow(orch, inst, run) if wait else None
    if view:
        got, where = runs.pull(orch, inst, run, view=view)
        say(f"      weights and run files in {where}")
    _summary(inst, as_json, run=orch.ledger.get_run(run.id), view=view)


def _summary(inst, as_json: bool, run=None, view=None) -> None:
    from orchestrator.views.instances import model_dict, run_dict

    data = model_dict(inst)
    if run is not None:
        data["run"] = run_dict(run, view)
    if as_json:
        emit_json(data)
        return
    out(f"{inst.name} on {inst.provider}: {inst.state}")
    out(f"  device   {clean(inst.device) or '-'}")
    out(f"  price    ${inst.price_hr:.4f}/hr running, ${inst.stopped_price_hr:.4f}/hr stopped")
    out(f"  ssh      orch ssh {inst.name}")
    if run is not None:
        r = data["run"]
        out(f"  run      {r['model']} {r['state']} {r.get('progress') or ''}  ({r['run_dir']})")
        out(f"  watch    orch status {inst.name} | orch logs {inst.name} -f | orch monitor {inst.name}")


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="One instance (shows its training run too)."),
    all_: bool = typer.Option(False, "--all", "-a", help="Include destroyed, failed and lost instances."),
    refresh: bool = typer.Option(False, "--refresh", "-r", help="Ask each provider first (one listing each): "
                                                              "what a watchdog or a console did shows at once."),
    as_json: bool = typer.Option(False, "--json", help="Stable JSON output (see README)."),
):
    """The fleet from the ledger (--refresh: as the providers show it now), or one instance in detail
    (always asked of its provider)."""
    if name is None:
        from orchestrator.views import fleet

        if refresh:
            from orchestrator.instances.sync import refresh_all

            for provider, why in refresh_all(open_orch()):
                say(f"orch: warning: {provider} could not be asked ({why}): its instances are as the ledger last saw them")
        fleet.show(all_, as_json, refreshed=refresh)
        return
    from orchestrator.instances import watchdog
    from orchestrator.cli import groups
    from orchestrator.instances.lifecycle import check_name
    from orchestrator.views.instances import iso, model_dict

    check_name(name)  # before anything is opened: a refusal creates no ledger
    orch = open_orch()
    if groups.status(orch, name, as_json):
        return
    inst = orch.ledger.by_name(name, live_only=False)
    if inst is None:
        if orch.ledger.job(name) is not None:  # `orch run NAME` then `orch status NAME`: its machines are NAME-aK
            raise UsageError(f"{name} is a job, not an instance: `orch jobs show {name}` shows it, its attempts and "
                             "their machines")
        raise UsageError(f"no instance named {name!r}")
    inst = orch.refresh(inst)
    if inst.state == "ready":
        try:
            watchdog.learn(orch, inst, watchdog.read_state(orch, inst))
        except SSHError:
            pass  # unreachable: reported below where the run is read
    data = model_dict(inst)
    run = orch.ledger.latest_run(inst.id)
    if run is not None:
        data["run"] = _run_view(orch, inst, run)
    events = orch.ledger.events(inst.id)
    from orchestrator.volumes import volumes

    data["volumes"] = [{"volume": v["volume"], "path": v["path"]} for v in volumes.attached(orch.ledger).get(inst.id, [])]
    data["events"] = [{"at": iso(e.at), "from": e.from_state, "to": e.to_state,
                       "reason": e.reason, "actor": e.actor} for e in events]
    since = next((e.at for e in reversed(events) if e.to_state == inst.state and e.from_state != e.to_state), None)
    data["state_since"] = iso(since)
    if as_json:
        emit_json(data)
        return
    out(f"{inst.name} ({inst.id}) on {inst.provider} {inst.provider_id or ''}: {inst.state} since {data['state_since']}")
    hint = _STATE_HINTS.get(inst.state)
    if hint:
        out(f"  {hint.format(name=inst.name)}")
    for key in ("gpu_name", "device", "ssh", "price_hr", "stopped_price_hr", "disk_gb"):
        if data.get(key) not in (None, ""):
            out(f"  {key:<17}{clean(data[key])}")
    for v in data["volumes"]:
        out(f"  volume           {v['volume']} at {clean(v['path'])}")
    if run is not None:
        r = data["run"]
        out(f"  run              {clean(r['model'])} {clean(r.get('progress') or r['state'])}")
        out(f"  run_dir          {clean(r['run_dir'])}")
        if r.get("error"):
            out(f"  error            {clean(r['error'])}")
        for problem in r.get("problems") or []:
            out(f"  warning          {clean(problem)}")
    for e in data["events"][-6:]:
        out(f"  {e['at']}  {e['from'] or '-':>12} -> {e['to']:<12} {e['actor']:<8} {clean(e['reason'], 400)}")


_STATE_HINTS = {
    "scheduling": "waits at its provider for its host to free a GPU (disk billing); `orch stop {name}` gives up",
    "unattended": "RUNNING and BILLING, though orch neither started nor prepared it: `orch start {name}` makes it "
                  "ready, `orch stop {name}` or `orch down {name}` ends it (the reaper stops it once idle)",
    "broken": "its container exited or its host dropped, and it may bill: `orch down {name}` (the reaper destroys "
              "it after pulling what it can)",
    "preempted": "stopped or ended by its provider's spot market: `orch start {name}` or `orch down {name}`",
    "starting": "being started by an orch command; if none runs any more, `orch reconcile` settles it",
}


def _run_view(orch, inst, run) -> dict:
    """The run from status.json when the instance is up (pulling new milestones), else the ledger's."""
    from orchestrator.runs import runs
    from orchestrator.views.instances import run_dict

    if inst.state != "ready" or not run.run_dir:
        return run_dict(run)
    try:
        view = runs.read(orch, inst, run)
    except (SSHError, OrchError) as e:
        say(f"orch: warning: could not read the run on {inst.name}: {e}")
        return run_dict(run)
    try:
        got, where = runs.pull(orch, inst, run, view=view, only_milestones=True)
        if got:
            say(f"pulled {', '.join(got)} to {where}")
    except OrchError as e:
        say(f"orch: warning: could not pull the milestones of {inst.name}: {e}")
    return run_dict(orch.ledger.get_run(run.id), view)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(name: str = typer.Argument(...), command: Optional[List[str]] = typer.Argument(None),
        node: Optional[int] = typer.Option(None, "--node", help="A group's node, by rank (default 0, the head).")):
    """Open a shell on the instance, or run a command: orch ssh NAME -- CMD ..."""
    from orchestrator.instances import groups
    from orchestrator.ssh import ssh_exec
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    if node is not None and not 0 <= node < groups.MAX_NODES:
        raise UsageError(f"--node is a rank from 0 to {groups.MAX_NODES - 1}, not {node}")
    orch = open_orch()
    inst = instance_named(orch, name, node)
    if not inst.ssh_host:
        raise UsageError(f"{name} has no SSH endpoint yet ({inst.state})")
    if not inst.host_key:
        # Nothing pinned yet (an instance `orch reconcile` adopted): first contact pins its key, as
        # every orch connection does, before ssh is told to trust only that key.
        with orch.connect(inst):
            pass
        inst = orch.ledger.get(inst.id)
    argv = ssh_exec.argv(orch.home, inst.ssh_host, inst.ssh_port, inst.ssh_user, inst.host_key, command or [])
    sys.stdout.flush()
    os.execvp("ssh", argv)


@app.command()
def stop(name: str):
    """Stop the instance: compute stops billing, the disk is kept (and may still bill)."""
    from orchestrator.instances.lifecycle import check_name

    from orchestrator.instances import groups

    check_name(name)
    orch = open_orch()
    inst = instance_named(orch, name)
    groups.refuse_alone(inst, "stopped")
    inst = orch.stop(inst)
    out(f"{inst.name}: {inst.state} (disk kept, ${inst.stopped_price_hr:.4f}/hr while stopped)")


@app.command()
def start(name: str,
          timeout: Optional[float] = typer.Option(None, help="Minutes to wait for the provider to give the GPU "
                                                           "back (default 5); then it is stopped again.")):
    """Start a stopped instance on the same disk, and make it ready again (provision, verify, watchdog)."""
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    if timeout is not None and not 0 < timeout <= 24 * 60:
        raise UsageError(f"--timeout must be minutes above 0 and at most 1440, not {timeout}")
    from orchestrator.instances import groups

    orch = open_orch()
    inst = instance_named(orch, name)
    groups.refuse_alone(inst, "started")
    inst = orch.start(inst, timeout=timeout * 60 if timeout is not None else None)
    out(f"{inst.name}: {inst.state} at {inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port}")


@app.command()
def down(names: Optional[List[str]] = typer.Argument(None, metavar="NAME...", help="The instances to destroy."),
         all_: bool = typer.Option(False, "--all", help="Every live instance in the ledger."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask, also for an instance that is training."),
         no_pull: bool = typer.Option(False, "--no-pull", help="Destroy without pulling the weights first.")):
    """Pull the weights, then destroy the instances and everything on them; billing ends. Asks first
    when one is training or with --all (without a terminal to ask, --yes is needed)."""
    from orchestrator.instances.lifecycle import check_name

    from orchestrator.instances import groups
    from orchestrator.cli import groups as group_commands

    if all_ == bool(names):
        raise UsageError("name the instances to destroy, or --all (not both)")
    for name in names or []:
        check_name(name)
    orch = open_orch()
    # A group is named by its own name and goes as one (rank 0's run home, every node at once).
    if all_:
        live = orch.ledger.instances(live_only=True)
        group_names = sorted({i.group_name for i in live if groups.is_group(i)})
        targets = [i for i in live if not groups.is_group(i)]
    else:
        group_names = [n for n in dict.fromkeys(names) if orch.ledger.by_name(n) is None and groups.live(orch.ledger, n)]
        targets = [instance_named(orch, n) for n in dict.fromkeys(names) if n not in group_names]
        for inst in targets:
            groups.refuse_alone(inst, "destroyed")
    if not targets and not group_names:
        out("no live instance")
        return
    training = [i.name for i in targets if _training(orch, i)]
    training += [g for g in group_names if any(_training(orch, n) for n in groups.live(orch.ledger, g))]
    if (all_ or training) and not yes:
        what = ", ".join(f"{n}" + (" (TRAINING)" if n in training else "") for n in [*group_names,
                                                                                       *(i.name for i in targets)])
        why = (f"{', '.join(training)} {'is' if len(training) == 1 else 'are'} training" if training
               else f"--all destroys every live instance ({len(targets)}) and group ({len(group_names)})")
        _confirm(f"destroy {what}{'' if no_pull else ', after pulling their weights'}?", why)
    failed = []
    for group in group_names:
        try:
            group_commands.down(orch, group, no_pull)
        except OrchError as e:
            if len(group_names) + len(targets) == 1:
                raise
            failed.append(group)
            say(f"orch: error: {group}: {e}")
    for inst in targets:
        try:
            _down(orch, inst, no_pull)
        except OrchError as e:
            if len(group_names) + len(targets) == 1:
                raise
            failed.append(inst.name)
            say(f"orch: error: {inst.name}: {e}")
    if failed:
        raise OrchError(f"not destroyed: {', '.join(failed)} (see above)")


def _training(orch, inst) -> bool:
    """Whether the ledger last saw a training running there (no SSH: a refusal must be quick)."""
    run = orch.ledger.latest_run(inst.id)
    return run is not None and run.state == "running"


def _confirm(question: str, why: str) -> None:
    """Ask on the terminal; without one (a script, a pipe, CI) refuse rather than guess."""
    if not sys.stdin.isatty():
        raise UsageError(f"{why}: add --yes to destroy without asking (no terminal to ask on)")
    if not typer.confirm(question, default=False, err=True):
        raise UsageError("nothing destroyed")


def _down(orch, inst, no_pull: bool) -> None:
    from orchestrator.ledger import claims

    with claims.hold(orch.ledger, inst.name):  # nobody else pulls or moves it between the pull and the destroy
        inst = orch.ledger.get(inst.id)
        run = orch.ledger.latest_run(inst.id)
        if run is not None and run.run_dir and not no_pull:
            _pull_or_refuse(orch, inst, run)
        inst = orch.down(inst)
    out(f"{inst.name}: {inst.state}")


def _pull_or_refuse(orch, inst, run) -> None:
    from orchestrator.runs import runs

    if inst.state != "ready":
        if run.pulled_at is None:
            raise OrchError(f"{inst.name} is {inst.state} and its weights were never pulled: "
                            f"`orch start {inst.name}` first, or `orch down {inst.name} --no-pull` to lose them")
        return
    try:
        got, where = runs.pull(orch, inst, run)
    except OrchError as e:
        raise OrchError(f"could not pull the weights of {inst.name} ({e}); not destroying it. "
                        f"Use --no-pull to destroy anyway") from None
    say(f"pulled {len(got)} new file(s) to {where}")


@app.command()
def pull(name: str, dest: Optional[str] = typer.Option(None, help="Where to put the files (default $ORCH_HOME/runs/NAME).")):
    """Bring the run's weights and files home (only what changed)."""
    from pathlib import Path

    from orchestrator.runs import runs
    from orchestrator.instances.lifecycle import check_name

    check_name(name)
    orch = open_orch()
    inst = instance_named(orch, name)
    run = orch.ledger.latest_run(inst.id)
    if run is None or not run.run_dir:
        raise UsageError(f"{name} has no training run")
    got, where = runs.pull(orch, inst, run, dest=Path(dest).expanduser() if dest else None)
    out(f"{len(got)} file(s) pulled to {where}" + (f": {', '.join(got)}" if got else " (all up to date)"))


@app.command()
def logs(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
         lines: int = typer.Option(50, "--lines", "-n", help="How many lines from the end.")):
    """Tail the training's train.log on the instance."""
    import shlex

    from orchestrator.instances.lifecycle import check_name
    from playbooks import host
    from playbooks import runs as run_tasks

    check_name(name)
    if not 1 <= lines <= 100_000:
        raise UsageError(f"--lines must be between 1 and 100000, not {lines}")
    orch = open_orch()
    try:
        inst = instance_named(orch, name)
    except UsageError:
        if orch.ledger.by_name(name) is None and orch.ledger.job(name) is not None:  # a job's name: its own logs
            raise UsageError(f"{name} is a job, not an instance: `orch jobs logs {name}` shows its log "
                             f"(`-f` follows it to the job's end)") from None
        raise
    run = orch.ledger.latest_run(inst.id)
    if run is None:  # an empty answer would read as "the training printed nothing"
        raise UsageError(f"{name} has no training run, so no log (`orch up {name} --data ...` or `orch run` "
                         "starts one)")
    from orchestrator.tasks.task import held_secrets
    from orchestrator.runs.runs import run_secrets

    hide, missing = held_secrets(run_secrets(run))
    if missing:  # what the command printed may show them, and this process cannot hide them
        raise UsageError(f"{name}'s log may show the secret {', '.join(missing)}, which this orch process does not "
                         "hold to hide: ask again where it is set")
    with orch.connect(inst) as c:
        log = host.workdir(c) + "/train.log"
        if not follow:
            sys.stdout.write(_printable(run_tasks.tail_log(c, lines), hide))
            return
        # tail -F ends with the connection; Ctrl-C leaves the training untouched.
        c.run(f"tail -n {int(lines)} -F {shlex.quote(log)}", hide=False, warn=True, pty=False,
              out_stream=_Hiding(hide) if hide else None)


def _printable(text: str, hide=()) -> str:
    """A log from the instance, without the terminal escapes it may hold (its lines kept), every
    secret in ``hide`` (values) hidden (``text.redact``, before and after the escapes go)."""
    from orchestrator.text import redact

    return "".join((redact(clean(line, 100_000), hide) or "") + "\n" for line in redact(text, hide).splitlines())


class _Hiding:
    """Where ``tail -F`` writes, chunk by chunk: whole lines printed, each through ``_printable``."""

    def __init__(self, hide):
        self.hide, self.part = hide, ""

    def write(self, chunk: str) -> None:
        done, sep, self.part = (self.part + chunk).rpartition("\n")
        if sep:
            sys.stdout.write(_printable(done, self.hide))
            sys.stdout.flush()

    def flush(self) -> None:
        sys.stdout.flush()


@app.command()
def monitor(name: str, port: int = typer.Option(8420, help="Local port (the next free one if taken).")):
    """Forward libreyolo monitor on the instance to 127.0.0.1 on this machine."""
    from orchestrator.instances.lifecycle import check_name
    from playbooks import train

    check_name(name)
    if not 1024 <= port <= 65535:
        raise UsageError(f"--port must be between 1024 and 65535, not {port}")
    orch = open_orch()
    inst = instance_named(orch, name)
    run = orch.ledger.latest_run(inst.id)
    if run is None or not run.run_dir:
        raise UsageError(f"{name} has no training run to monitor")
    with orch.connect(inst) as c:
        remote_port = train.start_monitor(c, run.run_dir)
        local = _free_local_port(port)
        with c.forward_local(local_port=local, remote_port=remote_port, remote_host="127.0.0.1",
                             local_host="127.0.0.1"):
            print(f"libreyolo monitor for {name}: http://127.0.0.1:{local}/  (Ctrl-C to stop forwarding)", flush=True)
            try:
                while True:
                    par.nap(1)
            except KeyboardInterrupt:
                pass


def _free_local_port(start: int) -> int:
    import socket

    for p in range(start, min(start + 20, 65536)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise OrchError(f"no free local port in {start}-{start + 19}")

