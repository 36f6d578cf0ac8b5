"""The ``orch`` command. Heavy modules (SQLAlchemy, Fabric, provider SDKs) load inside commands."""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional

import typer

from orchestrator.errors import OrchError, UsageError

app = typer.Typer(help="Rent GPUs, train on them, bring the weights home, never leave a machine billing.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
db_app = typer.Typer(help="The ledger's database.", no_args_is_help=True)
app.add_typer(db_app, name="db")
data_app = typer.Typer(help="Datasets: stage them where every provider can fetch them fast.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _orch(actor: str = "cli"):
    from orchestrator.lifecycle import Orch

    return Orch.open(actor=actor, say=_say)


def _emit_json(data) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


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
    as_json: bool = typer.Option(False, "--json", help="Print the instance as JSON."),
):
    """Rent an instance, provision it, prove the device works, and (with --data) start training."""
    from orchestrator import config, training
    from orchestrator.provider import Request

    from orchestrator import policy as policies

    policy = policies.from_flags(idle_minutes=idle_minutes, max_hours=max_hours, on_idle=on_idle,
                                 rebuild_cost=rebuild_cost)
    if ssh_timeout is not None and not 0 < ssh_timeout <= 24 * 60:
        raise UsageError(f"--ssh-timeout must be minutes above 0 and at most 1440, not {ssh_timeout}")
    spec = None
    if data or resume:
        if not data:
            raise UsageError("--resume needs --data (the dataset the run trains on)")
        spec = training.TrainSpec(data=data, model=model, epochs=epochs, imgsz=imgsz, batch=batch,
                                  save_period=save_period, train_args=training.parse_train_args(train_arg or []),
                                  push_to=push_to, resume=resume)
        training.check_spec(spec)
    orch = _orch()
    existing = orch.ledger.by_name(name)
    if resume and existing is not None:
        if existing.state != "ready":
            raise UsageError(f"{name} is {existing.state}: `orch start {name}` first")
        training.prepare(spec, orch.home, _say)
        run = training.launch(orch, existing, spec)
        _after_launch(orch, existing, run, wait, as_json)
        return
    if spec is not None:
        training.prepare(spec, orch.home, _say)
        if disk is None:
            disk, why = training.disk_for(spec)
            _say(f"      disk: {why}")
    request = Request(name=name, gpu=gpu, gpus=gpus, cpu=cpu, disk_gb=disk if disk is not None else 20,
                      image=image, spot=spot, bid=bid, offer=offer)
    if cheapest:
        from orchestrator import offers

        provider, request = offers.pick_cheapest(orch, request, spec, providers=[provider] if provider else None)
    provider = config.get("default_provider", "local") if provider is None else provider
    holder = {}

    def start_training(inst):
        holder["run"] = training.launch(orch, inst, spec)

    inst = orch.up(name, provider, request, ssh_timeout=ssh_timeout * 60 if ssh_timeout else None,
                   policy=policy, after_verify=start_training if spec else None)
    if spec is None:
        _summary(inst, as_json)
        return
    _after_launch(orch, inst, holder["run"], wait, as_json)


def _after_launch(orch, inst, run, wait: bool, as_json: bool) -> None:
    from orchestrator import training

    view = training.follow(orch, inst, run) if wait else None
    if view:
        got, where = training.pull(orch, inst, run, view=view)
        _say(f"      weights and run files in {where}")
    _summary(inst, as_json, run=orch.ledger.update_run(run.id), view=view)


def _summary(inst, as_json: bool, run=None, view=None) -> None:
    from orchestrator.views import model_dict, run_dict

    data = model_dict(inst)
    if run is not None:
        data["run"] = run_dict(run, view)
    if as_json:
        _emit_json(data)
        return
    c = _console()
    c.print(f"[bold]{inst.name}[/] on {inst.provider}: [green]{inst.state}[/]")
    c.print(f"  device   {inst.device or '-'}")
    c.print(f"  price    ${inst.price_hr:.4f}/hr running, ${inst.stopped_price_hr:.4f}/hr stopped")
    c.print(f"  ssh      orch ssh {inst.name}")
    if run is not None:
        r = data["run"]
        c.print(f"  run      {r['model']} {r['state']} {r.get('progress') or ''}  ({r['run_dir']})")
        c.print(f"  watch    orch status {inst.name} | orch logs {inst.name} -f | orch monitor {inst.name}")


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="One instance (shows its training run too)."),
    all_: bool = typer.Option(False, "--all", "-a", help="Include destroyed, failed and lost instances."),
    as_json: bool = typer.Option(False, "--json", help="Stable JSON output (see README)."),
):
    """The fleet from the ledger, or one instance in detail."""
    if name is None:
        from orchestrator import fleet

        fleet.show(all_, as_json)
        return
    from orchestrator.views import iso, model_dict

    orch = _orch()
    inst = orch.ledger.by_name(name, live_only=False)
    if inst is None:
        raise UsageError(f"no instance named {name!r}")
    from orchestrator import reaper

    inst = reaper.observe(orch, inst)  # Orch.refresh, plus what the instance's watchdog did
    data = model_dict(inst)
    run = orch.ledger.latest_run(inst.id)
    if run is not None:
        data["run"] = _run_view(orch, inst, run)
    data["events"] = [{"at": iso(e.at), "from": e.from_state, "to": e.to_state,
                       "reason": e.reason, "actor": e.actor} for e in orch.ledger.events(inst.id)]
    if as_json:
        _emit_json(data)
        return
    c = _console()
    c.print(f"[bold]{inst.name}[/] ({inst.id}) on {inst.provider} {inst.provider_id or ''}: [bold]{inst.state}[/]")
    for key in ("gpu_name", "device", "ssh", "price_hr", "stopped_price_hr", "disk_gb"):
        if data.get(key) not in (None, ""):
            c.print(f"  {key:<17}{data[key]}")
    if run is not None:
        r = data["run"]
        c.print(f"  run              {r['model']} {r.get('progress') or r['state']}")
        c.print(f"  run_dir          {r['run_dir']}")
        if r.get("error"):
            c.print(f"  error            {r['error']}")
    for e in data["events"][-6:]:
        c.print(f"  {e['at']}  {e['from'] or '-':>12} -> {e['to']:<12} {e['actor']:<8} {e['reason']}")


