"""Size, mtime and SHA-256 of run files, computed here so the controller can verify what it pulled.

    python checksum.py RUN_DIR REL...   ->   ORCH_RESULT {"REL": [size, mtime, "sha256"], ...}

Only regular files that stay inside RUN_DIR (no links, no "..") are answered; others are left out.
"""
import hashlib
import json
import os
import stat
import sys

run_dir = os.path.realpath(sys.argv[1])
out = {}
for rel in sys.argv[2:]:
    path = os.path.join(run_dir, rel)
    if os.path.isabs(rel) or ".." in rel.split("/") or os.path.realpath(path) != os.path.normpath(path):
        continue
    try:
        st = os.lstat(path)
    except OSError:
        continue
    if not stat.S_ISREG(st.st_mode):
        continue
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    out[rel] = [st.st_size, st.st_mtime, h.hexdigest()]
print("ORCH_RESULT " + json.dumps(out))
