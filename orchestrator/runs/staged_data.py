"""A dataset staged on a volume, reused only while it is what orch staged there.

Anything that mounts a volume can write into it (another job's ``run:``, a peer task file, a person
over SSH, a marketplace host), so nothing kept on the volume says what the dataset is. The record is
made at home from the tar orch packed (every file's size and SHA-256, and which file is its
data.yaml) and kept in the ledger (``ledger_volumes.StagedDataset``). Before a reuse the instance
reports what the dataset's folder holds now (``on_instance/staged.py report``): input from a
machine orch does not trust, so its shape and sizes are checked first, then compared here with the
record. A file the record does not list (or a link, or anything not a plain file), a file changed
or missing: the folder is staged again from the tar (uploaded again unless the tar on the volume
still has orch's checksum), and the job says why. The data.yaml LibreYOLO reads is written beside
the folder from the record's own data.yaml, which must resolve to a file inside the folder.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from pathlib import Path

from orchestrator.errors import OrchError

EXTRA_LISTED = 1000  # entries beyond the record the instance may list before it says "and more"
PATH_MAX = 4096  # the longest relative path taken from a report or a record
_SHA = re.compile(r"[0-9a-f]{64}")


def record_of(tar: Path) -> tuple[dict[str, list], str]:
    """What unpacking the tar orch packed makes, read at home: {path inside the dataset's folder:
    [size, sha256]}, and the data.yaml among them (as ``on_instance/extract.py`` picks it)."""
    files: dict[str, list] = {}
    with tarfile.open(tar, mode="r:") as t:
        for m in t:
            if not m.isfile():
                continue
            rel = "/".join(p for p in m.name.split("/") if p not in ("", "."))
            h = hashlib.sha256()
            f = t.extractfile(m)
            while chunk := f.read(1 << 20):
                h.update(chunk)
            files[rel] = [m.size, h.hexdigest()]
    tops = {rel.split("/", 1)[0] for rel in files}
    top = tops.pop() if len(tops) == 1 else ""
    named = [f"{top}/{n}" for n in ("data.yaml", "data.yml") if f"{top}/{n}" in files]
    inside = sorted(r for r in files if r.count("/") == 1 and r.startswith(f"{top}/") and r.endswith((".yaml", ".yml")))
    found = named or inside
    if len(found) != 1:
        raise OrchError(f"{tar}: expected one data.yaml in its top folder, found {found}")
    return files, found[0]


def manifest(files: dict[str, list]) -> str:
    """``files`` as the ledger keeps it (one spelling, so that its hash says whether it changed)."""
    return json.dumps(files, sort_keys=True, separators=(",", ":"))


def _rel(value) -> bool:
    """A path relative to the dataset's folder that stays inside it."""
    return (isinstance(value, str) and 0 < len(value) <= PATH_MAX and not value.startswith("/")
            and "\\" not in value and "\x00" not in value
            and all(p not in ("", ".", "..") for p in value.split("/")))


def _size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 50


def read_record(row, digest: str) -> tuple[dict[str, list], str] | None:
    """The ledger's record as (files, data.yaml), or None where the row is no usable record of the
    tar ``digest``: another tar's, or its files not what its hash says, or a path that leaves the
    folder (a shared ledger's row is input too)."""
    if row is None or row.tar_sha256 != digest or hashlib.sha256(row.files.encode()).hexdigest() != row.manifest_sha256:
        return None
    try:
        files = json.loads(row.files)
    except (ValueError, RecursionError):
        return None
    if not isinstance(files, dict) or not all(
            _rel(rel) and isinstance(v, list) and len(v) == 2 and _size(v[0]) and isinstance(v[1], str)
            and _SHA.fullmatch(v[1]) for rel, v in files.items()):
        return None
    if not _rel(row.data_yaml) or row.data_yaml not in files:
        return None
    return files, row.data_yaml


