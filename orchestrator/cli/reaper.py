"""reap, reaper install/uninstall/status, cost, protect, unprotect: the commands that stop the bill."""

from __future__ import annotations

import time
from typing import Optional

import typer

from orchestrator.cli.app import app, console, emit_json, instance_named, open_orch, say
from orchestrator.errors import UsageError

reaper_app = typer.Typer(help="Run `orch reap` on a schedule that outlives this shell.", no_args_is_help=True)
app.add_typer(reaper_app, name="reaper")


@app.command()
def reap(
    dry_run: bool = typer.Option(False, "--dry-run", help="Decide and show, change nothing."),
    as_json: bool = typer.Option(False, "--json", help="The decisions as JSON."),
    watch: bool = typer.Option(False, "--watch", help="Run a pass every --interval seconds until interrupted."),
    interval: float = typer.Option(60.0, help="Seconds between passes with --watch."),
    force: bool = typer.Option(False, "--force", help="Destroy even where the weights could not be pulled."),
    parallel: Optional[int] = typer.Option(None, "--parallel", help="Instances looked at over SSH at once "
                                           "(default: reaper_parallel in config.toml, else 8)."),
):
    """Stop or destroy what is idle, past its deadline, or stopped past its break-even (one pass)."""
    from orchestrator.reaper import duty, reaper
    from orchestrator.parallel import MAX_BOUND

    if not 1 <= interval <= 86400:
        raise UsageError(f"--interval must be between 1 and 86400 seconds, not {interval:g}")
    if parallel is not None and not 1 <= parallel <= MAX_BOUND:
        raise UsageError(f"--parallel must be between 1 and {MAX_BOUND}, not {parallel}")
    orch = open_orch(actor=reaper.ACTOR, lazy=True)  # a pass that changes nothing opens no SQLAlchemy
    while True:
        t0, started = time.monotonic(), reaper.utcnow()
        outcomes, advanced = duty.one_pass(orch, dry_run=dry_run, force=force, parallel=parallel)
        if watch and not as_json:
            console().print(f"[dim]{started:%Y-%m-%d %H:%M:%SZ} pass ({time.monotonic() - t0:.1f} s)[/]")
        duty.show_pass(outcomes, advanced, dry_run, as_json)
        if not watch:
            return
        # An instance whose idle time runs out before the next pass gets a pass right then.
        pause = interval - (time.monotonic() - t0)
        wake = [o.wake_in for o in outcomes if o.wake_in is not None]
        if wake:
            pause = min(pause, min(wake) + 0.5)
        time.sleep(max(pause, 0.5))


@reaper_app.command("install")
def reaper_install(every: str = typer.Option("5m", help="How often: 5m, 90s, 1h."),
                   backend: str = typer.Option("auto", help="auto, systemd, cron or loop.")):
    """Install the schedule (a systemd user timer, else a crontab entry, else a detached loop)."""
    from orchestrator.reaper import reaper_timer

    seconds = reaper_timer.parse_every(every)  # both checked before anything is opened
    if backend != "auto" and backend not in reaper_timer.BACKENDS:
        raise UsageError(f"--backend must be auto or one of {', '.join(reaper_timer.BACKENDS)}, not {backend!r}")
    orch = open_orch()
    info = reaper_timer.install(orch.ledger, orch.home, seconds, backend)
    c = console()
    c.print(f"reaper installed ({info['backend']}): `{info['command']}` every {info['every']} s")
    c.print(f"  environment  {info['env_file']} (0600): {', '.join(info['carried'])}")
    c.print(f"  note         {info['note']}")


@reaper_app.command("uninstall")
def reaper_uninstall():
    """Remove the schedule."""
    from orchestrator.reaper import reaper_timer

    info = reaper_timer.uninstall(open_orch().ledger)
    console().print(f"reaper schedule removed ({info['backend']})" if info else "no reaper schedule was installed")


@reaper_app.command("status")
def reaper_status(as_json: bool = typer.Option(False, "--json", help="As JSON.")):
    """Whether the schedule is installed and running, and what the last pass did."""
    from orchestrator.reaper import reaper_timer

    from rich.markup import escape

    st = reaper_timer.status(open_orch().ledger)
    if as_json:
        emit_json(st)
        return
    c = console()
    if st["installed"]:
        c.print(f"schedule   {st['backend']}, every {st['every']} s, "
                f"{'running' if st['running'] else '[red]NOT running[/]'} (installed {st['installed_at'][:19]}Z)")
    else:
        c.print("schedule   not installed (`orch reaper install`)")
    last = st["last_pass"]
    if not last:
        c.print("last pass  never")
        return
    acted = [o for o in last["outcomes"] if o["acted"]]
    c.print(f"last pass  {last['at'][:19]}Z, {last['seconds']:.1f} s, {len(last['outcomes'])} instance(s), "
            f"{len(acted)} acted on")
    for o in last["outcomes"]:
        c.print(f"  {o['name']:<16} {o['action']:<8} {escape(o['reason'])}")


@app.command()
def cost(name: Optional[str] = typer.Argument(None, help="One instance (every one of that name)."),
         since: Optional[str] = typer.Option(None, help="From this date (2026-07-31), time, or span back (7d)."),
         as_json: bool = typer.Option(False, "--json", help="As JSON.")):
    """What each instance cost: running and stopped time at the price paid at launch, and idle waste."""
    from orchestrator.money import cost as costs

    start = costs.parse_since(since) if since else None  # checked before anything is opened
    if name is not None:
        from orchestrator.instances.lifecycle import check_name

        check_name(name)
    from orchestrator.money import budget

    budget.show_cost(open_orch(lazy=True).ledger, name, start, as_json)  # read whole: SQLAlchemy only where SQLite cannot answer


def _set_protected(name: str, on: bool) -> None:
    from orchestrator import states
    from orchestrator.instances import watchdog
    from orchestrator.instances.lifecycle import check_name

    check_name(name)  # before anything is opened: a refusal creates no ledger
    orch = open_orch()
    inst = instance_named(orch, name)
    if inst.protected == on:
        console().print(f"{name} is already {'protected' if on else 'unprotected'}")
        return
    inst = orch.ledger.update(inst.id, protected=on)
    orch.ledger.note(inst.id, "protected: the reaper and the watchdog only report" if on else
                     "unprotected: the reaper and the watchdog act on it again", orch.actor)
    told = inst.state == states.READY and watchdog.enabled() and watchdog.arm(orch, inst)
    if inst.state == states.READY and watchdog.enabled() and not told:
        say(f"orch: warning: the watchdog on {name} could not be told; it keeps its last policy")
    console().print(f"{name}: {'protected' if on else 'unprotected'}" + (" (watchdog told)" if told else ""))


@app.command()
def protect(name: str):
    """Never let the reaper or the watchdog stop or destroy this instance (they still report)."""
    _set_protected(name, True)


@app.command()
def unprotect(name: str):
    """Let the reaper and the watchdog act on this instance again."""
    _set_protected(name, False)
