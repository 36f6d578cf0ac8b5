"""A big fleet: the ledger read whole as the ledger reads it, reports that never wait for a writer,
the reaper's looks side by side, ``orch offers`` without a ledger, and every benchmark still running.

Speed itself is measured in ``bench/`` (figures in the README), not asserted here: these tests
check what a user would see if the work were done another way (a report stuck behind a writer, a
pass as long as all its looks added up, a ledger made by a question about prices).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.ledger import ledger_snapshot
from orchestrator import states
from tests.conftest import ROOT, needs_torch, run_orch
from tests.postgres import pg_server, pg_url  # noqa: F401

SQLITE_ONLY = pytest.mark.skipif(bool(os.environ.get("ORCH_TEST_DATABASE_URL")), reason="SQLite's write lock")


def history(ledger, n: int = 3):
    """``n`` instances through the ledger's own verbs: transitions, notes, memory, runs."""
    made = []
    for i in range(n):
        inst = ledger.create_instance(name=f"f{i}", provider="local", label="", gpus=1, gpu="RTX 4090",
                                      spot=bool(i % 2), policy=json.dumps({"idle_minutes": 5}))
        ledger.transition(inst.id, states.PROVISIONING, provider_id=f"p{i}", ssh_host="127.0.0.1", ssh_port=2200 + i,
                          price_hr=1.5, stopped_price_hr=0.01)
        ledger.transition(inst.id, states.READY, reason="verified")
        ledger.note(inst.id, "a note", "reaper")
        ledger.remember(inst.id, decision="keep:busy")
        run = ledger.add_run(instance_id=inst.id, model="yolox-n", data="d", epochs=3, run_dir="/w/r", pid=7)
        ledger.update_run(run.id, state="completed", ended_at=datetime.now(timezone.utc) - timedelta(minutes=3))
        if i == 0:
            ledger.transition(inst.id, states.STOPPING)
            ledger.transition(inst.id, states.STOPPED)
        made.append(inst)
    ledger.update(made[-1].id, protected=True)
    return made


def fields(row, names) -> dict:
    return {n: getattr(row, n) for n in names}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_snapshot_reads_every_row_as_the_ledger_does(backend, request):
    from orchestrator.ledger.ledger import Event, Instance, Run
    from orchestrator.instances.lifecycle import Orch

    if backend == "postgresql":
        request.getfixturevalue("pg_url")
    ledger = Orch.open().ledger

    made = history(ledger)
    ledger.transition(made[1].id, states.STOPPING)
    ledger.transition(made[1].id, states.STOPPED)
    ledger.transition(made[1].id, states.DESTROYING)
    ledger.transition(made[1].id, states.DESTROYED)  # ended: in the whole read, not in the live one
    for columns, model in ((ledger_snapshot.DATETIMES, (Instance, Event, Run)), (ledger_snapshot.BOOLEANS, (Instance,))):
        typed = {c.name for m in model for c in m.__table__.columns
                 if c.type.python_type in ((datetime,) if columns is ledger_snapshot.DATETIMES else (bool,))}
        assert typed <= columns, f"snapshot would hand these back as stored text or integers: {typed - columns}"
    cols = {m: [c.name for c in m.__table__.columns] for m in (Instance, Event, Run)}
    # Both ways of reading it: the standard library's (SQLite at the schema head) and SQLAlchemy's
    # (PostgreSQL, a ledger to migrate).
    for live_only, snap in ((lo, read(ledger, live_only=lo)) for lo in (False, True) for read in
                            (ledger_snapshot.read, lambda led, live_only: ledger_snapshot._through(led, live_only, None))):
        assert [i.id for i in snap.instances] == [i.id for i in ledger.instances(live_only=live_only)]
        assert (made[1].id in [i.id for i in snap.instances]) is not live_only
        for inst in snap.instances:
            assert fields(inst, cols[Instance]) == fields(ledger.get(inst.id), cols[Instance])
            assert [fields(e, cols[Event]) for e in snap.events_of(inst.id)] == \
                   [fields(e, cols[Event]) for e in ledger.events(inst.id)]
            assert [fields(r, cols[Run]) for r in snap.runs_of(inst.id)] == \
                   [fields(r, cols[Run]) for r in ledger.runs(inst.id)]
    for only in (ledger_snapshot.read(ledger, name="f2"), ledger_snapshot._through(ledger, False, "f2")):
        assert [i.name for i in only.instances] == ["f2"] and set(only.events) == set(only.runs) == {made[2].id}


