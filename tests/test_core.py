"""The core promise: up -> ssh -> stop -> start -> down on real sshd instances, all in the ledger."""

import json
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import needs_torch, run_orch
from orchestrator import states
from providers import local as sshd
from orchestrator.errors import IllegalTransition


def live_dir(home, name):
    dirs = [d for d in (home / "local").iterdir() if d.name.endswith(f"-{name}")]
    assert len(dirs) == 1, dirs
    return dirs[0]


@needs_torch
def test_local_lifecycle_end_to_end(orch_home):
    up = run_orch("up", "box1", "--cpu", "--json", check=0)
    inst = json.loads(up.stdout)
    assert inst["state"] == "ready" and inst["provider"] == "local"
    assert inst["device"].startswith("cpu") and "matmul sum" in inst["device"]
    root = live_dir(orch_home, "box1")
    iid = inst["id"]

    assert run_orch("ssh", "box1", "--", "echo", "hello from", "$ORCH_INSTANCE_ID", check=0).stdout.strip() \
        == f"hello from {iid}"
    run_orch("ssh", "box1", "--", "echo kept > disk.txt; nohup sleep 600 >/dev/null 2>&1 </dev/null &", check=0)
    assert sshd.instance_pids(iid), "the nohup'd job should be running on the instance"

    assert "stopped" in run_orch("stop", "box1", check=0).stdout
    assert not sshd.running(root)
    assert sshd.instance_pids(iid) == [], "stop must end every process of the instance"
    assert (root / "home" / "disk.txt").exists()
    status = json.loads(run_orch("status", "--json", check=0).stdout)
    assert [(i["name"], i["state"]) for i in status] == [("box1", "stopped")]

    run_orch("start", "box1", check=0)
    assert run_orch("ssh", "box1", "--", "cat", "disk.txt", check=0).stdout.strip() == "kept"

    run_orch("down", "box1", check=0)
    assert not root.exists()
    assert sshd.instance_pids(iid) == []
    assert json.loads(run_orch("status", "--json", check=0).stdout) == []
    detail = json.loads(run_orch("status", "box1", "--json", check=0).stdout)
    path = [e["to"] for e in detail["events"]]
    assert path == ["requested", "provisioning", "ready", "stopping", "stopped", "starting", "ready",
                    "destroying", "destroyed"]
    assert {e["actor"] for e in detail["events"]} == {"cli"}


def test_a_stopping_local_instance_is_reported_stopped_only_once_nothing_of_it_runs(orch_home):
    """As a cloud says 'stopped' only after the machine is down: a process of the instance that
    ignores SIGTERM (killed after the grace) keeps it reported running, so a watchdog's stop seen
    from outside, or a start right after, never meets a process of the stop still dying."""
    import threading

    from orchestrator import config
    from orchestrator.ledger.ledger import new_id
    from orchestrator.provider import Request, Status, label_for

    prov = sshd.LocalProvider({}, orch_home)
    iid = new_id()
    pid = prov.create(Request(name="slowstop", cpu=True), label_for(iid, "slowstop"), config.ssh_key()[1]).provider_id
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; echo up; while :; do sleep 0.05; done"],
                                env={"PATH": "/usr/bin:/bin", "ORCH_INSTANCE_ID": iid}, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        assert stubborn.stdout.readline().strip() == "up" and sshd.instance_pids(iid)
        stop = threading.Thread(target=prov.stop, args=(pid,))
        stop.start()
        seen = []
        while stop.is_alive():
            seen.append((prov.get(pid).status, bool(sshd.instance_pids(iid))))
        stop.join()
        assert (Status.STOPPED, True) not in seen, [k for i, k in enumerate(seen) if i == 0 or seen[i - 1] != k]
        assert prov.get(pid).status == Status.STOPPED and sshd.instance_pids(iid) == []
    finally:
        stubborn.kill()
        stubborn.wait()
        prov.destroy(pid)


@needs_torch
def test_provision_twice_installs_nothing_and_verify_runs_on_cpu(orch_home):
    from playbooks.provision import provision, verify
    from tests.clouds import arrange, open_orch

    orch = open_orch()
    inst = arrange(orch, "twice")  # not provisioned yet: the first provision below is its first
    with orch.connect(inst) as c:
        first = provision(c, gpu=False)
        second = provision(c, gpu=False)
        proof = verify(c, gpu=False)
    assert second["installed"] == [] and first["torch"] == second["torch"]
    assert second["packages"]["libreyolo"] and second["python"]
    assert proof["device"].startswith("cpu") and proof["result"] > 0
    orch.down(inst)