def check_report(raw, cap: int) -> dict:
    """The instance's report, its shape and sizes checked (``ValueError`` saying what is wrong)."""
    if not isinstance(raw, dict) or raw.get("state") not in ("dir", "missing", "link"):
        raise ValueError("no state")
    files, others, more, pointed = raw.get("files"), raw.get("others"), raw.get("more"), raw.get("pointed")
    if not isinstance(files, dict) or not isinstance(others, list) or not isinstance(more, bool) \
            or not (pointed is None or isinstance(pointed, str)):
        raise ValueError("not the shape asked for")
    if len(files) > cap or len(others) > cap:
        raise ValueError(f"more than {cap} entries")
    for rel, v in files.items():
        if not (isinstance(rel, str) and len(rel) <= PATH_MAX and isinstance(v, list) and len(v) == 2
                and _size(v[0]) and (v[1] is None or (isinstance(v[1], str) and _SHA.fullmatch(v[1])))):
            raise ValueError("a file entry that is no path, size and SHA-256")
    if not all(isinstance(o, str) and len(o) <= PATH_MAX for o in others):
        raise ValueError("an entry that is no path")
    return {"state": raw["state"], "files": files, "others": others, "more": more, "pointed": pointed}


def _n(count: int, what: str) -> str:
    return f"{count} {what}" if count == 1 else f"{count} {what.replace('file', 'files', 1)}"


def differences(found: dict, files: dict[str, list]) -> str | None:
    """Why the folder the instance reported is not the record's (None: it is, file for file)."""
    if found["state"] == "link":
        return "its folder on the volume is a link or no folder"
    if found["state"] == "missing":
        return "its folder is gone from the volume"
    seen = found["files"]
    extra = sum(1 for rel in seen if rel not in files) + len(found["others"])
    changed = sum(1 for rel, v in seen.items() if rel in files and v != files[rel])
    missing = sum(1 for rel in files if rel not in seen) if not found["more"] else 0
    said = []
    if extra or found["more"]:
        said.append(("more than " if found["more"] else "") + _n(extra, "file on the volume that orch did not stage"))
    if changed:
        said.append(_n(changed, "file changed since orch staged it"))
    if missing:
        said.append(_n(missing, "file missing"))
    return ", ".join(said) or None


def stage(orch, c, volume_id: str, spec, data_dir: str, digest: str, log, limits) -> tuple[str, str]:
    """The packed dataset ``spec.local_tar`` (SHA-256 ``digest``) on the volume under ``data_dir``,
    reused when it is still what orch staged there; (its data.yaml there, what was done)."""
    from orchestrator.volumes import ledger_volumes
    from playbooks import train

    name = spec.dataset_name
    tar, dest, out = f"{data_dir}/{name}.tar", f"{data_dir}/{name}", f"{data_dir}/{name}.data.yaml"
    row = ledger_volumes.staged(orch.ledger, volume_id, name)
    record = read_record(row, digest)
    why = "orch's record of it is not usable" if row is not None and record is None else None
    if record is not None:
        files, data_yaml = record
        cap = len(files) + EXTRA_LISTED
        try:
            found = check_report(train.staged_report(c, dest, {r: v[0] for r, v in files.items()}, cap, data_yaml,
                                                     out), cap)
        except ValueError as e:
            why = f"the instance's listing of it was not usable ({e})"
        else:
            why = differences(found, files) or (None if found["pointed"] == out else
                                                "its data.yaml could not be pointed at its folder")
        if why is None:
            return out, "reused from the volume (every file as orch staged it: nothing uploaded or unpacked)"
    else:
        files, data_yaml = record_of(spec.local_tar)
    sent = train.restage(c, spec.local_tar, tar, dest, digest, log=log, limits=limits)
    if record is None:  # made at home from the tar: what the folder now holds, whatever the volume says
        text = manifest(files)
        ledger_volumes.record_staged(orch.ledger, volume_id, name, digest, data_yaml, text,
                                     hashlib.sha256(text.encode()).hexdigest())
    how = ("uploaded" if sent else
           "unpacked from the tar on the volume (its checksum matches: nothing uploaded)")
    if why is None:
        said = "staged on the volume (the next job on it reuses it)" if sent else how
    else:
        said = f"staged again: {why}; {'uploaded again' if sent else how}"
    return _pointed(c, dest, data_yaml, out), said


def _pointed(c, dest: str, data_yaml: str, out: str) -> str:
    from playbooks import train

    if train.point_staged(c, dest, data_yaml, out) != out:
        raise OrchError(f"the instance did not write the dataset's data.yaml at {out}")
    return out
