"""A dataset staged on a volume: what its folder holds now, and the steps of staging it (standard
library only).

    python staged.py report DEST SIZES_JSON CAP YAML OUT  ->  ORCH_RESULT {"state": "dir"|"missing"|"link",
                                                            "files": {REL: [SIZE, SHA256 or null]},
                                                            "others": [REL...], "more": bool,
                                                            "pointed": OUT or null}
    python staged.py tar TAR SHA256                    ->  ORCH_RESULT {"tar_ok": bool}
    python staged.py unpack TAR DEST SHA256|- [MAX_BYTES MAX_MEMBERS]  ->  ORCH_RESULT {"top": ...}
    python staged.py point DEST REL OUT                ->  ORCH_RESULT {"data_yaml": OUT}

A volume outlives the job that staged its dataset, and anything may have written there since
(another job, a user over SSH, the host). Nothing here decides whether the dataset may be reused:
``report`` says what DEST holds (every regular file's size, the SHA-256 of those whose path and
size are in SIZES_JSON, the controller's record; links and other kinds by name; at most CAP
entries), and the controller compares it with the record it keeps at home (``staged_data``).
``point`` writes the data.yaml LibreYOLO reads to OUT, beside the folder, so the folder stays
byte for byte what the tar holds; REL must resolve to a file inside DEST. ``report`` points the
record's data.yaml (YAML) too, in the same run: the controller uses OUT only when the folder is
the record's, else it stages the folder again and points it again.
"""
import hashlib
import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor

import extract
import tree


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _regular_sha256(path):
    """The SHA-256 of ``path`` if it is still a regular file when opened (no link followed, no FIFO
    waited on), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := f.read(1 << 20):
            h.update(chunk)
        return h.hexdigest()


def report(dest, sizes_json, cap, yaml_rel, out):
    with open(sizes_json) as f:
        sizes = json.load(f)
    os.unlink(sizes_json)  # written for this report alone
    cap = int(cap)
    answer = {"state": "dir", "files": {}, "others": [], "more": False, "pointed": None}
    if os.path.islink(dest) or (os.path.lexists(dest) and not os.path.isdir(dest)):
        answer["state"] = "link"
        return answer
    if not os.path.isdir(dest):
        answer["state"] = "missing"
        return answer
    others = []
    found = {rel: size for rel, (size, _, _) in sorted(tree.walk(dest, others).items())}
    answer["more"] = len(found) + len(others) > cap
    # Only what the record lists, at the size it lists, is worth hashing: anything else differs anyway.
    wanted = [rel for rel, size in found.items() if sizes.get(rel) == size][:cap]
    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:  # hashlib lets go of the GIL
        sums = dict(zip(wanted, pool.map(lambda rel: _regular_sha256(os.path.join(dest, rel)), wanted)))
    answer["files"] = {rel: [size, sums.get(rel)] for rel, size in list(found.items())[:cap]}
    answer["others"] = sorted(others)[:cap]
    try:
        answer["pointed"] = point(dest, yaml_rel, out)["data_yaml"]
    except (SystemExit, OSError, ValueError):
        pass  # the controller stages the folder again
    return answer


def tar_ok(tar, digest):
    return {"tar_ok": os.path.isfile(tar) and not os.path.islink(tar) and sha256(tar) == digest}


def unpack(tar, dest, digest, *limits):
    if digest != "-" and sha256(tar) != digest:
        raise SystemExit(f"{tar} does not have the checksum of the dataset orch packed: the upload was damaged")
    return {"top": extract.orch_extract(tar, dest, *extract.limits(list(limits)), pointed=False)}


def point(dest, rel, out):
    root = os.path.realpath(dest)
    path = os.path.join(root, rel)
    real = os.path.realpath(path)
    if os.path.isabs(rel) or ".." in rel.split("/") or real != path or not real.startswith(root + os.sep) \
            or not os.path.isfile(real):
        raise SystemExit(f"{rel!r} is no file inside {dest}: refusing to point training at it")
    return {"data_yaml": extract.point(os.path.dirname(real), dest, yaml=real, out=out)}


if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    result = {"report": report, "tar": tar_ok, "unpack": unpack, "point": point}[verb](*args)
    print("ORCH_RESULT " + json.dumps(result))
