"""Bring a run's files home from an instance, which is not trusted.

Whatever the instance says (its file list, sizes, names) is checked before it touches this disk:

- only the run files orch knows are taken, by name and pattern (``RUN_FILE``); anything else in
  the list is reported and left on the instance;
- every destination is resolved and must stay inside the destination folder, through no link;
- each file goes to a temporary file of its own (never a name another puller could share), is
  read up to the size the instance's ``stat`` gave and no further, and is renamed into place only
  once its size and its SHA-256 match what the instance computed (``on_instance/checksum.py``). A
  file that changed while it was read (LibreYOLO rewrites last.pt every epoch) is read again;
- a partial copy is resumed when the instance's file is still the same (size, mtime, checksum);
- only what the run could have written, within bounds (``Bounds``): ``epoch_N.pt`` for N up to the
  run's epochs and on its save period, each log as its newest part within a cap, and everything
  within a total. The instance decides how big its files are and how many there are (a sparse
  1.5 GB train.log costs it nothing): what is left on the instance is said, never pulled.

A pull that cannot verify a file raises: its caller (``orch down``, the reaper) then destroys nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import OrchError
from playbooks import host

# The files of a LibreYOLO run orch brings home, and nothing else.
RUN_FILE = re.compile(r"weights/(?:best|last|epoch_[0-9]{1,7})\.pt|status\.json|metrics\.jsonl|train\.log"
                      r"|results\.csv|summary\.json|train_config\.yaml")
# Those that must never be lost, pulled at every look: every milestone, not last.pt's churn.
MILESTONE = re.compile(r"weights/(?:best|epoch_[0-9]{1,7})\.pt|status\.json|metrics\.jsonl|train\.log"
                       r"|results\.csv|summary\.json")
MANIFEST = ".orch-pull.json"
ATTEMPTS = 3
# The files the run appends to: a pull brings their newest part (LibreYOLO's loggers append a line
# per step or epoch; the end is what a user reads, and metrics.jsonl's readers skip a cut first line).
LOGS = ("train.log", "metrics.jsonl", "results.csv")
EPOCH_FILE = re.compile(r"weights/epoch_([0-9]{1,7})\.pt")
LIBREYOLO_SAVE_PERIOD = 10  # its default save_period (libreyolo/training/config.py, cli/commands/train.py)
LOG_MB = 64  # default cap on each log's newest part (ORCH_PULL_LOG_MB, config.toml pull_log_mb)
MAX_GB = 50.0  # default cap on what one run's pull brings home (ORCH_PULL_MAX_GB, config.toml pull_max_gb)
# Which files come first when the total cap leaves some behind: the run's record, then its weights.
_ORDER = ("status.json", "summary.json", "train_config.yaml", "results.csv", "metrics.jsonl", "weights/best.pt",
          "weights/last.pt", "train.log")


@dataclass(frozen=True)
class RunFile:
    rel: str
    size: int
    mtime: float
    newest: int | None = None  # a log: only its newest bytes, at most this many


@dataclass(frozen=True)
class Bounds:
    """What a run could have written, and what a pull brings home at most."""
    epochs: int | None = None  # the run's --epochs: no epoch_N.pt above it
    save_period: int | None = None  # its save period: epoch_N.pt only for N a multiple of it
    log_bytes: int = LOG_MB << 20
    total_bytes: int = int(MAX_GB * (1 << 30))

    @classmethod
    def of_run(cls, epochs=None, save_period=None) -> "Bounds":
        """A run's bounds (``save_period`` None: LibreYOLO's default), with the caps the user set
        (environment, then config.toml, then the defaults). Without ``epochs``: the caps alone."""
        from orchestrator import config

        def setting(env, key, default):
            raw = os.environ.get(env)
            if raw is None:
                return config.get(key, default)
            try:
                value = float(raw)
            except ValueError:
                value = float("nan")
            if not 0 < value < 1e6:
                raise OrchError(f"{env} must be a number above 0, not {raw[:40]!r}")
            return value

        known = isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0
        return cls(epochs=epochs if known else None,
                   save_period=(save_period if isinstance(save_period, int) and save_period > 0
                                else LIBREYOLO_SAVE_PERIOD) if known else None,
                   log_bytes=int(setting("ORCH_PULL_LOG_MB", "pull_log_mb", LOG_MB) * (1 << 20)),
                   total_bytes=int(setting("ORCH_PULL_MAX_GB", "pull_max_gb", MAX_GB) * (1 << 30)))


def bounded(files: list[RunFile], bounds: Bounds) -> tuple[list[RunFile], list[str], list[str]]:
    """(what to pull, what the run could not have written, what the total cap leaves behind): the
    last two are on the instance still, each said with why."""
    implausible, over, plausible, never = [], [], [], []
    for f in files:
        m = EPOCH_FILE.fullmatch(f.rel)
        if m and ((bounds.epochs is not None and not 1 <= int(m[1]) <= bounds.epochs)
                  or (bounds.save_period and int(m[1]) % bounds.save_period)):
            never.append(f.rel)
            continue
        plausible.append(replace(f, newest=bounds.log_bytes) if f.rel in LOGS else f)
    if never:
        names = sorted(never, key=lambda rel: int(EPOCH_FILE.fullmatch(rel)[1]))
        implausible.append(f"{len(names)} epoch_N.pt a run of {bounds.epochs} epochs saving every "
                           f"{bounds.save_period} could not have written ({', '.join(n[8:] for n in names[:3])}"
                           + (f" ... {names[-1][8:]})" if len(names) > 3 else ")"))

    def rank(f):
        m = EPOCH_FILE.fullmatch(f.rel)
        return (len(_ORDER), -int(m[1])) if m else (_ORDER.index(f.rel) if f.rel in _ORDER else len(_ORDER), 0)

    take, total = [], 0
    for f in sorted(plausible, key=rank):
        size = min(f.size, f.newest) if f.newest is not None else f.size
        if total + size > bounds.total_bytes:
            over.append(f"{f.rel} ({_mb(size)}: past the pull's cap of {_mb(bounds.total_bytes)}, "
                        "ORCH_PULL_MAX_GB raises it)")
            continue
        total += size
        take.append(f)
        if f.newest is not None and f.size > f.newest:
            implausible.insert(0, f"the first {_mb(f.size - f.newest)} of {f.rel} (its newest {_mb(f.newest)} came "
                               "home; ORCH_PULL_LOG_MB raises the cap)")
    return take, implausible, over


def _mb(n: int) -> str:
    return f"{n / (1 << 30):.1f} GB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MB"


def run_files(listed, only_milestones: bool = False) -> tuple[list[RunFile], list[str]]:
    """(the entries orch takes, what it refused and why) from an instance's file list."""
    take, refused = [], []
    for entry in listed if isinstance(listed, list) else []:
        try:
            rel, size, mtime = entry
            ok = isinstance(rel, str) and isinstance(size, int) and not isinstance(size, bool) and size >= 0 \
                and isinstance(mtime, (int, float)) and not isinstance(mtime, bool)
        except (TypeError, ValueError):
            ok, rel = False, entry
        if not ok or not RUN_FILE.fullmatch(rel):
            refused.append(f"{str(rel)[:80]!r}: not a run file orch knows")
            continue
        if only_milestones and not MILESTONE.fullmatch(rel):
            continue
        take.append(RunFile(rel, size, float(mtime)))
    return take, refused


