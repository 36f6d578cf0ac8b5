"""``orch ssh-config``: an ssh_config of orch's instances, for ssh, scp, rsync and VS Code."""

from __future__ import annotations

import shlex

import typer

from orchestrator.cli.app import app, open_orch, out, say
from orchestrator.errors import UsageError
from orchestrator.text import clean


@app.command("ssh-config")
def ssh_config(
    install: bool = typer.Option(False, "--install", help="Also add one Include line to ~/.ssh/config "
                                                          "(a backup is kept), so plain `ssh orch-NAME` works."),
    uninstall: bool = typer.Option(False, "--uninstall", help="Remove that Include line, and stop keeping the "
                                                              "file current."),
):
    """Write an ssh_config with a Host orch-NAME entry per instance (pinned host keys) and print its
    path; orch keeps it current on every up, start, stop and down."""
    from orchestrator.ssh import sshconfig

    if install and uninstall:
        raise UsageError("--install and --uninstall exclude each other")
    if uninstall:
        changed, backup, others = sshconfig.uninstall()
        for f in (sshconfig.path(), sshconfig.known_hosts_path()):
            f.unlink(missing_ok=True)
        say(f"removed the Include line from {sshconfig.user_config()} (backup: {backup})" if changed else
            f"{sshconfig.user_config()} has no Include line of this ORCH_HOME's")
        for line in others:
            say(f"left `{clean(line)}` in {sshconfig.user_config()}: another ORCH_HOME's (`orch ssh-config "
                "--uninstall` with that ORCH_HOME takes it out)")
        say(f"removed {sshconfig.path()}: orch no longer keeps an ssh_config")
        return
    if install:
        sshconfig.includable()  # before anything is written
    open_orch()  # the ledger at its schema (made or migrated) before it is read
    path, hosts, skipped = sshconfig.write()
    out(str(path))
    if skipped:
        say(f"orch: warning: left out (an endpoint or host key orch will not write into a config): "
            f"{', '.join(skipped)}")
    say(f"{len(hosts)} host(s): {', '.join(hosts) or '-'}" if hosts else
        "no instance with an SSH endpoint yet: entries appear as instances come up")
    if install:
        changed, backup = sshconfig.install()
        if changed:
            say(f"added `{sshconfig.include_line()}` to {sshconfig.user_config()}"
                + (f" (backup: {backup})" if backup else ""))
        else:
            say(f"{sshconfig.user_config()} already includes it")
        note = sshconfig.pw_home_differs()
        if note:
            say(f"orch: note: {note}")
    else:
        say(f"use: ssh -F {shlex.quote(str(path))} orch-NAME, or `orch ssh-config --install` for plain `ssh orch-NAME`")