def _run_view(orch, inst, run) -> dict:
    """The run from status.json when the instance is up (pulling new milestones), else the ledger's."""
    from orchestrator import training
    from orchestrator.errors import HostKeyMismatch, SSHError
    from orchestrator.views import run_dict

    if inst.state != "ready" or not run.run_dir:
        return run_dict(run)
    try:
        view = training.read(orch, inst, run)
        got, where = training.pull(orch, inst, run, view=view, only_milestones=True)
        if got:
            _say(f"pulled {', '.join(got)} to {where}")
    except HostKeyMismatch:
        raise  # possible interception: a refusal, never a mere warning
    except SSHError as e:
        _say(f"orch: warning: could not read the run on {inst.name}: {e}")
        return run_dict(run)
    return run_dict(orch.ledger.update_run(run.id), view)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(name: str = typer.Argument(...), command: Optional[List[str]] = typer.Argument(None)):
    """Open a shell on the instance, or run ``orch ssh NAME -- CMD ...``."""
    from orchestrator import config, remote

    orch = _orch()
    inst = orch.instance(name)
    if not inst.ssh_host or not inst.host_key:
        raise UsageError(f"{name} has no SSH endpoint yet ({inst.state})")
    known = orch.home / "known_hosts"
    known.write_text(f"{remote.host_id(inst.ssh_host, inst.ssh_port)} {inst.host_key}\n")
    os.chmod(known, 0o600)
    key, _ = config.ssh_key()
    argv = ["ssh", "-i", str(key), "-p", str(inst.ssh_port), "-o", f"UserKnownHostsFile={known}",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
            f"{inst.ssh_user or 'root'}@{inst.ssh_host}"]
    if command:
        argv += ["--", *command]
    sys.stdout.flush()
    os.execvp("ssh", argv)


