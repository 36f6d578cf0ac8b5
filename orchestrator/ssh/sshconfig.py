"""SSH the way every tool expects: ``$ORCH_HOME/ssh_config``, one ``Host orch-NAME`` per instance.

Each entry carries the endpoint, the user, orch's own key, and a known-hosts file that orch writes
from the host keys it pinned (``StrictHostKeyChecking yes``), so ``ssh orch-box1``, ``scp``,
``rsync -e ssh`` and VS Code's Remote-SSH check the same key orch checks and nothing else.

``orch ssh-config`` writes the file; from then on it is rewritten from the ledger after every
transition (``instance_event``, registered by ``plugins``), so it follows every up, start, stop and
down, whichever orch process made it. ``install`` adds one ``Include`` line to ``~/.ssh/config``.

Everything written here comes from the ledger, and what a provider or an instance reported is
not trusted: a row whose endpoint, user or key would not be one clean token is left out.
"""

from __future__ import annotations

import base64
import os
import re
import struct
import sys
from datetime import datetime
from pathlib import Path

from orchestrator import config
from orchestrator.ledger import ledger_sql
from orchestrator.errors import OrchError, UsageError
from orchestrator.hookspecs import hookimpl
from orchestrator.ssh.remote import USER, host_id

CONFIG = "ssh_config"
KNOWN_HOSTS = "ssh_known_hosts"  # not orch ssh's known_hosts: that one holds the last instance only
PREFIX = "orch-"
MARK = "# orch's instances as orch-NAME (`orch ssh-config --uninstall` removes these lines)"

_ALIAS = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # what the ledger takes as a name (lifecycle.check_name)
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,252}")  # a host name, IPv4 or IPv6 address: no option, no space
_WORD = re.compile(r"[A-Za-z0-9_.-]{1,40}")
_KEY = re.compile(r"(?P<type>[a-z0-9][a-z0-9@.-]{0,63}) (?P<blob>[A-Za-z0-9+/]{16,8192}={0,3})")


def path() -> Path:
    return config.home() / CONFIG


def known_hosts_path() -> Path:
    return config.home() / KNOWN_HOSTS


def quoted(value: str) -> str:
    """A value for ssh_config: double-quoted (a path with a space stays one argument), '%' doubled
    (ssh expands %-tokens in IdentityFile and UserKnownHostsFile)."""
    if any(c in value for c in '"\n\r') or not value.isprintable():
        raise OrchError(f"cannot write {value!r} into an ssh config (a quote or a control character)")
    return '"' + value.replace("%", "%%") + '"'


def host_key(line: str | None) -> str | None:
    """'TYPE BASE64' when ``line`` is a well-formed public key whose blob says the same type."""
    m = _KEY.fullmatch(" ".join((line or "").split()[:2]))
    if not m:
        return None
    try:
        blob = base64.b64decode(m["blob"], validate=True)
        (n,) = struct.unpack(">I", blob[:4])
        ok = blob[4:4 + n].decode("ascii") == m["type"]
    except (ValueError, struct.error, UnicodeDecodeError):
        return None
    return m.group(0) if ok else None


def entry(row: dict) -> tuple[str, str] | None:
    """(the Host block, its known-hosts line) for one ledger row; None when it has no endpoint or
    no pinned key yet, or when anything in it is not a clean token."""
    name, hostname, port, user = row.get("name"), row.get("ssh_host"), row.get("ssh_port"), row.get("ssh_user") or "root"
    key = host_key(row.get("host_key"))
    if not (isinstance(name, str) and _ALIAS.fullmatch(name) and isinstance(hostname, str) and _HOST.fullmatch(hostname)
            and isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
            and isinstance(user, str) and USER.fullmatch(user) and key):
        return None
    return (f"Host {PREFIX}{name}\n"
            f"    HostName {hostname}\n"
            f"    Port {port}\n"
            f"    User {user}\n"
            f"    IdentityFile {quoted(str(config.key_path()))}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {quoted(str(known_hosts_path()))}\n"
            f"    StrictHostKeyChecking yes\n",
            f"{host_id(hostname, port)} {key}\n")


def _word(value) -> str:
    """A ledger value for the comment above a Host block: one plain word, else '?'. The ledger may be
    shared (PostgreSQL) and anyone who can write it must not add a line (a ``Host *`` with a
    ``ProxyCommand``) to a file every member's ssh reads."""
    return value if isinstance(value, str) and _WORD.fullmatch(value) else "?"


def render(rows: list[dict]) -> tuple[str, str, list[str]]:
    """(ssh_config text, known-hosts text, names left out) for the ledger's live rows."""
    blocks, known, skipped = [], [], []
    for row in rows:
        made = entry(row)
        if made is None:
            if row.get("ssh_host") and row.get("host_key"):
                skipped.append(str(row.get("name"))[:40])  # an endpoint and a key, but not clean ones
            continue
        blocks.append(f"# {row['name']}: {_word(row.get('state'))} on {_word(row.get('provider'))}\n{made[0]}")
        known.append(made[1])
    head = ("# Written by orch from its ledger after every transition: edits here are lost.\n"
            "# `orch ssh-config` prints this file's path; `orch ssh-config --install` includes it in ~/.ssh/config.\n")
    text = head + "".join("\n" + b for b in blocks)
    # Every line is one orch wrote: a comment, a blank, a Host line or one of its eight options.
    odd = [line for line in text.splitlines() if line and not line.startswith(("# ", "Host " + PREFIX, "    "))]
    if odd or len(text.splitlines()) != 2 + 10 * len(blocks) or len(known) != sum(k.count("\n") for k in known):
        raise OrchError(f"refusing to write {path()}: a ledger value would add a line of its own")
    return text, "".join(known), skipped