@needs_torch
def test_the_provisioning_a_kind_asks_for_is_run_once_ssh_answers_and_again_after_a_start(orch_home):
    """The lifecycle runs what the job kind said (``JobKind.provisioning``), not "LibreYOLO or
    nothing": its packages over torch, the matmul proof, and the same again after a start, because
    the row remembers it (a stop can wipe what was installed)."""
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Request
    from orchestrator.provisioning import Provisioning

    lines: list[str] = []
    orch = Orch.open(say=lines.append)
    steps = Provisioning(packages=("tenacity",), says="torch for the device, then tenacity")  # in the instance's Python
    inst = orch.up("kindbox", "local", Request(name="kindbox", cpu=True), prepare=steps)
    assert inst.state == states.READY and "matmul sum" in inst.device
    assert "[3/4] provisioning (torch for the device, then tenacity)" in lines, lines
    assert "[4/4] verifying: a 2000x2000 matmul on the device" in lines
    lines.clear()
    orch.stop(inst)
    inst = orch.start(orch.ledger.get(inst.id))
    assert inst.state == states.READY and "[3/4] provisioning (torch for the device, then tenacity)" in lines, lines
    orch.down(inst)


@pytest.mark.parametrize("memory", [{"packages": ["--index-url=http://x", "libreyolo"], "says": "x"},
                                    {"packages": ["libreyolo"], "says": "x", "pip": "-e /tmp/x"},
                                    {"packages": "libreyolo", "says": "x"}, "libreyolo"])
def test_a_provisioning_a_row_remembers_is_held_to_what_orch_writes(memory):
    """A row's memory is input (a shared ledger): what it says to install is an import name or refused,
    never a pip option, a path or a URL."""
    from orchestrator.errors import OrchError
    from orchestrator.provisioning import MACHINE, recalled, remembered

    with pytest.raises(OrchError):
        recalled(memory)
    assert recalled(remembered(MACHINE)) == MACHINE and recalled(remembered(None)) is None


def _probe(tmp, **env):
    """probe.py as provisioning runs it, with its proofs kept under ``tmp``: (its answer, whether it imported torch)."""
    import os

    from playbooks.host import ON_INSTANCE

    done = subprocess.run([sys.executable, "-X", "importtime", str(ON_INSTANCE / "probe.py"), "cpu", "libreyolo"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", **env})
    line = next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("ORCH_RESULT "))
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in done.stderr.splitlines() if ln.startswith("import time:")}
    return json.loads(line.split(" ", 1)[1]), "torch" in imported


@needs_torch
def test_a_proof_holds_for_its_boot_and_is_made_anew_where_it_cannot_be_trusted(tmp_path):
    """A provisioning again in the same boot, on the same Python and torch, answers with the proof
    made then, and imports no torch; a stale proof, one in a folder another user could write, or
    ORCH_FRESH_PROOF=1 is proved anew."""
    import os
    import time

    first, imported = _probe(tmp_path)
    assert imported and first["proof"]["ok"] and "proved_at" not in first["proof"]
    again, imported = _probe(tmp_path)
    assert not imported, "the second probe of the boot imported torch"
    assert again["proof"]["result"] == first["proof"]["result"] and again["torch"] == first["torch"]
    assert abs(again["proof"]["proved_at"] - time.time()) < 300 and again["packages"] == first["packages"]

    fresh, imported = _probe(tmp_path, ORCH_FRESH_PROOF="1")
    assert imported and "proved_at" not in fresh["proof"]

    folder = tmp_path / f"orch-proof-{os.getuid()}"
    (kept,) = folder.glob("*.json")
    record = json.loads(kept.read_text())
    kept.write_text(json.dumps({**record, "at": time.time() - 2 * 3600}))  # made two hours ago
    stale, imported = _probe(tmp_path)
    assert imported and "proved_at" not in stale["proof"]

    folder.chmod(0o777)  # anyone could have planted it
    planted, imported = _probe(tmp_path)
    assert imported and "proved_at" not in planted["proof"]


@needs_torch
def test_gpu_verify_failure_destroys_what_it_created(orch_home):
    """A provider that claims a GPU the machine does not have: verify fails, nothing is left billing."""
    from orchestrator.provider import plugins
    from orchestrator.errors import OrchError
    from tests.clouds import provider_installed
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Capabilities, Request
    from providers.local import LocalProvider

    class ClaimsGPU(LocalProvider):
        name = "claimsgpu"
        gpus = ["Imaginary GPU"]
        capabilities = Capabilities(cpu_only=True, gpu=True)

    with provider_installed(ClaimsGPU):
        assert "claimsgpu" in plugins.providers(), "a provider registered through the hook is found"
        orch = Orch.open(say=lambda m: None)
        with pytest.raises(OrchError, match="verify failed on the GPU|no working NVIDIA GPU"):
            orch.up("gpubox", "claimsgpu", Request(name="gpubox", gpu="Imaginary GPU"))
        inst = orch.ledger.by_name("gpubox", live_only=False)
        assert inst.state == states.DESTROYED
        last = orch.ledger.events(inst.id)[-1]
        assert "verify failed" in last.reason or "no working NVIDIA GPU" in last.reason
        assert not (orch_home / "local" / inst.label).exists()
        assert sshd.instance_pids(inst.id) == []


