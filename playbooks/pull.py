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
  within one budget of bytes and of files per destination folder (a job's ``runs/NAME``, whatever
  pulls into it: every look, every attempt), counted from what the folder's manifest says came
  home before, never afresh at each pull. The instance decides how big its files are and how many
  there are (a sparse 1.5 GB train.log costs it nothing, nor a new 200 MB file at every look): what
  is left on the instance is said, never pulled;
- a file this machine cannot hold under its name (a name over 255 bytes; ``out/c`` a file and
  ``out/c/d`` too) is that file's failure, left on the instance and said, never the pull's end;
- a secret the run's command got is hidden in every text file as its bytes arrive (``hide``,
  ``text.Redactor``), before anything is written here: a crash mid-pull leaves no value in clear at
  home. The manifest records the bytes the instance gave and the size they came to here once
  hidden, so an unchanged file is not pulled again.

The manifest is saved in batches (and at the end, whatever happens), so a look over many files
costs in proportion to them. A pull that cannot verify a file raises: its caller (``orch down``,
the reaper) then destroys nothing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.kill_points import kill_point
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
MAX_GB = 50.0  # default cap on what a run's (a job's) pulls keep at home (ORCH_PULL_MAX_GB, config.toml pull_max_gb)
MAX_FILES = 20_000  # default cap on how many files they keep (ORCH_PULL_MAX_FILES, config.toml pull_max_files)
SAVE_EVERY = 500  # files pulled between two saves of the manifest (and every SAVE_SECONDS)
SAVE_SECONDS = 5.0
RESUMABLE = 8 << 20  # a partial copy of a file this big is recorded at once, to be resumed after a break
_SUM_ARGS = 64 << 10  # checksum.py's arguments per call: one command line, under the kernel's 128 KiB per argument
_PARTS = "\u0000parts"  # the manifest's record of partial copies (no file name holds a NUL)
# A name this machine cannot make (too long, a file where a folder must be, the other way round): the
# file is left on the instance; any other error (a full disk) is the pull's, and nothing is destroyed.
_UNNAMEABLE = {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EINVAL, errno.EILSEQ}
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
    total_bytes: int = int(MAX_GB * (1 << 30))  # what the destination holds at most, over every pull into it
    total_files: int = MAX_FILES

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
                   total_bytes=int(setting("ORCH_PULL_MAX_GB", "pull_max_gb", MAX_GB) * (1 << 30)),
                   total_files=max(1, int(setting("ORCH_PULL_MAX_FILES", "pull_max_files", MAX_FILES))))


def bounded(files: list[RunFile], bounds: Bounds, held: dict[str, int] | None = None,
            home=lambda f: False) -> tuple[list[RunFile], list[str], list[str]]:
    """(what to pull, what the run could not have written, what the budget leaves behind): the last
    two are on the instance still, each said with why. ``held``: the bytes of each file the
    destination holds already (its manifest), counted against the budget whether offered again or
    not; ``home(f)``: ``f`` is at home as it is, so it keeps its place before anything new."""
    held = held or {}
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
        kind = (len(_ORDER), -int(m[1])) if m else (_ORDER.index(f.rel) if f.rel in _ORDER else len(_ORDER), 0)
        return (not home(f), *kind)

    offered = {f.rel for f in plausible}
    others = [n for rel, n in held.items() if rel not in offered]  # at home, and not offered again
    total, count = sum(others), len(others)
    take = []
    for f in sorted(plausible, key=rank):
        size = min(f.size, f.newest) if f.newest is not None else f.size
        if total + size > bounds.total_bytes:
            over.append(f"{f.rel[:120]} ({_mb(size)}: past the {_mb(bounds.total_bytes)} that come home, "
                        "ORCH_PULL_MAX_GB raises it)")
        elif count + 1 > bounds.total_files and f.rel not in held:  # one held is counted either way
            over.append(f"{f.rel[:120]} (past the {bounds.total_files} files that come home, ORCH_PULL_MAX_FILES "
                        "raises it)")
        else:
            total, count = total + size, count + 1
            take.append(f)
            if f.newest is not None and f.size > f.newest:
                implausible.insert(0, f"the first {_mb(f.size - f.newest)} of {f.rel} (its newest {_mb(f.newest)} "
                                   "came home; ORCH_PULL_LOG_MB raises the cap)")
            continue
        total, count = total + held.get(f.rel, 0), count + (f.rel in held)  # its older copy stays at home
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
         bounds: Bounds | None = None, hide=()) -> list[str]:
    """Bring ``files`` home to ``dest``, skipping what is there unchanged; returns what was pulled.
    ``strict``: a file the instance listed but will not vouch for (no checksum, never matching), or
    that this machine failed to write (a full disk), is an error: the caller must not destroy. Not
    strict (a milestone pull while the run goes on): such a file is left for the next look, as one
    that changed while it was read. ``bounds``: what the run could have written and the budget
    (default: the caps alone); what they leave on the instance is logged, and under ``strict`` what
    the budget leaves is an error (raise it, or destroy by hand). A file whose name this machine
    cannot hold is left on the instance and logged, strict or not: no later look could bring it.
    ``hide``: secret values, hidden in every file but the weights before it is written here."""
    dest = Path(dest)
    bounds = bounds or Bounds.of_run(None)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OrchError(f"cannot write the pull's folder {dest}: {e}") from None
    manifest = _load(dest)
    files, implausible, over = bounded(files, bounds, _held(dest, manifest), lambda f: _fresh(dest, manifest, f))
    if implausible or over:
        log(f"left on the instance: {_some(implausible + over, 5)}")
    todo = [f for f in files if not _fresh(dest, manifest, f)]
    got, unnamed = [], []
    saved = _Saver(dest, manifest)
    try:
        sums = _sums(c, run_dir, todo)
        for f in todo:
            try:
                problem = _one(c, run_dir, f, dest, manifest, sums, saved, hide if not f.rel.endswith(".pt") else ())
            except OSError as e:  # this machine's, for this one file
                if e.errno in _UNNAMEABLE:
                    unnamed.append(f"{f.rel[:120]} ({e.strerror or e}: not a name this machine can hold)")
                    continue
                problem = f"{f.rel[:120]} could not be written here: {e.strerror or e}"
            if problem:
                if strict:
                    raise OrchError(problem)
                log(f"left for the next look: {problem}")
                continue
            got.append(f.rel)
    finally:
        saved.flush()
    if unnamed:
        log(f"left on the instance: {_some(unnamed, 5)}")
    if got:
        log(f"pulled {_some(got, 20)} to {dest}")
    if over and strict:
        raise OrchError(f"the pull stopped at its budget of {_mb(bounds.total_bytes)} and {bounds.total_files} files: "
                        f"{'; '.join(over[:3])}. Raise ORCH_PULL_MAX_GB or ORCH_PULL_MAX_FILES (pull_max_gb, "
                        "pull_max_files in config.toml) to bring them home; nothing is destroyed meanwhile")
    return got