@app.command()
def stop(name: str):
    """Stop the instance: compute stops billing, the disk is kept (and may still bill)."""
    orch = _orch()
    inst = orch.stop(orch.instance(name))
    _console().print(f"{inst.name}: {inst.state} (disk kept, ${inst.stopped_price_hr:.4f}/hr while stopped)")


@app.command()
def start(name: str):
    """Start a stopped instance on the same disk."""
    orch = _orch()
    inst = orch.start(orch.instance(name))
    _console().print(f"{inst.name}: {inst.state} at {inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port}")


@app.command()
def down(name: str, no_pull: bool = typer.Option(False, "--no-pull", help="Destroy without pulling the weights first.")):
    """Pull the weights, then destroy the instance and everything on it; billing ends."""
    orch = _orch()
    inst = orch.instance(name)
    run = orch.ledger.latest_run(inst.id)
    if run is not None and run.run_dir and not no_pull:
        _pull_or_refuse(orch, inst, run)
    inst = orch.down(inst)
    _console().print(f"{inst.name}: {inst.state}")


def _pull_or_refuse(orch, inst, run) -> None:
    from orchestrator import training

    if inst.state != "ready":
        if run.pulled_at is None:
            raise OrchError(f"{inst.name} is {inst.state} and its weights were never pulled: "
                            f"`orch start {inst.name}` first, or `orch down {inst.name} --no-pull` to lose them")
        return
    try:
        got, where = training.pull(orch, inst, run)
    except OrchError as e:
        raise OrchError(f"could not pull the weights of {inst.name} ({e}); not destroying it. "
                        f"Use --no-pull to destroy anyway") from None
    _say(f"pulled {len(got)} new file(s) to {where}")


@app.command()
def pull(name: str, dest: Optional[str] = typer.Option(None, help="Where to put the files (default $ORCH_HOME/runs/NAME).")):
    """Bring the run's weights and files home (only what changed)."""
    from pathlib import Path

    from orchestrator import training

    orch = _orch()
    inst = orch.instance(name)
    run = orch.ledger.latest_run(inst.id)
    if run is None or not run.run_dir:
        raise UsageError(f"{name} has no training run")
    got, where = training.pull(orch, inst, run, dest=Path(dest) if dest else None)
    _console().print(f"{len(got)} file(s) pulled to {where}" + (f": {', '.join(got)}" if got else " (all up to date)"))


@app.command()
def logs(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
         lines: int = typer.Option(50, "--lines", "-n", help="How many lines from the end.")):
    """Tail the training's train.log on the instance."""
    from playbooks import train

    orch = _orch()
    inst = orch.instance(name)
    with orch.connect(inst) as c:
        log = train.workdir(c) + "/train.log"
        if not follow:
            sys.stdout.write(train.tail_log(c, lines))
            return
        # tail -F ends with the connection; Ctrl-C leaves the training untouched.
        c.run(f"tail -n {int(lines)} -F {log}", hide=False, warn=True, pty=False)


@app.command()
def monitor(name: str, port: int = typer.Option(8420, help="Local port (the next free one if taken).")):
    """Forward ``libreyolo monitor`` on the instance to 127.0.0.1 on this machine."""
    import time

    from playbooks import train

    orch = _orch()
    inst = orch.instance(name)
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
                    time.sleep(1)
            except KeyboardInterrupt:
                pass


def _free_local_port(start: int) -> int:
    import socket

    for p in range(start, start + 20):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue
    raise OrchError(f"no free local port in {start}-{start + 19}")


