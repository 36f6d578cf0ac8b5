"""Processes that race: N processes of their own, each with its own connections, that do the same
step at the same moment (two reapers' passes, eight `orch up`s meeting a fresh ledger).

One interpreter imports what they need once, then forks them: each child runs ``before`` (connect,
open the ledger), says it is ready, waits until every child is, then runs ``body``. A fresh
interpreter per racer imported SQLAlchemy and orch again, 0.7 CPU-s each, before a step of a few
milliseconds. Nothing is shared but the imports: whatever connects does so in the child.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import NamedTuple

from tests.conftest import ROOT

_LAUNCHER = r'''
import json, os, sys, tempfile, traceback
setup, before, body, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
argv = ["-c", *sys.argv[5:]]
exec(compile(setup, "<setup>", "exec"), {"__name__": "__main__"})  # the imports, cached in sys.modules
folder = tempfile.mkdtemp()
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for k in range(n):
    out, err = os.path.join(folder, f"{k}.out"), os.path.join(folder, f"{k}.err")
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False, buffering=1)
        sys.argv = argv
        scope, code = {"__name__": "__main__"}, 0
        try:
            exec(compile(setup + "\n" + before, "<before>", "exec"), scope)
            os.write(ready_w, b"r")
            os.read(go_r, 1)  # every racer ready: now, together
            exec(compile(body, "<body>", "exec"), scope)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    kids.append((pid, out, err))
os.close(ready_w)
os.close(go_r)
got = 0
while got < n:
    chunk = os.read(ready_r, n)
    if not chunk:
        break  # a racer died before it was ready: its exit code says so
    got += len(chunk)
os.write(go_w, b"g" * n)
results = []
for pid, out, err in kids:
    _, status = os.waitpid(pid, 0)
    results.append({"rc": os.waitstatus_to_exitcode(status), "out": open(out).read(), "err": open(err).read()})
print(json.dumps(results))
'''


class Racer(NamedTuple):
    rc: int
    out: str
    err: str


def race(n: int, setup: str, body: str, before: str = "", argv: tuple = (), timeout: float = 120,
         env: dict | None = None) -> list[Racer]:
    """``n`` forked processes that each run ``before``, then ``body`` at the same moment (``setup``:
    the imports they share; ``argv``: their ``sys.argv[1:]``); their exit codes and output."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, setup, before, body, str(n), *map(str, argv)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [Racer(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]
