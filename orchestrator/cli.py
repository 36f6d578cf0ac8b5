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


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


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
    disk: Optional[int] = typer.Option(None, help="Disk in GB (default: sized from the data, else 20)."),
    image: Optional[str] = typer.Option(None, help="Container image, where the provider uses one."),
    spot: bool = typer.Option(False, "--spot", help="Spot / interruptible instance."),
    bid: Optional[float] = typer.Option(None, help="Spot bid in $/hr per GPU (default: live minimum + margin)."),
    offer: Optional[str] = typer.Option(None, help="A provider offer id picked by hand."),
    ssh_timeout: Optional[float] = typer.Option(None, help="Minutes to wait for SSH (default 20)."),
    as_json: bool = typer.Option(False, "--json", help="Print the instance as JSON."),
):
    """Rent an instance, provision it over SSH, and prove the device works."""
    from orchestrator import config
    from orchestrator.provider import Request

    provider = provider or config.get("default_provider", "local")
    request = Request(name=name, gpu=gpu, gpus=gpus, cpu=cpu, disk_gb=disk if disk is not None else 20,
                      image=image, spot=spot, bid=bid, offer=offer)
    orch = _orch()
    inst = orch.up(name, provider, request, ssh_timeout=ssh_timeout * 60 if ssh_timeout else None)
    _summary(inst, as_json)


def _summary(inst, as_json: bool) -> None:
    from orchestrator.views import model_dict

    if as_json:
        _emit_json(model_dict(inst))
        return
    c = _console()
    c.print(f"[bold]{inst.name}[/] on {inst.provider}: [green]{inst.state}[/]")
    c.print(f"  device   {inst.device or '-'}")
    c.print(f"  price    ${inst.price_hr:.4f}/hr running, ${inst.stopped_price_hr:.4f}/hr stopped")
    c.print(f"  ssh      orch ssh {inst.name}")


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="One instance (shows its training run too)."),
    all_: bool = typer.Option(False, "--all", "-a", help="Include destroyed, failed and lost instances."),
    as_json: bool = typer.Option(False, "--json", help="Stable JSON output (see README)."),
):
    """The fleet from the ledger, or one instance in detail."""
    if name is None:
        rows = _fast_rows(all_)
        if rows is None:
            from orchestrator.views import model_dict

            orch = _orch()
            rows = [model_dict(i) for i in orch.ledger.instances(live_only=not all_)]
        if as_json:
            _emit_json(rows)
        else:
            _fleet_table(rows)
        return
    from orchestrator.views import iso, model_dict

    orch = _orch()
    inst = orch.ledger.by_name(name, live_only=False)
    if inst is None:
        raise UsageError(f"no instance named {name!r}")
    inst = orch.refresh(inst)
    data = model_dict(inst)
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
    for e in data["events"][-6:]:
        c.print(f"  {e['at']}  {e['from'] or '-':>12} -> {e['to']:<12} {e['actor']:<8} {e['reason']}")


def _fast_rows(include_ended: bool):
    from migrations import HEAD
    from orchestrator import config
    from orchestrator.views import fast_list

    if config.get("database_url"):
        return None
    return fast_list(config.home() / "ledger.db", HEAD, include_ended)


def _fleet_table(rows) -> None:
    from rich.table import Table

    from orchestrator.views import age

    if not rows:
        _console().print("no instances (start one with `orch up NAME`)")
        return
    t = Table(box=None, pad_edge=False)
    for col in ("NAME", "PROVIDER", "STATE", "GPU", "$/HR", "SSH", "AGE"):
        t.add_column(col)
    for r in rows:
        gpu = "cpu" if r["cpu_only"] else f"{r['gpus']}x {r['gpu_name'] or r['gpu'] or '?'}"
        t.add_row(r["name"], r["provider"], r["state"], gpu, f"{r['price_hr']:.3f}", r["ssh"] or "-",
                  age(r["created_at"]))
    _console().print(t)


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
def down(name: str):
    """Destroy the instance and everything on it; billing ends."""
    orch = _orch()
    inst = orch.down(orch.instance(name))
    _console().print(f"{inst.name}: {inst.state}")


@db_app.command("upgrade")
def db_upgrade():
    """Apply the ledger's migrations (also done automatically on first use)."""
    from orchestrator import config
    from orchestrator.ledger import Ledger, database_url

    ledger = Ledger(os.environ.get("ORCH_DATABASE_URL") or config.get("database_url")
                    or database_url(config.home()), upgrade=False)
    ledger.upgrade()
    _console().print(f"ledger at revision {ledger.revision()}")


def main() -> None:
    try:
        app(standalone_mode=False)
    except OrchError as e:
        print(f"orch: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("orch: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # click's usage errors and our bugs alike get one line
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        if os.environ.get("ORCH_DEBUG"):
            raise
        print(f"orch: internal error: {type(e).__name__}: {e} (ORCH_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(1)