@SQLITE_ONLY
def test_reports_answer_at_once_while_another_process_holds_the_write_lock(ledger, orch_home):
    made = history(ledger)
    ledger.create_job(("planned",), name="j1", state="completed", spec="{}")
    db = orch_home / "ledger.db"
    # Another process (an `orch up`, a reaper pass) in the middle of a long write.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute(\"UPDATE meta SET value = value WHERE key = 'none'\")\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # The ledger's busy timeout is 30 s: a report that queued behind the writer would take that
        # long and then fail with "database is locked".
        for args in (("status",), ("status", "--json"), ("cost",), ("cost", "--json"), ("jobs",), ("jobs", "--json")):
            t0 = time.monotonic()
            done = run_orch(*args, check=0, timeout=25)
            assert "locked" not in done.stderr, (args, done.stderr)
            assert time.monotonic() - t0 < 25, args
        shown = json.loads(run_orch("cost", "--json", check=0, timeout=25).stdout)
        assert {i["name"] for i in shown["instances"]} == {i.name for i in made}
        assert [j["name"] for j in json.loads(run_orch("jobs", "--json", check=0, timeout=25).stdout)] == ["j1"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # and the writer's work still lands once it lets go: a write waits its turn (IMMEDIATE)
    ledger.note(made[0].id, "after the long write", "cli")
    assert ledger.events(made[0].id)[-1].reason == "after the long write"


class SlowLink:
    """A TCP hop in front of an instance's sshd that holds every new connection ``delay`` seconds
    before it passes a byte (a slow network); ``delay=None`` holds it until the test ends (a hung
    host: the connection is accepted, nothing ever answers)."""

    def __init__(self, host: str, port: int, delay: float | None):
        self.target, self.delay, self.stop = (host, port), delay, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        if self.delay is None:
            self.stop.wait()
            conn.close()
            return
        if self.stop.wait(self.delay):
            conn.close()
            return
        upstream = socket.create_connection(self.target)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@pytest.mark.long
def test_a_pass_takes_about_its_slowest_look_not_all_of_them(orch_home, ledger):
    """Three ready instances: two behind links that hold each connection 5 s, one that never
    answers (SSH gives up after its 15 s timeout). Looked at one after another the pass would
    take 15 + 5 + 5 s; side by side, about the hung host's 15 s."""
    from tests.clouds import arrange, open_orch

    env = {"ORCH_WATCHDOG": "off"}
    names = ["look0", "look1", "look2"]
    orch = open_orch()
    for n in names:
        arrange(orch, n)  # ready and reachable over SSH, without minutes of provisioning
    links = []
    try:
        for n, delay in zip(names, (5.0, 5.0, None)):
            inst = ledger.by_name(n)
            meta_path = orch_home / "local" / inst.provider_id / "meta.json"
            meta = json.loads(meta_path.read_text())
            link = SlowLink(meta["host"], meta["port"], delay)
            links.append(link)
            # The provider and the ledger both say the instance is reached through the link now.
            meta.update(host="127.0.0.1", port=link.port)
            meta_path.write_text(json.dumps(meta))
            ledger.update(inst.id, ssh_host="127.0.0.1", ssh_port=link.port)
        shown = json.loads(run_orch("reap", "--json", "--parallel", "4", env=env, check=0).stdout)
        by = {o["name"]: o for o in shown}
        for n in names[:2]:
            assert by[n]["action"] == "keep" and "idle" in by[n]["reason"], by[n]  # looked at, through the slow link
        assert by["look2"]["action"] == "keep" and "unreachable" in by["look2"]["reason"], by["look2"]
        took = json.loads(run_orch("reaper", "status", "--json", check=0).stdout)["last_pass"]["seconds"]
        assert 15 <= took < 15 + 5 + 5, f"the pass took {took} s: its looks ran one after another"
    finally:
        for link in links:
            link.close()
        for n in names:
            run_orch("down", n, "--no-pull", env=env)


def test_offers_without_a_job_make_no_ledger(orch_home):
    """A question about prices opens no ledger (it used to build the whole ledger stack first)."""
    # No GPU here and no key: no provider can be asked, which is an error (exit 1), never an empty list.
    done = run_orch("offers", "--gpu", "H100", "--provider", "local")
    assert done.returncode in (0, 1, 3) and "Traceback" not in done.stderr, done.stderr
    assert not (orch_home / "ledger.db").exists()
    priced = run_orch("offers", "--gpu", "H100", "--provider", "local", "--epochs", "3", "--dataset-gb", "1")
    assert priced.returncode in (0, 1, 3) and "Traceback" not in priced.stderr, priced.stderr
    assert (orch_home / "ledger.db").exists()  # a job's estimate reads the epoch times measured before


# Those that train or probe torch need it where the test runs.
BENCHES = [pytest.param(p.name, marks=[needs_torch] if p.name in ("reaper_latency.py", "restart_provision.py",
                                                                  "volume_second_run.py") else [])
           for p in sorted((ROOT / "bench").glob("*.py"))]


@pytest.mark.long
@pytest.mark.parametrize("script", BENCHES)
def test_every_bench_runs_in_its_quick_mode(script, tmp_path):
    """A benchmark that no test runs breaks unnoticed (reaper_latency.py imported a module that no
    longer existed). Each prints its figure as a ratio to a baseline measured in the same run.
    On one CPU, as every orch process of the suite (``one_cpu``): the trainings it starts on local
    instances inherit it, and torch's OpenMP threads no longer spin on both cores (one quick
    reaper_latency training took 29 CPU-s unpinned, against 7-8 for the suite's pinned ones)."""
    from tests.conftest import one_cpu

    proc = one_cpu(subprocess.Popen([sys.executable, str(ROOT / "bench" / script), "--quick"], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={**os.environ, "ORCH_HOME": str(tmp_path / "bench-home")}))
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert done.returncode == 0, f"{script}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "x " in done.stdout or "x)" in done.stdout, f"{script} printed no ratio:\n{done.stdout}"


