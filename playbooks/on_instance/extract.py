"""Unpack a dataset tar safely under a folder and point its data.yaml there (standard library only).

    python extract.py TAR DEST [MAX_BYTES MAX_MEMBERS]   ->   ORCH_RESULT {"data_yaml": ...}

It takes what orch packs and a tar made by hand as "Training on a rented GPU" shows (``tar cf my-dataset.tar
my-dataset/``): directory entries, "./" prefixes, and a data.yaml in block YAML, whose top-level
``path:`` line is replaced rather than parsed. The tar is opened as a plain tar (``r:``), never
decompressed on the fly: a small compressed file named .tar must not become gigabytes here. Only
regular files and folders, inside one top folder, within the size and count limits, are taken.
"""
import json
import os
import re
import sys
import tarfile
import tempfile
from pathlib import Path


def orch_extract(tar_path, dest, max_bytes=None, max_members=None, pointed=True):
    """Unpack ``tar_path`` under ``dest``; its data.yaml pointed there (``pointed``: else left as
    the tar holds it, and the top folder answered: a dataset staged on a volume is pointed from a
    copy beside it)."""
    dest = Path(dest).expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(tar_path, mode="r:")  # plain tar only: no gzip/bz2/xz expanding here
    except tarfile.ReadError as e:
        raise SystemExit(f"{tar_path} is not a plain tar ({e}): pack it with `tar cf`, uncompressed")
    with tar:
        members, tops, total, kinds = [], set(), 0, {}
        for m in tar:
            members.append(m)
            if max_members is not None and len(members) > max_members:
                raise SystemExit(f"{tar_path} holds more than {max_members} members: refusing")
            parts = [p for p in m.name.split("/") if p not in ("", ".")]
            if m.name.startswith("/") or "\\" in m.name or ".." in parts or not (m.isfile() or m.isdir()):
                raise SystemExit(f"refusing unsafe member {m.name!r} in {tar_path}")
            # One name, one kind: a folder and a file of the same name (or a file with members under
            # it) cannot both be unpacked; said here rather than as an error halfway through.
            for depth in range(1, len(parts) + 1):
                name, kind = "/".join(parts[:depth]), "dir" if depth < len(parts) or m.isdir() else "file"
                if kinds.setdefault(name, kind) != kind:
                    raise SystemExit(f"refusing {tar_path}: {name!r} is both a folder and a file in it")
            total += m.size if m.isfile() else 0
            if max_bytes is not None and total > max_bytes:
                raise SystemExit(f"{tar_path} unpacks to more than {max_bytes} bytes: refusing")
            if parts:
                tops.add(parts[0])
        if len(tops) != 1:
            raise SystemExit(f"{tar_path} must hold one top folder, found {sorted(tops)}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # a Python without PEP 706 filters: the checks above, and what the data filter does to modes
            for m in members:  # no setuid, setgid or sticky bit, no write for others, owned by whoever unpacks
                m.mode = (m.mode & 0o755) | (0o700 if m.isdir() else 0o600)
                m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
            tar.extractall(dest, members=members)
    top = dest / tops.pop()
    return point(top, tar_path) if pointed else str(top)


def point(root, what, yaml=None, out=None):
    """The dataset's one data.yaml under ``root`` (or ``yaml``), its ``path:`` set to ``root`` as it
    is now (a dataset staged on a volume is pointed again wherever the volume is mounted this
    time), written in place or to ``out``."""
    root = Path(root)
    if yaml is None:
        found = [root / n for n in ("data.yaml", "data.yml") if (root / n).is_file()]
        found = found or sorted(root.glob("*.yaml")) + sorted(root.glob("*.yml"))
        if len(found) != 1:
            raise SystemExit(f"{what}: expected one data.yaml in {root.name}/, found {[p.name for p in found]}")
        yaml = found[0]
    data_yaml = Path(yaml)
    text = data_yaml.read_text()
    try:
        config = json.loads(text)
    except ValueError:
        config = None
    if isinstance(config, dict):  # what orch packs
        config.pop("path", None)
        text = json.dumps({"path": str(root), **config}, indent=2) + "\n"
    else:
        # Every top-level spelling of the key, quoted too (YAML reads "path": as path:, and the last one wins).
        kept = [line for line in text.splitlines() if not re.match(r"""(path|"path"|'path')\s*:""", line)]
        text = "\n".join([f"path: {json.dumps(str(root))}", *kept]) + "\n"
    target = Path(out) if out else data_yaml
    # A name of its own, made exclusively: a link planted at a fixed temporary name is not written through.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return str(target)


def limits(argv):
    return (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (None, None)


if __name__ == "__main__":
    print("ORCH_RESULT " + json.dumps({"data_yaml": orch_extract(sys.argv[1], sys.argv[2], *limits(sys.argv[3:]))}))