def test_state_machine_refuses_illegal_and_racing_transitions(ledger):
    inst = ledger.create_instance(name="sm", provider="local", label="")
    with pytest.raises(IllegalTransition):
        ledger.transition(inst.id, states.READY)  # requested -> ready skips provisioning
    ledger.transition(inst.id, states.PROVISIONING, expect=states.REQUESTED)
    with pytest.raises(IllegalTransition):  # a second process that also saw "requested" loses
        ledger.transition(inst.id, states.PROVISIONING, expect=states.REQUESTED)
    ledger.transition(inst.id, states.DESTROYING)
    ledger.transition(inst.id, states.DESTROYED)
    for to in states.TRANSITIONS:
        with pytest.raises(IllegalTransition):
            ledger.transition(inst.id, to)
    assert [e.to_state for e in ledger.events(inst.id)] == ["requested", "provisioning", "destroying", "destroyed"]
    for src, nexts in states.TRANSITIONS.items():
        assert all(n in states.TRANSITIONS for n in nexts), src


def test_duplicate_live_name_is_refused(ledger):
    from orchestrator.errors import UsageError

    ledger.create_instance(name="dup", provider="local", label="")
    with pytest.raises(UsageError, match="already exists"):
        ledger.create_instance(name="dup", provider="local", label="")


def test_migrations_reach_head_and_match_the_models(tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    from migrations import HEAD
    from orchestrator.ledger.ledger import Ledger

    led = Ledger(f"sqlite:///{tmp_path / 'empty.db'}")
    assert led.revision() == HEAD
    with led.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == []
    assert (tmp_path / "empty.db").stat().st_mode & 0o777 == 0o600
    with sqlite3.connect(tmp_path / "empty.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_db_upgrade_command(orch_home):
    from migrations import HEAD

    out = run_orch("db", "upgrade", check=0)
    assert f"revision {HEAD}" in out.stdout
    assert (orch_home / "ledger.db").stat().st_mode & 0o777 == 0o600


BAD = [
    (["up", "x1", "--provider", "nosuch"], "unknown provider"),
    (["up", "Bad_Name!"], "invalid name"),
    (["up", "x2", "--cpu", "--disk", "-5"], "--disk"),
    (["up", "x3", "--cpu", "--disk", "999999"], "--disk"),
    (["up", "x4", "--gpus", "0"], "--gpus"),
    (["up", "x5", "--gpu", "RTX 4090"], "GPU"),
    (["up", "x6", "--cpu", "--gpu", "RTX 4090"], "exclude"),
    (["stop", "nosuch"], "no live instance"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(orch_home, args, needle):
    proc = run_orch(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (orch_home / "local").exists() or not any((orch_home / "local").iterdir())
    assert json.loads(run_orch("status", "--all", "--json", check=0).stdout) == []


def test_unreadable_config_is_a_clear_error(orch_home):
    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (orch_home / "config.toml").write_text("default_provider = [broken\n")
    proc = run_orch("up", "x", "--cpu")
    assert proc.returncode == 2 and "config.toml" in proc.stderr and "Traceback" not in proc.stderr
    (orch_home / "config.toml").write_text('no_such_setting = 1\n')
    proc = run_orch("status")
    assert proc.returncode == 2 and "unknown setting" in proc.stderr


def test_duplicate_live_name_from_the_cli(orch_home, ledger):
    ledger.create_instance(name="taken", provider="local", label="")
    proc = run_orch("up", "taken", "--cpu")
    assert proc.returncode == 2 and "already exists" in proc.stderr


@pytest.mark.parametrize("argv", [["--help"], ["status"], ["status", "--json"]])
def test_fast_commands_import_no_heavy_modules(orch_home, argv):
    code = ("import sys; from orchestrator.cli.main import main\n"
            f"sys.argv = ['orch', *{argv!r}]\ntry: main()\nexcept SystemExit: pass\n"
            "heavy = [m for m in ('runpod', 'vastai', 'torch', 'fabric', 'paramiko') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY []"