def write() -> tuple[Path, list[str], list[str]]:
    """Rewrite both files from the ledger; returns (the config's path, hosts written, names left out).
    Under a lock, so of two orch processes the one that read the ledger last writes last."""
    import fcntl

    home = config.home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = os.open(home / ".ssh_config.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = ledger_sql.live(("name", "state", "provider", "ssh_host", "ssh_port", "ssh_user", "host_key"))
        text, known, skipped = render(rows)
        _replace(known_hosts_path(), known)  # the keys first: a host is never listed before its key
        _replace(path(), text)
    finally:
        os.close(lock)
    hosts = [line.split()[1] for line in text.splitlines() if line.startswith("Host ")]
    return path(), hosts, skipped


def _replace(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, target)


@hookimpl
def instance_event(instance, event):
    """Keep the file current once the user has asked for it (it exists): a transition has just
    moved an instance. A failure here is one line and never the command's failure."""
    if not path().exists():
        return
    try:
        write()
    except Exception as e:  # noqa: BLE001 - the transition is recorded; only this file is stale
        print(f"orch: warning: could not refresh {path()}: {' '.join(str(e).split())[:200]}", file=sys.stderr)


# -- ~/.ssh/config -------------------------------------------------------------------------------
def user_config() -> Path:
    return Path.home() / ".ssh" / "config"


def include_line() -> str:
    return f"Include {quoted(str(path()))}"


def includable() -> None:
    """ssh expands glob characters in an Include path and reads no '%' token there: a path with
    them would name other files, or none, so it is refused rather than written."""
    where = str(path())
    if any(c in where for c in "*?[%"):
        raise UsageError(f"cannot include {where} in ~/.ssh/config: ssh reads '*?[%' there as patterns or text "
                        "(set ORCH_HOME to a path without them, or use ssh -F)")


def install() -> tuple[bool, Path | None]:
    """Put the Include line at the top of ~/.ssh/config (top: an Include after a ``Host`` line
    would apply to that host only). Returns (changed, the backup made)."""
    includable()
    cfg = user_config()
    old = _read(cfg)
    if include_line() in (line.strip() for line in old.splitlines()):
        return False, None
    backup = _backup(cfg, old)
    _write_user(cfg, f"{MARK}\n{include_line()}\n\n{old}")
    return True, backup


def uninstall() -> tuple[bool, Path | None, list[str]]:
    """Take out what ``install`` added for this ORCH_HOME (the mark, its Include line, the blank line
    after them). Returns (changed, the backup made, the Include lines of other ORCH_HOMEs, left as
    they are: each is taken out by ``--uninstall`` under its own home)."""
    cfg = user_config()
    old = _read(cfg)
    lines = old.splitlines(keepends=True)
    mine = include_line()
    keep, others, dropped, i = [], [], False, 0
    while i < len(lines):
        line = lines[i].strip()
        after = lines[i + 1].strip() if i + 1 < len(lines) else None
        if line == MARK and after == mine:
            i += 2
        elif line == mine:
            i += 1
        else:
            if line == MARK and after and after.startswith("Include "):
                others.append(after)
            keep.append(lines[i])
            i += 1
            continue
        dropped = True
        if i < len(lines) and not lines[i].strip():
            i += 1  # the blank line install put after them
    if not dropped:
        return False, None, others
    backup = _backup(cfg, old)
    _write_user(cfg, "".join(keep))
    return True, backup, others


def pw_home_differs() -> str | None:
    """ssh reads ~/.ssh/config from the password database's home, not from $HOME: say so when they differ."""
    import pwd

    try:
        pw_dir = Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return None
    if pw_dir.resolve() == Path.home().resolve():
        return None
    return f"HOME is {Path.home()} but ssh reads {pw_dir}/.ssh/config (the account's home)"


def _read(cfg: Path) -> str:
    try:
        return cfg.read_text()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as e:
        raise OrchError(f"cannot read {cfg}: {e}") from None


def _backup(cfg: Path, old: str) -> Path | None:
    if not cfg.exists():
        return None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(100):  # never over an earlier backup (an install and an uninstall in the same second)
        backup = cfg.with_name(f"{cfg.name}.orch-backup-{stamp}" + (f"-{n}" if n else ""))
        try:
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise OrchError(f"too many backups of {cfg} this second")
    with os.fdopen(fd, "w") as f:
        f.write(old)
    return backup


def _write_user(cfg: Path, text: str) -> None:
    """Atomically, keeping the file's mode; through a link (dotfile managers link ~/.ssh/config)."""
    target = cfg.resolve() if cfg.is_symlink() else cfg
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
    tmp = target.with_name(f".{target.name}.orch-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, target)