@SQLITE_ONLY
def test_a_scheduled_pass_over_a_settled_fleet_records_itself_and_its_output_can_be_cut_short(tmp_path):
    """What a schedule runs every few minutes, over 400 stopped instances it decided on before: the
    pass keeps every one, says so in ``orch reaper status``, changes nothing, and never needs the
    ledger's models (SQLAlchemy: 0.3 s of CPU a pass); ``orch reap --json | head`` ends quietly."""
    home = tmp_path / "orch"
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'bench'); import fleet; "
            f"fleet.fill(Path({str(home)!r}), 400, settled=True)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
    env = {"ORCH_HOME": str(home), "ORCH_WATCHDOG": "off"}
    before = run_orch("status", "--json", env=env, check=0).stdout
    # The pass in this process, as `orch reap` starts it, to see what it imported.
    probe = ("import sys; sys.argv = ['orch', 'reap']; from orchestrator.cli.main import main; main(); "
             "print('SQLALCHEMY', 'sqlalchemy' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(" keep ") == 400 and "SQLALCHEMY False" in done.stderr, done.stderr[-2000:]
    shown = run_orch("reaper", "status", env=env, check=0).stdout
    assert "400 instance(s), 0 acted on" in shown, shown
    assert run_orch("status", "--json", env=env, check=0).stdout == before  # nothing moved
    for command in (["reap", "--json"], ["status", "--json"]):
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *command], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**os.environ, **env})
        assert proc.stdout.read(10)  # `| head -c 10`: the reader leaves
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 1 and err == "", (command, err)
