"""Settings: flags beat environment variables, which beat ``$ORCH_HOME/config.toml``.

config.toml, all keys optional::

    default_provider = "local"
    ssh_timeout_minutes = 20
    job_unreachable_minutes = 10  # `orch run`: an attempt unreachable this long is lost
    replace_lost_node = true  # a group job's lost node is replaced alone (false: the whole group relaunches)
    volume_idle_days = 7  # the reaper reports (never deletes) a volume unattached this long
    preempted_hours = 6   # offers where a spot market just took a machine rank last this long (0: never)
    pull_max_gb = 50      # what a run's (a job's) pulls keep at home at most (ORCH_PULL_MAX_GB)
    pull_max_files = 20000  # and how many files (ORCH_PULL_MAX_FILES)
    pull_log_mb = 64      # each log's newest part that comes home (ORCH_PULL_LOG_MB)

    [policy]              # defaults for the reaper and the watchdog
    idle_minutes = 10
    on_idle = "auto"      # auto | stop | destroy
    max_hours = 0         # 0: no deadline

    [providers.local]
    price_per_hour = 0.0
    stopped_price_per_hour = 0.0

    [providers.runpod]
    api_key = "..."       # or RUNPOD_API_KEY

    [notify]              # see notify.py
    webhook_url = "https://..."
    events = ["preempted", "watchdog", "reaper", "lost", "broken", "job", "budget"]

    [budget]              # see budget.py: over everything orch rents, per calendar day and month
    daily_usd = 50
    monthly_usd = 800
    timezone = "Europe/Paris"   # where a day and a month begin (default UTC)

Nothing secret from here is ever written to the ledger or a log.
"""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.text import nearest


def home() -> Path:
    return Path(os.environ.get("ORCH_HOME") or Path.home() / ".orch").expanduser()


