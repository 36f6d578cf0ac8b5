"""Several orch processes, one ledger (SQLite here, PostgreSQL for a team): no "database is
locked" reaches a user, every state change is a legal compare-and-set, nothing is destroyed
while another process is making it, and of two racing commands exactly one wins."""

import json
import threading

import pytest

from orchestrator import states
from tests import test_core
from tests.conftest import needs_torch, run_orch
from tests.clouds import legal_path, local_billing, open_orch, orch_proc, runpod, wait_for  # noqa: F401
from tests.postgres import pg_server, pg_url  # noqa: F401

NO_WATCHDOG = {"ORCH_WATCHDOG": "off"}
BAD = ("database is locked", "Traceback", "internal error", "could not serialize", "deadlock")


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request):
    if request.param == "postgresql":
        request.getfixturevalue("pg_url")  # ORCH_DATABASE_URL for this process and every orch it starts
    return request.param


class Background:
    """Keep running orch commands in a loop (reads, reconciles, refreshes) until stopped."""

    def __init__(self, *commands):
        self.commands, self.outputs, self.stop = commands, [], threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.stop.is_set():
            for args in self.commands:
                proc = run_orch(*args, env=NO_WATCHDOG)
                self.outputs.append((args, proc.returncode, proc.stdout + proc.stderr))
            self.stop.wait(2)  # leave the CPUs to the commands under test

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=120)


def slow_to_die(name):
    """A process on the instance that ignores SIGTERM: stopping or destroying it takes seconds."""
    run_orch("ssh", name, "--", "nohup sh -c 'trap \"\" TERM; sleep 300' >/dev/null 2>&1 </dev/null &", check=0)


def race(first_verb, name, ledger, middle_state, *others):
    """``orch FIRST_VERB NAME``, then each of ``others`` at once while the first is under way:
    [(exit code, output)] of the first, then of the others."""
    first = orch_proc(first_verb, name, env=NO_WATCHDOG)
    wait_for(lambda: ledger.by_name(name, live_only=False).state == middle_state, what=f"{name} {middle_state}",
             every=0.1)  # while the first command is under way
    rest = [orch_proc(verb, name, env=NO_WATCHDOG) for verb in others]
    outcomes = []
    for p in (first, *rest):
        out, err = p.communicate(timeout=120)
        outcomes.append((p.returncode, out + err))
    return outcomes


def finish(procs: dict) -> dict:
    return {n: (p.communicate(timeout=300), p.returncode) for n, p in procs.items()}


@pytest.mark.long
@needs_torch
def test_four_ups_a_reaper_and_racing_commands_share_one_ledger(backend, orch_home, runpod):
    fake, env = runpod
    env = {**env, **NO_WATCHDOG}
    names = [f"c{i}" for i in range(4)]
    reaper = orch_proc("reap", "--watch", "--interval", "4", env=env)
    ledger = open_orch().ledger
    with Background(["status"], ["reconcile", "--json"], ["status", "c1", "--json"]) as loop:
        ups = {n: orch_proc("up", n, "--cpu", env=env) for n in names}
        # One more up, on a pod whose SSH port never shows: it stays provisioning for 30 s (long enough,
        # on a loaded machine, for the meddler below to start while it waits).
        fake.runtime_delay = 10**6
        ups["slow"] = orch_proc("up", "slow", "--provider", "runpod", "--cpu", "--ssh-timeout", "0.5", env=env)
        wait_for(lambda: (i := ledger.by_name("slow")) and i.state == states.PROVISIONING, what="slow provisioning",
                 every=0.1)
        meddler = run_orch("down", "slow", env=env)  # someone, or a reaper, destroying it meanwhile
        assert meddler.returncode == 1 and "busy: another orch process" in meddler.stderr, meddler.stderr
        results = finish(ups)
        for n in names:
            assert results[n][1] == 0, f"{n}: {results[n][0]}"
        assert results["slow"][1] == 1 and "did not answer" in results["slow"][0][1]
        assert {i.name: i.state for i in ledger.instances(live_only=True)} == dict.fromkeys(names, states.READY)
        assert fake.live() == [], "the up that failed left its pod billing"

        slow_to_die("c1")
        (rc, out), *losers = race("down", "c1", ledger, states.DESTROYING, "down", "stop")
        assert rc == 0, out
        for rc, err in losers:
            # Busy while the destroy runs; on a loaded machine a loser may start only after it ended,
            # and then finds nothing to act on. Never a second action, never more than one line.
            busy = rc == 1 and "busy: another orch process" in err
            gone = rc == 2 and "no live instance named 'c1'" in err
            assert (busy or gone) and len(err.strip().splitlines()) == 1, err
        assert ledger.by_name("c1") is None

        for n, ((_, err), rc) in finish({n: orch_proc("down", n, env=env) for n in ("c0", "c2", "c3")}).items():
            assert rc == 0, f"{n}: {err}"
    reaper.send_signal(2)
    out, err = reaper.communicate(timeout=60)

    everything = [out + err] + [text for _, _, text in loop.outputs] + ["".join(o) for o, _ in results.values()]
    for text in everything:
        for bad in BAD:
            assert bad not in text, text
    assert len(loop.outputs) >= 3, "the background loop never ran"
    assert local_billing(orch_home) == set()
    slow = ledger.by_name("slow", live_only=False)
    assert legal_path(ledger.events(slow.id)) == ["requested", "provisioning", "destroying", "destroyed"]
    assert "up failed: SSH" in ledger.events(slow.id)[-1].reason
    for inst in ledger.instances():
        path = legal_path(ledger.events(inst.id))
        if inst.name != "slow":
            assert path[:3] == ["requested", "provisioning", "ready"] and path[-1] == "destroyed", (inst.name, path)
        moved_by_others = [e for e in ledger.events(inst.id) if e.actor != "cli" and e.from_state != e.to_state]
        assert moved_by_others == [], f"{inst.name} was moved by {moved_by_others[0].actor}"
    c1 = [e.to_state for e in ledger.events(ledger.by_name("c1", live_only=False).id) if e.from_state != e.to_state]
    assert c1.count("destroying") == 1 and c1.count("destroyed") == 1, "both racing downs acted"


