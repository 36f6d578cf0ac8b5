"""Run on the instance (standard library only): files under a task's workdir, for the controller.

    python tree.py list ROOT REL...          the regular files at or under each ROOT/REL
    python tree.py snapshot ROOT REL DEST    copy ROOT/REL to DEST, intact, for a pull
    python tree.py unpack TAR DEST           extract a plain tar orch packed under DEST

Every answer is one ``ORCH_RESULT {json}`` line; files are ``[rel, size, mtime]``. No link is
followed, and nothing outside ROOT (or DEST) is listed or written.

A snapshot is taken only when no file changed while it was copied (size and mtime listed before
and after the copy agree): a checkpoint the command was writing at that moment would be torn, so
the answer is ``{"changed": true}`` and the next look tries again. The copy replaces DEST whole
(copied aside, then renamed), so a pull never meets half of two snapshots.
"""
import json
import os
import shutil
import stat
import sys
import tarfile


def walk(top, others=None):
    """{rel: (size, mtime_ns, mtime)} of the regular files under the folder ``top`` (links not
    followed); the rel of every link and other kind of file is added to the list ``others``, if given."""
    out = {}
    if os.path.islink(top) or not os.path.isdir(top):
        return out
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        if others is not None:
            others += [os.path.relpath(os.path.join(dirpath, d), top).replace(os.sep, "/")
                       for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            if stat.S_ISREG(st.st_mode):
                out[rel] = (st.st_size, st.st_mtime_ns, st.st_mtime)
            elif others is not None:
                others.append(rel)
    return out


def inside(root, rel):
    path = os.path.normpath(os.path.join(root, rel))
    real = os.path.realpath(path)
    return path if not os.path.isabs(rel) and (real == root or real.startswith(root + os.sep)) else None


def listing(root, rels):
    root = os.path.realpath(root)
    files, missing = [], []
    for rel in rels:
        path = inside(root, rel)
        if path is None:
            missing.append(rel)
            continue
        try:
            st = os.lstat(path)
        except OSError:
            missing.append(rel)
            continue
        if stat.S_ISREG(st.st_mode):
            files.append([rel, st.st_size, st.st_mtime])
        elif stat.S_ISDIR(st.st_mode):
            found = walk(path)
            files += [[f"{rel}/{r}", size, t] for r, (size, _, t) in sorted(found.items())]
            if not found:
                missing.append(rel)
        else:
            missing.append(rel)
    return {"files": files, "missing": missing}


def snapshot(root, rel, dest):
    root = os.path.realpath(root)
    src = inside(root, rel)
    if src is None or not os.path.isdir(src) or os.path.islink(src):
        return {"files": [], "missing": True}
    before = walk(src)
    if not before:
        return {"files": [], "missing": True}
    tmp = f"{dest}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for r in before:
        os.makedirs(os.path.dirname(os.path.join(tmp, r)), exist_ok=True)
        try:
            shutil.copy2(os.path.join(src, r), os.path.join(tmp, r))
        except OSError:  # removed meanwhile (the command rotates its files): changed
            shutil.rmtree(tmp, ignore_errors=True)
            return {"changed": True}
    if walk(src) != before:
        shutil.rmtree(tmp, ignore_errors=True)
        return {"changed": True}
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    copied = walk(dest)
    return {"files": [[r, size, t] for r, (size, _, t) in sorted(copied.items())]}


def unpack(tar_path, dest):
    dest = os.path.realpath(dest)
    os.makedirs(dest, exist_ok=True)
    count = 0
    with tarfile.open(tar_path, mode="r:") as tar:
        for m in tar:
            name = m.name
            while name.startswith("./"):  # a tar made with `tar cf x.tar .` (never lstrip: .env keeps its dot)
                name = name[2:]
            target = inside(dest, name) if name and not name.startswith("/") and ".." not in name.split("/") else None
            if target is None or not (m.isreg() or m.isdir()):
                continue
            if m.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if inside(dest, os.path.relpath(os.path.dirname(target), dest)) is None:
                continue  # a folder on the way became a link
            with tar.extractfile(m) as src, open(target + ".orch-part", "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(target + ".orch-part", m.mode & 0o755 | 0o600)
            os.replace(target + ".orch-part", target)
            count += 1
    return {"files": count}


if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    if verb == "list":
        result = listing(args[0], args[1:])
    elif verb == "snapshot":
        result = snapshot(*args[:3])
    elif verb == "unpack":
        result = unpack(*args[:2])
    else:
        raise SystemExit(f"unknown verb {verb}")
    print("ORCH_RESULT " + json.dumps(result))
