"""Bring a run's files home from an instance, which is not trusted.

Whatever the instance says (its file list, sizes, names) is checked before it touches this disk:

- only the run files orch knows are taken, by name and pattern (``RUN_FILE``); anything else in
  the list is reported and left on the instance;
- every destination is resolved and must stay inside the destination folder, through no link;
- each file goes to a temporary file of its own (never a name another puller could share), is
  read up to the size the instance's ``stat`` gave and no further, and is renamed into place only
  once its size and its SHA-256 match what the instance computed (``on_instance/checksum.py``). A
  file that changed while it was read (LibreYOLO rewrites last.pt every epoch) is read again;
- a partial copy is resumed when the instance's file is still the same (size, mtime, checksum).

A pull that cannot verify a file raises: its caller (``orch down``, the reaper) then destroys nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RunFile:
    rel: str
    size: int
    mtime: float


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


def pull(c, run_dir: str, files: list[RunFile], dest: Path, log=print, strict: bool = True) -> list[str]:
    """Bring ``files`` home to ``dest``, skipping what is there unchanged; returns what was pulled.
    ``strict``: a file the instance listed but will not vouch for (no checksum, never matching) is
    an error: the caller must not destroy. Not strict (a milestone pull while the run goes on): such a
    file is left for the next look, as one that changed while it was read."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    manifest = _load(dest)
    todo = [f for f in files if not _fresh(dest, manifest, f)]
    if not todo:
        return []
    got = []
    sums = host.script(c, "checksum.py", run_dir, *[f.rel for f in todo])
    for f in todo:
        for attempt in range(ATTEMPTS):
            theirs = _checked(sums.get(f.rel))
            if theirs is None:
                problem = f"{f.rel} on the instance is not a regular file in the run folder: not pulled"
                break
            size, mtime, sha = theirs
            if _fetch(c, f"{run_dir}/{f.rel}", destination(dest, f.rel), size, sha, manifest, dest, f.rel, mtime):
                problem = None
                break
            problem = (f"{f.rel} never matched its checksum on the instance ({ATTEMPTS} tries): it keeps changing "
                       "or the transfer is corrupt; nothing was renamed into place")
            # It changed while we read it: its sum again (the others' sums still stand).
            sums = {**sums, f.rel: host.script(c, "checksum.py", run_dir, f.rel).get(f.rel)}
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
    return got


def _fresh(dest: Path, manifest: dict, f: RunFile) -> bool:
    have = manifest.get(f.rel)
    target = dest / f.rel
    return (isinstance(have, list) and have[:2] == [f.size, f.mtime] and target.is_file()
            and not target.is_symlink() and target.stat().st_size == f.size)


def _checked(value) -> tuple[int, float, str] | None:
    try:
        size, mtime, sha = value
    except (TypeError, ValueError):
        return None
    if isinstance(size, int) and size >= 0 and isinstance(mtime, (int, float)) and isinstance(sha, str) \
            and re.fullmatch(r"[0-9a-f]{64}", sha):
        return size, float(mtime), sha
    return None


def _fetch(c, path: str, target: Path, size: int, sha: str, manifest: dict, dest: Path, rel: str,
           mtime: float) -> bool:
    """One download into a temporary file of this process's own; True once it verified and was renamed."""
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
            src.seek(offset)
            left = size - offset
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
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(dest: Path, manifest: dict) -> None:
    tmp = dest / f".{MANIFEST}.{os.getpid()}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, dest / MANIFEST)