@data_app.command("push")
def data_push(folder: str = typer.Argument(..., help="A YOLO dataset folder with data.yaml."),
              repo: str = typer.Argument(..., help="The Hugging Face dataset repo, ORG/REPO.")):
    """Pack a dataset as one tar and upload it to a Hugging Face dataset repo (HF_TOKEN from the environment)."""
    from pathlib import Path

    from orchestrator import hub

    uri = hub.push_dataset(Path(folder).expanduser(), repo, token=os.environ.get("HF_TOKEN"))
    _console().print(f"pushed: train from it with `orch up NAME --data {uri}`")
    print(uri)


@app.command()
def demo(epochs: int = typer.Option(3, help="Epochs of the tiny CPU training."),
         keep: bool = typer.Option(False, "--keep", help="Leave the instance up instead of destroying it.")):
    """The whole job on this machine: synthetic data, a local instance, a real CPU training, weights home."""
    import secrets
    import time

    from orchestrator import dataset, training
    from orchestrator.provider import Request

    orch = _orch()
    t0 = time.monotonic()
    data = dataset.synth(orch.home / "demo" / "data", n_train=16, n_val=8, imgsz=64)
    _say(f"demo dataset: {data} (synthetic, 24 images, 2 classes)")
    spec = training.prepare(training.TrainSpec(data=str(data), model="yolo9-t", epochs=epochs, imgsz=64, batch=4,
                                               train_args={"workers": "0"}), orch.home, _say)
    name = f"demo-{secrets.token_hex(2)}"
    holder = {}
    inst = orch.up(name, "local", Request(name=name, cpu=True, disk_gb=training.disk_for(spec)[0]),
                   after_verify=lambda i: holder.update(run=training.launch(orch, i, spec)))
    run = holder["run"]
    view = training.follow(orch, inst, run)
    got, where = training.pull(orch, inst, run, view=view)
    if not keep:
        inst = orch.down(inst, "demo finished")
    c = _console()
    c.print(f"[bold]demo {view['state']}[/] in {time.monotonic() - t0:.0f} s: {inst.name} on local is {inst.state}")
    c.print(f"  trained  yolo9-t, {view.get('completed_epochs') or view.get('epoch')}/{view['epochs']} epochs on the CPU, "
            f"final loss {view['loss']:.4f}" if view.get("loss") is not None else "  trained  -")
    c.print(f"  weights  {where / 'weights' / 'best.pt'}")
    c.print(f"  ledger   orch status {inst.name}")
    if view["state"] != "completed":
        raise OrchError(f"the demo training ended {view['state']}: see {where / 'train.log'}")


@db_app.command("upgrade")
def db_upgrade():
    """Apply the ledger's migrations (also done automatically on first use)."""
    from orchestrator import config
    from orchestrator.ledger import Ledger, database_url

    ledger = Ledger(os.environ.get("ORCH_DATABASE_URL") or config.get("database_url")
                    or database_url(config.home()), upgrade=False)
    ledger.upgrade()
    _console().print(f"ledger at revision {ledger.revision()}")


# Commands that live beside the features they drive (each imports its heavy parts lazily).
from orchestrator import cli_ops  # noqa: E402,F401  reap, reaper, cost, protect, unprotect
from orchestrator import cli_offers  # noqa: E402,F401  offers, trial
from orchestrator import cli_reconcile  # noqa: E402,F401  reconcile


def _one_line(text: str) -> str:
    """An error as one line: a newline or a control character from the user's input is shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.strip())


def main() -> None:
    try:
        app(standalone_mode=False)
    except OrchError as e:
        print(f"orch: error: {_one_line(str(e))}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("orch: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # usage errors and our bugs alike get one line
        if isinstance(e, typer.TyperException):  # Typer's own click: bad option values, unknown options
            print(f"orch: error: {_one_line(e.format_message().replace(chr(10), ' '))}", file=sys.stderr)
            sys.exit(e.exit_code)
        if isinstance(e, typer.Abort):
            sys.exit(1)
        if os.environ.get("ORCH_DEBUG"):
            raise
        print(f"orch: internal error: {type(e).__name__}: {e} (ORCH_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(1)