def destination(dest: Path, rel: str) -> Path:
    """``dest/rel``, refused unless it stays inside ``dest`` through no link."""
    root = dest.resolve()
    target = root / rel
    if target.is_symlink() or any(p.is_symlink() for p in target.parents if p != root and p.is_relative_to(root)):
        raise OrchError(f"refusing to write {rel!r}: a link is in the way in {root}")
    if target.resolve().parent != target.parent or not target.parent.resolve().is_relative_to(root):
        raise OrchError(f"refusing to write {rel!r}: it leads out of {root}")
    return target


def pull(c, run_dir: str, files: list[RunFile], dest: Path, log=print, strict: bool = True,
         bounds: Bounds | None = None) -> list[str]:
    """Bring ``files`` home to ``dest``, skipping what is there unchanged; returns what was pulled.
    ``strict``: a file the instance listed but will not vouch for (no checksum, never matching) is
    an error: the caller must not destroy. Not strict (a milestone pull while the run goes on): such a
    file is left for the next look, as one that changed while it was read. ``bounds``: what the run
    could have written and the caps (default: the caps alone); what they leave on the instance is
    logged, and under ``strict`` what the total cap leaves is an error (raise the cap, or destroy by hand)."""
    dest = Path(dest)
    bounds = bounds or Bounds.of_run(None)
    files, implausible, over = bounded(files, bounds)
    if implausible or over:
        log(f"left on the instance: {'; '.join((implausible + over)[:5])}"
            + (f" and {len(implausible + over) - 5} more" if len(implausible + over) > 5 else ""))
    dest.mkdir(parents=True, exist_ok=True)
    manifest = _load(dest)
    todo = [f for f in files if not _fresh(dest, manifest, f)]
    got = []
    sums = host.script(c, "checksum.py", run_dir, *[a for f in todo for a in _args(f)]) if todo else {}
    for f in todo:
        for attempt in range(ATTEMPTS):
            theirs = _checked(sums.get(f.rel), f.newest)
            if theirs is None:
                problem = f"{f.rel} on the instance is not a regular file in the run folder: not pulled"
                break
            size, mtime, sha, offset = theirs
            if _fetch(c, f"{run_dir}/{f.rel}", destination(dest, f.rel), size, sha, manifest, dest, f.rel, mtime,
                      offset):
                problem = None
                break
            problem = (f"{f.rel} never matched its checksum on the instance ({ATTEMPTS} tries): it keeps changing "
                       "or the transfer is corrupt; nothing was renamed into place")
            # It changed while we read it: its sum again (the others' sums still stand).
            sums = {**sums, f.rel: host.script(c, "checksum.py", run_dir, *_args(f)).get(f.rel)}
        if problem:
            if strict:
                raise OrchError(problem)
            log(f"left for the next look: {problem}")
            continue
        manifest[f.rel] = [size, mtime, sha]
        manifest.pop(f.rel + ".part", None)
        _save(dest, manifest)
        got.append(f.rel)
    if got:
        log(f"pulled {', '.join(got)} to {dest}")
    if over and strict:
        raise OrchError(f"the pull stopped at its cap of {_mb(bounds.total_bytes)}: "
                        f"{'; '.join(over[:3])}. Raise ORCH_PULL_MAX_GB (or pull_max_gb in config.toml) to bring "
                        "them home; nothing is destroyed meanwhile")
    return got