def cache_home() -> Path:
    """Where orch keeps what it can always make again and what holds for every ORCH_HOME of this
    user (verdicts on a dataset's bytes): the XDG cache folder, ``~/.cache/orch`` by default."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "orch"


@lru_cache(maxsize=None)
def _load(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {p}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{p} is not valid TOML: {e}") from None
    _check(data, p)
    return data


_POLICY = ("idle_minutes", "on_idle", "max_hours", "rebuild_cost")
_SECTIONS = {"policy": dict, "providers": dict, "notify": dict, "budget": dict}
# What notify.py posts.
NOTIFY_EVENTS = ("preempted", "watchdog", "reaper", "lost", "broken", "job", "schedule", "volume", "budget")
_TOP = {"default_provider": str, "ssh_timeout_minutes": (int, float), "offers_cache_seconds": (int, float),
        "database_url": str, "spot_margin": (int, float), "start_timeout_minutes": (int, float),
        "job_unreachable_minutes": (int, float), "pull_max_gb": (int, float), "pull_log_mb": (int, float),
        "pull_max_files": int, "reaper_parallel": int, "volume_idle_days": (int, float), "replace_lost_node": bool,
        "preempted_hours": (int, float)}


# A NaN, a negative wait or an infinite one passes a type check and breaks a loop later.
_RANGES = {"ssh_timeout_minutes": (0.05, 24 * 60), "offers_cache_seconds": (0, 7 * 86400), "spot_margin": (0, 10),
           "start_timeout_minutes": (0.05, 24 * 60), "job_unreachable_minutes": (0.05, 24 * 60),
           "pull_max_gb": (0.001, 1e6), "pull_log_mb": (0.001, 1e6), "pull_max_files": (1, 10_000_000),
           "reaper_parallel": (1, 256),
           "volume_idle_days": (0, 3650), "preempted_hours": (0, 24 * 365)}


def _check(data: dict, path: Path) -> None:
    for key, value in data.items():
        want = _SECTIONS.get(key) or _TOP.get(key)
        if want is None:
            raise UsageError(f"{path}: unknown setting {key!r}{nearest(key, [*_SECTIONS, *_TOP])}")
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise UsageError(f"{path}: {key} has the wrong type ({type(value).__name__})")
        low, high = _RANGES.get(key, (None, None))
        if low is not None and not low <= value <= high:
            raise UsageError(f"{path}: {key} must be between {low:g} and {high:g}, not {value}")
    for name, section in data.get("providers", {}).items():
        if not isinstance(section, dict):
            raise UsageError(f"{path}: [providers.{name}] must be a table")
    policy = data.get("policy", {})
    for key, value in policy.items():
        if key not in _POLICY:
            raise UsageError(f"{path}: unknown policy setting {key!r}{nearest(key, _POLICY)}")
        if key == "on_idle":
            if value not in ("auto", "stop", "destroy"):
                raise UsageError(f"{path}: policy.on_idle must be auto, stop or destroy")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise UsageError(f"{path}: policy.{key} must be a number >= 0")
    _check_notify(data.get("notify", {}), path)
    _check_budget(data.get("budget", {}), path)


def _check_budget(budget: dict, path: Path) -> None:
    for key, value in budget.items():
        if key in ("daily_usd", "monthly_usd"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise UsageError(f"{path}: budget.{key} must be a $ amount above 0")
        elif key == "timezone":
            from orchestrator.schedules import cron

            cron.zone(value, f"{path}: budget.timezone")
        else:
            raise UsageError(f"{path}: unknown budget setting {key!r}"
                             f"{nearest(key, ('daily_usd', 'monthly_usd', 'timezone'))}")


def _check_notify(notify: dict, path: Path) -> None:
    """The webhook URL is a secret: an error names the setting, never its value."""
    for key, value in notify.items():
        if key == "webhook_url":
            if not isinstance(value, str) or not value.startswith(("https://", "http://")) \
                    or any(c.isspace() or not c.isprintable() for c in value) or len(value) > 2000:
                raise UsageError(f"{path}: notify.webhook_url must be an http(s) URL")
        elif key == "events":
            if not isinstance(value, list) or not all(isinstance(v, str) and v in NOTIFY_EVENTS for v in value):
                raise UsageError(f"{path}: notify.events must be a list of {', '.join(NOTIFY_EVENTS)}")
        else:
            raise UsageError(f"{path}: unknown notify setting {key!r}{nearest(key, ('webhook_url', 'events'))}")


def warnings(home_dir: Path | None = None) -> list[str]:
    """What is too open about orch's home: other users may read what it holds (the ledger says
    where every machine is; config.toml may hold provider keys)."""
    home_dir = Path(home_dir) if home_dir is not None else home()
    found = []
    try:
        if home_dir.stat().st_mode & 0o077:
            found.append(f"{home_dir} is readable by other users (chmod 700 {home_dir})")
        cfg = home_dir / "config.toml"
        text = cfg.read_text(errors="replace") if cfg.exists() and cfg.stat().st_mode & 0o077 else ""
        for secret in ("api_key", "webhook_url"):
            if secret in text:
                found.append(f"{cfg} holds an {secret} and is readable by other users (chmod 600 {cfg})")
                break
    except OSError:
        pass
    return found


def load() -> dict[str, Any]:
    return _load(str(home() / "config.toml"))


def get(key: str, default: Any = None) -> Any:
    return load().get(key, default)


def policy(key: str, default: Any) -> Any:
    return load().get("policy", {}).get(key, default)


def provider_settings(name: str) -> dict[str, Any]:
    return dict(load().get("providers", {}).get(name, {}))


def database_url(home_dir: Path | None = None) -> str:
    """Where the ledger is, the one place that says so: ``ORCH_DATABASE_URL``, else ``database_url``
    in config.toml, else ``ledger.db`` in orch's home. A URL that would lose the ledger (an
    in-memory SQLite, a folder that does not exist) is refused before anything is opened."""
    home_dir = Path(home_dir) if home_dir is not None else home()
    url = os.environ.get("ORCH_DATABASE_URL") or get("database_url") or f"sqlite:///{home_dir / 'ledger.db'}"
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is None:
            raise UsageError(f"the ledger URL {url!r} is an in-memory SQLite database: everything orch records "
                             "would be lost when the command ends (give a file, e.g. sqlite:////path/ledger.db)")
        if path != home_dir / "ledger.db" and not path.parent.is_dir():
            raise UsageError(f"the ledger URL {url!r} points into {path.parent}, which does not exist")
    return url


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for an in-memory database."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    path = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel or sqlite:////abs
    path = path.split("?", 1)[0]
    return Path(path) if path and path != ":memory:" and not path.startswith("file::memory:") else None


def key_path() -> Path:
    return home() / "keys" / "id_ed25519"


def ssh_key() -> tuple[Path, str]:
    """orch's own client key (created 0600 on first use) and its public half."""
    key = key_path()
    if not key.exists():
        import fcntl

        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(key.parent / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # orch processes meeting a new ORCH_HOME make one key
            if not key.exists():
                tmp = key.with_name(f".{key.name}.{os.getpid()}")
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch", "-f", str(tmp)],
                               check=True)
                os.chmod(tmp, 0o600)
                os.replace(f"{tmp}.pub", key.parent / "id_ed25519.pub")  # the public half first: a
                os.replace(tmp, key)  # process that sees the key finds its public half too
        finally:
            os.close(lock)
    return key, (key.parent / "id_ed25519.pub").read_text().strip()