# -- the ledger's own tests on PostgreSQL ---------------------------------------------------------------
@pytest.fixture
def pg_ledger(pg_url):
    from orchestrator.ledger.ledger import Ledger

    return Ledger(pg_url)


def test_the_state_machine_on_postgresql(pg_ledger):
    test_core.test_state_machine_refuses_illegal_and_racing_transitions(pg_ledger)


def test_duplicate_names_on_postgresql(pg_ledger):
    test_core.test_duplicate_live_name_is_refused(pg_ledger)


def test_migrations_reach_head_and_match_the_models_on_postgresql(pg_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    from migrations import HEAD
    from orchestrator.ledger.ledger import Ledger

    led = Ledger(pg_url)
    assert led.revision() == HEAD
    with led.engine.connect() as conn:
        assert conn.dialect.name == "postgresql"
        assert compare_metadata(MigrationContext.configure(conn), SQLModel.metadata) == []
    from migrations import HEAD

    assert f"revision {HEAD}" in run_orch("db", "upgrade", check=0).stdout


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_processes_meeting_a_fresh_ledger_at_once_all_open_it(db, request, tmp_path):
    """Parallel `orch up`s on a new machine (or a new team database) all migrate the same empty
    ledger at once: each one opens it, and the schema is built once (CI met "table jobs already
    exists" when two of them ran migration 0003 side by side)."""
    from migrations import HEAD
    from orchestrator.ledger.ledger import Ledger
    from tests.racers import race

    url = request.getfixturevalue("pg_url") if db == "postgresql" else f"sqlite:///{tmp_path / 'ledger.db'}"
    racers = race(8, "from orchestrator.ledger.ledger import Ledger", f"Ledger({url!r})")  # all open it, together
    assert [r.rc for r in racers] == [0] * 8, "\n".join(r.err for r in racers if r.err)
    assert Ledger(url, upgrade=False).revision() == HEAD


def test_an_upgrade_killed_halfway_leaves_the_ledger_as_it_was_and_the_next_open_finishes_it(tmp_path):
    """A ledger from an older orch (revision 0002, one instance) meets a new orch that is killed in
    the middle of its migrations: the ledger is still the old one, row and all (the migrations are
    one transaction), and the next open brings it to HEAD keeping the row."""
    import signal
    import subprocess
    import sys

    from sqlalchemy import create_engine, text

    import migrations
    from migrations import HEAD
    from orchestrator.ledger.ledger import Ledger
    from tests.conftest import ROOT

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with create_engine(url).begin() as conn:  # what orch at revision 0002 left (no jobs, no groups)
        migrations.upgrade(conn, "0002")
        conn.execute(text("INSERT INTO instances (id, name, provider, label, state, gpus, cpu_only, disk_gb, "
                          "spot, price_hr, stopped_price_hr, protected, created_at, updated_at) VALUES ('i1', "
                          "'kept', 'local', 'orch-i1', 'running', 0, 1, 20, 0, 0.5, 0.01, 0, '2026-01-01', "
                          "'2026-01-01')"))
    code = ("import os, signal\nfrom sqlalchemy import event\nfrom sqlalchemy.engine import Engine\n"
            "@event.listens_for(Engine, 'before_cursor_execute')\n"
            "def kill(conn, cursor, statement, *rest):\n"
            "    if 'ix_instances_group_id' in statement: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"from orchestrator.ledger.ledger import Ledger\nLedger({url!r})\n")
    killed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # it died in migration 0004, after 0003 ran
    assert Ledger(url, upgrade=False).revision() == "0002"
    led = Ledger(url)
    assert led.revision() == HEAD
    assert led.get("i1").name == "kept" and led.jobs() == []


def test_racing_processes_on_postgresql_move_an_instance_once(pg_url):
    """Eight processes try the same compare-and-set at once: one moves it, seven are refused."""
    from orchestrator.ledger.ledger import Ledger
    from tests.racers import race

    led = Ledger(pg_url)
    inst = led.create_instance(name="contended", provider="local", label="")
    racers = race(8, "from orchestrator.ledger.ledger import Ledger; from orchestrator.errors import IllegalTransition",
                  before=f"led = Ledger({pg_url!r})\nled.revision()",  # connected and migrated: then, together
                  body=f"try: led.transition({inst.id!r}, 'provisioning', expect='requested'); print('won')\n"
                       "except IllegalTransition as e: print('lost', e)\n")
    assert [r.rc for r in racers] == [0] * 8, "\n".join(r.err for r in racers if r.err)
    assert sorted(r.out.split()[0] for r in racers) == ["lost"] * 7 + ["won"]
    assert [e.to_state for e in led.events(inst.id)] == ["requested", "provisioning"]


def test_status_and_reconcile_on_postgresql(pg_url, orch_home):
    from orchestrator import config
    from orchestrator.provider import Request
    from providers.local import LocalProvider
    from orchestrator.ledger.ledger import new_id
    from orchestrator.provider import label_for

    LocalProvider({}, orch_home).create(Request(name="pgstray", cpu=True), label_for(new_id(), "pgstray"),
                                        config.ssh_key()[1])
    report = json.loads(run_orch("reconcile", "--json", check=0).stdout)
    assert report["providers"][0]["adopted"] == ["pgstray"]
    status = run_orch("status", check=0).stdout
    assert "pgstray" in status and "reconcile: last ran" in status
    assert not (orch_home / "ledger.db").exists(), "the SQLite ledger was used instead"
    run_orch("down", "pgstray", check=0)
    assert local_billing(orch_home) == set()


def test_a_look_at_a_claim_never_makes_its_claimant_busy(backend, orch_home):
    """``claims.busy`` (every reaper pass, every ``orch status`` sync asks it of each instance) sees
    another process's claim, and changes nothing: it once tried the claim and let it go, and an
    ``orch down`` arriving in between was refused as busy (seen on PostgreSQL, where that took a
    round trip). One process looks as fast as it can while this one claims again and again."""
    import subprocess
    import sys

    from orchestrator.ledger import claims
    from tests.conftest import ROOT

    ledger = open_orch().ledger
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from orchestrator.ledger import claims; from orchestrator.instances.lifecycle import Orch\n"
                               "with claims.hold(Orch.open().ledger, 'y'):\n    print('held', flush=True); sys.stdin.read()\n"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert claims.busy(ledger, "y"), "another process's claim is seen"
    holder.stdin.close()
    holder.wait(timeout=60)
    wait_for(lambda: not claims.busy(ledger, "y"), what="the claim to go with its process")

    looker = subprocess.Popen(
        [sys.executable, "-c", "import time; from orchestrator.ledger import claims; from orchestrator.instances.lifecycle import Orch\n"
                               "led = Orch.open().ledger; n = 0; print('looking', flush=True)\n"
                               "end = time.monotonic() + 4\n"
                               "while time.monotonic() < end:\n    claims.busy(led, 'x'); n += 1\n"
                               "print(n, flush=True)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert looker.stdout.readline().strip() == "looking"
    held = 0
    while looker.poll() is None:
        with claims.hold(ledger, "x"):  # Busy, were a look ever to take the claim from under it
            held += 1
    looks = int(looker.stdout.read().split()[-1])
    assert looker.returncode == 0 and looks > 50 and held > 50, (looks, held)