def _args(f: RunFile) -> list[str]:
    return [f.rel] if f.newest is None else ["--tail", str(f.newest), f.rel]


def _fresh(dest: Path, manifest: dict, f: RunFile) -> bool:
    have = manifest.get(f.rel)
    target = dest / f.rel
    want = f.size if f.newest is None else min(f.size, f.newest)
    return (isinstance(have, list) and have[:2] == [f.size, f.mtime] and target.is_file()
            and not target.is_symlink() and target.stat().st_size == want)


def _checked(value, newest: int | None = None) -> tuple[int, float, str, int] | None:
    """(size, mtime, sha, offset) the instance answered, when well-formed and within what was asked:
    from a log's offset to its end is at most ``newest`` bytes, and any other file is read whole."""
    try:
        size, mtime, sha, offset = value if isinstance(value, list) and len(value) == 4 else [*value, 0]
    except (TypeError, ValueError):
        return None
    if isinstance(size, int) and size >= 0 and isinstance(mtime, (int, float)) and isinstance(sha, str) \
            and re.fullmatch(r"[0-9a-f]{64}", sha) and isinstance(offset, int) and 0 <= offset <= size \
            and (size - offset <= newest if newest is not None else offset == 0):
        return size, float(mtime), sha, offset
    return None


def _fetch(c, path: str, target: Path, size: int, sha: str, manifest: dict, dest: Path, rel: str,
           mtime: float, start: int = 0) -> bool:
    """One download, from byte ``start`` of the instance's file, into a temporary file of this
    process's own; True once it verified and was renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    destination(dest, rel)  # the folder just made must not have become a link meanwhile
    h = hashlib.sha256()
    part, offset = _resume(dest, manifest, rel, size, mtime, sha, h)
    if part is None:
        part = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        manifest[rel + ".part"] = [size, mtime, sha, part.name]
        _save(dest, manifest)
    else:
        fd = os.open(part, os.O_WRONLY | os.O_APPEND)
    try:
        with c.sftp().open(path, "rb") as src, os.fdopen(fd, "ab") as out:
            src.seek(start + offset)
            left = size - start - offset
            src.prefetch(max(left, 0))
            while left > 0:
                chunk = src.read(min(1 << 20, left))
                if not chunk:
                    break
                out.write(chunk)
                h.update(chunk)
                left -= len(chunk)
            extra = src.read(1)  # more than its stat said: it grew (or lies)
    except OSError as e:
        raise OrchError(f"pulling {rel} failed: {e}") from None
    if left or extra or h.hexdigest() != sha:
        part.unlink(missing_ok=True)
        manifest.pop(rel + ".part", None)
        _save(dest, manifest)
        return False
    os.replace(part, target)
    return True


def _resume(dest, manifest, rel, size, mtime, sha, h) -> tuple[Path | None, int]:
    """A partial copy of this very file (same size, mtime and checksum on the instance), hashed so far."""
    entry = manifest.get(rel + ".part")
    if not (isinstance(entry, list) and len(entry) == 4 and entry[:3] == [size, mtime, sha]):
        return None, 0
    part = (dest / rel).with_name(str(entry[3]))
    if part.parent != (dest / rel).parent or not part.is_file() or part.is_symlink() or part.stat().st_size > size:
        return None, 0
    with open(part, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return part, part.stat().st_size


def _load(dest: Path) -> dict:
    try:
        data = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(dest: Path, manifest: dict) -> None:
    tmp = dest / f".{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, dest / MANIFEST)
