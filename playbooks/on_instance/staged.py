"""A dataset staged on a volume, reused while it is unchanged (standard library only).

    python staged.py check TAR DEST SHA256            ->  ORCH_RESULT {"data_yaml": ... or null, "tar_ok": bool}
    python staged.py mark TAR DEST SHA256 DATA_YAML   ->  ORCH_RESULT {"files": N}

A volume outlives the job that staged its dataset, and anything may have written there since
(another job, a user over SSH): nothing is trusted without its checksum. ``mark`` (after the tar
was uploaded and unpacked into DEST) checks the tar's SHA-256 against what the controller packed
and writes a manifest of every unpacked file's size and SHA-256 beside it. ``check`` answers the
dataset's data.yaml (pointed at DEST as it is mounted now) when every file of the manifest is
still there, the same; else whether the tar at least is intact (then only the unpacking is done
again, not the upload). The data.yaml itself is left out of the manifest: it is rewritten to
point at the folder each time.
"""
import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import extract


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sums(paths):
    """SHA-256 of each path, side by side: hashlib lets go of the GIL on big buffers, so a dataset's
    files are read and hashed on every CPU of the instance."""
    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
        return list(pool.map(sha256, paths))


def manifest_path(dest):
    return dest.rstrip("/") + ".manifest.json"


def files(root):
    """Every regular file under ``root`` (no links followed), as paths relative to it."""
    out = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        for n in names:
            p = os.path.join(top, n)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(os.path.relpath(p, root))
    return sorted(out)


def check(tar, dest, digest):
    answer = {"data_yaml": None, "tar_ok": False}
    try:
        with open(manifest_path(dest)) as f:
            kept = json.load(f)
    except (OSError, ValueError):
        kept = None
    if isinstance(kept, dict) and kept.get("sha256") == digest and isinstance(kept.get("files"), dict):
        root, yaml_rel = os.path.realpath(dest), kept.get("data_yaml")
        listed = kept["files"]
        same = isinstance(yaml_rel, str) and all(  # sizes first: a file cut short is not worth hashing
            isinstance(want, list) and len(want) == 2 and os.path.isfile(os.path.join(root, rel))
            and not os.path.islink(os.path.join(root, rel)) and os.path.getsize(os.path.join(root, rel)) == want[0]
            for rel, want in listed.items())
        same = same and sums([os.path.join(root, rel) for rel in listed]) == [w[1] for w in listed.values()]
        if same:
            top = os.path.dirname(os.path.join(root, yaml_rel))
            answer["data_yaml"] = extract.point(top, dest)
            answer["tar_ok"] = True
            return answer
    answer["tar_ok"] = os.path.isfile(tar) and sha256(tar) == digest
    return answer


def mark(tar, dest, digest, data_yaml):
    if sha256(tar) != digest:
        raise SystemExit(f"{tar} does not have the checksum of the dataset orch packed: the upload was damaged")
    root = os.path.realpath(dest)
    yaml_rel = os.path.relpath(os.path.realpath(data_yaml), root)
    rels = [rel for rel in files(root) if rel != yaml_rel]
    listed = {rel: [os.path.getsize(os.path.join(root, rel)), digest]
              for rel, digest in zip(rels, sums([os.path.join(root, rel) for rel in rels]))}
    tmp = manifest_path(dest) + f".{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"sha256": digest, "data_yaml": yaml_rel, "files": listed}, f)
    os.replace(tmp, manifest_path(dest))
    return {"files": len(listed)}


if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    result = check(*args) if verb == "check" else mark(*args)
    print("ORCH_RESULT " + json.dumps(result))
