"""``orch ssh NAME [-- CMD ...]``: ssh itself, trusting only the host key the ledger pinned.

Both ways in build ssh's command line here. The full CLI (Typer, SQLAlchemy, the ledger's models)
costs seconds before ssh starts: 3 to 7 s on a busy 2-core machine, most of `orch ssh NAME --
true`. So ``fast`` answers the plain forms with the standard library alone: the row read with
``ledger_sql``, orch's key, ssh exec'd. Whatever it cannot settle alone (no such name, a key not
pinned yet, another form of the command) it leaves to the full CLI, which says it properly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator import config
from orchestrator.ssh import remote

COLUMNS = ("name", "state", "ssh_host", "ssh_port", "ssh_user", "host_key")


def argv(home: Path, host: str, port: int, user: str | None, host_key: str, command: list[str]) -> list[str]:
    """ssh's argv for one instance; its pinned key written where ssh reads it (0600)."""
    user = remote.check_user(user or "root")  # a user that is not a plain name never reaches ssh
    known = Path(home) / "known_hosts"
    fd = os.open(known, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{remote.host_id(host, port)} {host_key}\n")
    key, _ = config.ssh_key()
    return ["ssh", "-i", str(key), "-p", str(port), "-o", f"UserKnownHostsFile=\"{known}\"",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
            "-l", user, "--", host, *command]


def fast(args: list[str]) -> None:
    """Exec ssh for ``ssh NAME`` or ``ssh NAME -- CMD ...`` when the ledger alone says how; return
    (having done nothing) otherwise."""
    if len(args) < 2 or (len(args) > 2 and args[2] != "--") or args[1].startswith("-"):
        return
    name, command = args[1], args[3:]
    try:
        from orchestrator.ledger import ledger_sql

        home = config.home()
        if not home.is_dir() or config.warnings(home):
            return  # the full CLI says what is wrong with orch's home
        rows = [r for r in ledger_sql.live(COLUMNS) if r["name"] == name]
    except Exception:  # noqa: BLE001 - whatever it was, the full CLI says it properly
        return
    if len(rows) != 1 or not rows[0]["ssh_host"] or not rows[0]["ssh_port"] or not rows[0]["host_key"]:
        return
    row = rows[0]
    try:
        line = argv(home, row["ssh_host"], int(row["ssh_port"]), row["ssh_user"], row["host_key"], command)
    except Exception:  # noqa: BLE001
        return
    sys.stdout.flush()
    os.execvp("ssh", line)
