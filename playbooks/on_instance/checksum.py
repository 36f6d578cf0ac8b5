"""Size, mtime and SHA-256 of run files, computed here so the controller can verify what it pulled.

    python checksum.py RUN_DIR [--tail NEWEST] REL ...   ->   ORCH_RESULT {"REL": [size, mtime, "sha256", offset], ...}

Only regular files that stay inside RUN_DIR (no links, no "..") are answered; others are left out.
``--tail NEWEST REL`` (a log, which the run appends to): only its newest NEWEST bytes are wanted, so
the sum is of the bytes from ``offset`` (``size - NEWEST``, or 0) to the end, as the controller reads them.
"""
import hashlib
import json
import os
import stat
import sys

run_dir = os.path.realpath(sys.argv[1])
out = {}
args = iter(sys.argv[2:])
for rel in args:
    newest = None
    if rel == "--tail":
        newest, rel = int(next(args)), next(args)
    path = os.path.join(run_dir, rel)
    if os.path.isabs(rel) or ".." in rel.split("/") or os.path.realpath(path) != os.path.normpath(path):
        continue
    try:
        st = os.lstat(path)
    except OSError:
        continue
    if not stat.S_ISREG(st.st_mode):
        continue
    offset = max(0, st.st_size - newest) if newest is not None else 0
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = st.st_size - offset  # what stat said: a log growing meanwhile is read to here, no further
        while left > 0 and (chunk := f.read(min(1 << 20, left))):
            h.update(chunk)
            left -= len(chunk)
    out[rel] = [st.st_size, st.st_mtime, h.hexdigest(), offset]
print("ORCH_RESULT " + json.dumps(out))