def _one(c, run_dir: str, f: RunFile, dest: Path, manifest: dict, sums: dict, saved, hide=()) -> str | None:
    """One file home, verified and in the manifest; None, or why not (an OSError of this machine's
    is raised to the caller)."""
    target = destination(dest, f.rel)
    for _ in range(ATTEMPTS):
        theirs = _checked(sums.get(f.rel), f.newest)
        if theirs is None:
            return f"{f.rel[:120]} on the instance is not a regular file in the run folder: not pulled"
        size, mtime, sha, offset = theirs
        here = _fetch(c, f"{run_dir}/{f.rel}", target, size, sha, manifest, dest, f.rel, mtime, offset, saved, hide)
        if here is not None:  # its size here (what was hidden taken out), and the bytes the instance gave
            manifest[f.rel] = [size, mtime, sha, here, size - offset]
            saved.changed()
            return None
        # It changed while we read it: its sum again (the others' sums still stand).
        sums[f.rel] = host.script(c, "checksum.py", run_dir, *_args(f)).get(f.rel)
    return (f"{f.rel[:120]} never matched its checksum on the instance ({ATTEMPTS} tries): it keeps changing or the "
            "transfer is corrupt; nothing was renamed into place")


def _some(items: list[str], n: int) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _sums(c, run_dir: str, todo: list[RunFile]) -> dict:
    """The instance's checksums of ``todo``, asked in calls whose arguments stay well under one command
    line's limit (thousands of names would not fit in one)."""
    sums, batch, length = {}, [], 0
    for f in todo:
        args = _args(f)
        if batch and length + sum(len(a) + 3 for a in args) > _SUM_ARGS:
            sums.update(host.script(c, "checksum.py", run_dir, *batch))
            batch, length = [], 0
        batch += args
        length += sum(len(a) + 3 for a in args)
    if batch:
        sums.update(host.script(c, "checksum.py", run_dir, *batch))
    return sums


class _Saver:
    """The manifest saved every SAVE_EVERY files or SAVE_SECONDS, and once at the end: rewriting it
    after each file made a look over n files cost n² (8,000 files took 478 s)."""

    def __init__(self, dest: Path, manifest: dict):
        self.dest, self.manifest, self.dirty, self.since = dest, manifest, 0, time.monotonic()

    def changed(self) -> None:
        self.dirty += 1
        if self.dirty >= SAVE_EVERY or time.monotonic() - self.since >= SAVE_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.dirty:
            _save(self.dest, self.manifest)
        self.dirty, self.since = 0, time.monotonic()


def _args(f: RunFile) -> list[str]:
    return [f.rel] if f.newest is None else ["--tail", str(f.newest), f.rel]


def _held(dest: Path, manifest: dict) -> dict[str, int]:
    """The bytes at home of each file the manifest says a pull brought to ``dest``."""
    held = {}
    for rel, have in manifest.items():
        if rel == _PARTS or not (isinstance(have, list) and len(have) >= 3):
            continue
        if len(have) >= 4 and isinstance(have[3], int) and not isinstance(have[3], bool):
            held[rel] = max(have[3], 0)
        elif len(have) == 3:  # a manifest from before the local size was kept: as it lies at home
            try:
                held[rel] = (dest / rel).stat().st_size
            except (OSError, ValueError):
                held[rel] = have[0] if isinstance(have[0], int) else 0
    return held


