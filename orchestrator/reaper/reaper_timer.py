"""Run ``orch reap`` on a schedule that outlives the shell: a systemd user timer where a user
systemd answers, else a crontab entry, else (a machine with neither, such as a container
without an init system) a detached ``orch reap --watch`` that does not survive a reboot.

What the scheduled pass needs travels in ``$ORCH_HOME/reaper.env`` (mode 0600): ORCH_HOME, the
database URL and provider keys present in the environment at install time, and PATH; nothing
else (a schedule's secrets are kept apart, for its runs alone: ``schedule_secrets``). Nothing
secret is ever put on a crontab line or in a unit file, which other tools print freely.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.errors import OrchError, UsageError

BACKENDS = ("systemd", "cron", "loop")
# Carried into the scheduled pass when set at install time: where the ledger is, how to reach
# each provider (its key, its API address: each provider's ``env_keys``), and no more.
CARRIED = ("ORCH_HOME", "ORCH_DATABASE_URL", "ORCH_WATCHDOG", "PATH")


def carried() -> tuple[str, ...]:
    from orchestrator.provider import plugins

    keys = [k for cls in plugins.providers().values() for k in getattr(cls, "env_keys", ())]
    return tuple(dict.fromkeys([*CARRIED, *keys]))


def parse_every(text: str) -> int:
    """'5m', '90s', '1h' or a bare number of minutes -> seconds."""
    t = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        secs = float(t[:-1]) * units[t[-1]] if t[-1:] in units else float(t) * 60
    except (ValueError, IndexError):
        raise UsageError(f"--every takes a duration such as 5m, 90s or 1h, not {text!r}") from None
    if not 5 <= secs <= 86400:
        raise UsageError(f"--every must be between 5s and 24h, not {text!r}")
    return int(secs)


def _tag(home: Path) -> str:
    """One schedule per ORCH_HOME: several ledgers on one machine do not clash."""
    return hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:8]


def systemd_user_works() -> bool:
    if not shutil.which("systemctl"):
        return False
    try:
        return subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def detect() -> str:
    if systemd_user_works():
        return "systemd"
    if shutil.which("crontab"):
        return "cron"
    return "loop"


def write_env(home: Path) -> tuple[Path, list[str]]:
    """The reaper's own environment file, rewritten whole: what ``carried`` names, and nothing
    else (a schedule's secrets are that schedule's alone: ``schedule_secrets``). A value on more
    than one line is not carried (systemd's and the shell's readers would take it differently;
    no provider key has one): its name is not listed."""
    path = Path(home) / "reaper.env"
    env = {k: os.environ[k] for k in carried() if os.environ.get(k) and "\n" not in os.environ[k]
           and "\r" not in os.environ[k]}
    env["ORCH_HOME"] = str(Path(home).resolve())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())))
    os.chmod(path, 0o600)
    return path, sorted(env)


def reap_argv() -> list[str]:
    return [sys.executable, "-m", "orchestrator", "reap"]


def _env_from_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines as ``write_env`` writes them (a shell's quoting); a line that is not
    one (an older orch's value over several lines) is passed over, never an error."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        k, sep, v = line.partition("=")
        if not sep or not k.isidentifier():
            continue
        try:
            words = shlex.split(v) if v else [""]
        except ValueError:
            continue
        if len(words) == 1:
            out[k] = words[0]
    return out


# -- systemd ----------------------------------------------------------------------------------------
def _unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _systemd_install(home: Path, every: int, env_file: Path) -> dict:
    name = f"orch-reaper-{_tag(home)}"
    units = _unit_dir()
    units.mkdir(parents=True, exist_ok=True)
    (units / f"{name}.service").write_text(
        "[Unit]\nDescription=orch reaper: stop or destroy idle rented machines\n\n"
        f"[Service]\nType=oneshot\nEnvironmentFile={env_file}\nWorkingDirectory={home}\n"
        f"ExecStart={' '.join(shlex.quote(a) for a in reap_argv())}\n")
    (units / f"{name}.timer").write_text(
        f"[Unit]\nDescription=orch reaper every {every} s\n\n"
        f"[Timer]\nOnBootSec=60\nOnUnitActiveSec={every}\nAccuracySec=1\nPersistent=true\n\n"
        "[Install]\nWantedBy=timers.target\n")
    for args in (["daemon-reload"], ["enable", "--now", f"{name}.timer"]):
        _systemctl(*args)
    return {"unit": name, "note": "runs while your user manager runs; `loginctl enable-linger` keeps it "
                                  "running after you log out and across reboots"}


def _systemctl(*args: str) -> str:
    out = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise OrchError(f"systemctl --user {' '.join(args)} failed: {(out.stderr or out.stdout).strip()[-300:]}")
    return out.stdout


def _systemd_uninstall(info: dict) -> None:
    name = info["unit"]
    subprocess.run(["systemctl", "--user", "disable", "--now", f"{name}.timer"], capture_output=True, timeout=30)
    for suffix in (".timer", ".service"):
        (_unit_dir() / f"{name}{suffix}").unlink(missing_ok=True)
    subprocess.run(["systemctl", "--user", "daemon-reload"], capture_output=True, timeout=30)


def _systemd_running(info: dict) -> bool:
    out = subprocess.run(["systemctl", "--user", "is-active", f"{info['unit']}.timer"], capture_output=True,
                         text=True, timeout=10)
    return out.stdout.strip() == "active"


# -- cron -------------------------------------------------------------------------------------------
def cron_line(home: Path, every: int, env_file: Path) -> str:
    """The crontab entry: it sources the 0600 env file, so no key is ever on the line itself."""
    minutes = max(1, round(every / 60))  # cron's granularity is one minute
    spec = "* * * * *" if minutes == 1 else f"*/{minutes} * * * *" if minutes < 60 else \
        f"0 */{max(1, minutes // 60)} * * *"
    log = Path(home) / "reaper.log"
    inner = (f"set -a; . {shlex.quote(str(env_file))}; set +a; exec {' '.join(shlex.quote(a) for a in reap_argv())} "
             f">> {shlex.quote(str(log))} 2>&1")
    return f"{spec} /bin/sh -c {shlex.quote(inner)} # orch-reaper {_tag(home)}"


def _crontab() -> list[str]:
    out = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines() if out.returncode == 0 else []  # exit 1: no crontab yet


def _set_crontab(lines: list[str]) -> None:
    out = subprocess.run(["crontab", "-"], input="".join(f"{line}\n" for line in lines), capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        raise OrchError(f"crontab refused the entry: {(out.stderr or out.stdout).strip()[-300:]}")


def _cron_install(home: Path, every: int, env_file: Path) -> dict:
    mark = f"# orch-reaper {_tag(home)}"
    lines = [line for line in _crontab() if not line.endswith(mark)] + [cron_line(home, every, env_file)]
    _set_crontab(lines)
    return {"mark": mark, "note": "cron runs it every "
                                  f"{max(1, round(every / 60))} min, across reboots, while crond runs"}


def _cron_uninstall(info: dict) -> None:
    _set_crontab([line for line in _crontab() if not line.endswith(info["mark"])])


def _cron_running(info: dict) -> bool:
    return any(line.endswith(info["mark"]) for line in _crontab())


# -- loop: neither systemd nor cron -----------------------------------------------------------------
def _loop_pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().rsplit(") ", 1)[1][0] == "Z"
    except (OSError, IndexError):
        return False
    return not zombie and b"orchestrator\0reap\0--watch" in cmd


def _loop_install(home: Path, every: int, env_file: Path) -> dict:
    env = {k: os.environ[k] for k in ("HOME", "USER", "LOGNAME", "LANG") if k in os.environ}
    env.update(_env_from_file(env_file))
    log = open(Path(home) / "reaper.log", "ab")
    proc = subprocess.Popen([*reap_argv(), "--watch", "--interval", str(every)], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True, close_fds=True, env=env, cwd=str(home))
    log.close()
    return {"pid": proc.pid, "note": "no systemd user session and no crontab on this machine: a detached "
                                     "`orch reap --watch` runs instead; it does NOT survive a reboot "
                                     "(run `orch reaper install` again after one)"}


def _loop_uninstall(info: dict) -> None:
    pid = info["pid"]
    if not _loop_pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _loop_pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _loop_pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _loop_running(info: dict) -> bool:
    return _loop_pid_alive(info["pid"])


_OPS = {"systemd": (_systemd_install, _systemd_uninstall, _systemd_running),
        "cron": (_cron_install, _cron_uninstall, _cron_running),
        "loop": (_loop_install, _loop_uninstall, _loop_running)}


# -- the commands -----------------------------------------------------------------------------------
def installed(ledger) -> dict | None:
    return ledger.get_json_meta("reaper:schedule")


def install(ledger, home: Path, every: int, backend: str = "auto") -> dict:
    if backend == "auto":
        backend = detect()
    if backend not in BACKENDS:
        raise UsageError(f"--backend must be auto or one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend == "systemd" and not systemd_user_works():
        raise UsageError("no systemd user session answers here (`systemctl --user` fails)")
    if backend == "cron" and not shutil.which("crontab"):
        raise UsageError("no crontab command on this machine")
    old = installed(ledger)
    if old:
        uninstall(ledger)
    env_file, carried = write_env(home)
    info = _OPS[backend][0](Path(home), every, env_file)
    info.update(backend=backend, every=every, env_file=str(env_file), carried=carried,
                installed_at=datetime.now(timezone.utc).isoformat(), command=" ".join(reap_argv()))
    ledger.set_meta("reaper:schedule", json.dumps(info))
    return info


def uninstall(ledger) -> dict | None:
    info = installed(ledger)
    if info is None:
        return None
    _OPS[info["backend"]][1](info)
    ledger.set_meta("reaper:schedule", "")
    env_file = info.get("env_file")
    if env_file:
        Path(env_file).unlink(missing_ok=True)  # it holds provider keys: nothing left behind
    return info


def status(ledger) -> dict:
    from orchestrator.reaper.reaper import last_pass

    info = installed(ledger)
    out = {"installed": info is not None, "last_pass": last_pass(ledger)}
    if info:
        out.update(info)
        out["running"] = _OPS[info["backend"]][2](info)
    return out