def _fresh(dest: Path, manifest: dict, f: RunFile) -> bool:
    have = manifest.get(f.rel)
    target = dest / f.rel
    want = f.size if f.newest is None else min(f.size, f.newest)
    if isinstance(have, list) and len(have) >= 5 and all(isinstance(n, int) and not isinstance(n, bool)
                                                         for n in have[3:5]):
        if have[4] != want:  # another part of it asked for (a log's cap changed)
            return False
        want = have[3]  # what it came to here, a secret hidden in it
    try:
        return (isinstance(have, list) and have[:2] == [f.size, f.mtime] and target.is_file()
                and not target.is_symlink() and target.stat().st_size == want)
    except (OSError, ValueError):  # a name this machine cannot hold is not at home
        return False


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
           mtime: float, start: int = 0, saved=None, hide=()) -> int | None:
    """One download, from byte ``start`` of the instance's file, into a temporary file of this
    process's own; its size here once it verified and was renamed, else None. What fails on the
    instance's side raises an OrchError; what fails on this machine's (its name, its disk) an
    OSError. ``hide``: secret values hidden as the bytes arrive (such a copy is never resumed: what
    is here is not what the instance holds)."""
    from orchestrator.text import Redactor

    hiding = Redactor(hide) if hide else None
    parts = manifest.setdefault(_PARTS, {})
    if not isinstance(parts, dict):
        parts = manifest[_PARTS] = {}
    target.parent.mkdir(parents=True, exist_ok=True)
    destination(dest, rel)  # the folder just made must not have become a link meanwhile
    h = hashlib.sha256()
    part, offset = _resume(dest, parts, rel, size, mtime, sha, h) if hiding is None else (None, 0)
    if part is None:
        # A short name of its own (never the file's name and more: that could pass 255 bytes).
        part = target.with_name(f".orch-pull-{os.getpid()}-{secrets.token_hex(4)}.part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        if size - start >= RESUMABLE and hiding is None:  # worth resuming after a break: recorded at once
            parts[rel] = [size, mtime, sha, part.name]
            _save(dest, manifest)
    else:
        fd = os.open(part, os.O_WRONLY | os.O_APPEND)
    try:
        with os.fdopen(fd, "ab") as out:
            left, extra = _copy(c, path, rel, start + offset, size - start - offset, out, h, hiding)
            here = out.tell()
        if left or extra or h.hexdigest() != sha:
            part.unlink(missing_ok=True)
            if parts.pop(rel, None) is not None:
                _save(dest, manifest)
            return None
        kill_point("pull-written")
        os.replace(part, target)
        kill_point("pull-renamed")
    except OSError:
        part.unlink(missing_ok=True)
        parts.pop(rel, None)
        raise
    except OrchError:
        if rel not in parts:  # not recorded to be resumed: nothing would ever take it up again
            part.unlink(missing_ok=True)
        raise
    if parts.pop(rel, None) is not None and saved is not None:
        saved.changed()
    return here


def _copy(c, path: str, rel: str, at: int, left: int, out, h, hiding=None) -> tuple[int, bytes]:
    """``left`` bytes of the instance's ``path`` from ``at`` into ``out`` (through ``hiding``, a
    ``text.Redactor``, when given; ``h`` hashes them as they came); (what was missing, what came
    past the end). The instance's errors are OrchErrors; ``out``'s are this machine's OSErrors."""
    def theirs(call, *args):
        try:
            return call(*args)
        except OSError as e:
            raise OrchError(f"pulling {rel[:120]} failed: {e}") from None

    src = theirs(lambda: c.sftp().open(path, "rb"))
    try:
        theirs(src.seek, at)
        if left > 1 << 20:  # read ahead in the background; a small file is one request anyway
            theirs(src.prefetch, left)
        while left > 0:
            chunk = theirs(src.read, min(1 << 20, left))
            if not chunk:
                break
            out.write(chunk if hiding is None else hiding.feed(chunk))
            h.update(chunk)
            left -= len(chunk)
        if hiding is not None:
            out.write(hiding.end())
        extra = theirs(src.read, 1)  # more than its stat said: it grew (or lies)
    finally:
        try:
            src.close()
        except OSError:
            pass
    return left, extra


def _resume(dest, parts, rel, size, mtime, sha, h) -> tuple[Path | None, int]:
    """A partial copy of this very file (same size, mtime and checksum on the instance), hashed so far."""
    entry = parts.get(rel)
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
    if not isinstance(data, dict):
        return {}
    # A partial copy recorded beside the files (before the manifest had a place of its own for them).
    return {k: v for k, v in data.items() if not (isinstance(v, list) and len(v) == 4 and isinstance(v[3], str))}


def _save(dest: Path, manifest: dict) -> None:
    tmp = dest / f".{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        tmp.write_text(json.dumps(manifest))
        os.replace(tmp, dest / MANIFEST)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OrchError(f"cannot record the pull in {dest / MANIFEST}: {e}") from None
