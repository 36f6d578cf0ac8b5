"""Issue 13's "Done when", through the ``orch`` CLI (separate processes), against the fake Vast.ai as
Vast behaves (tests/fakes/vast_api.py): the direct SSH route silent, the proxy working, starts that
wait for their GPU (scheduling), crashed containers that still bill, offers taken under a create.

Instances are made with ``Orch.up(..., prepare=None)``, what ``orch check --live`` does: rented,
reached over SSH and recorded exactly as ``orch up`` does, without provisioning a GPU stack that
these hosts cannot verify. Everything checked after that is what a user would run and read.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from orchestrator.money import policy as policies
from orchestrator import states
from orchestrator.provider import Request, Status
from tests.clouds import open_orch, orch_proc, vast, wait_for  # noqa: F401  (fixtures)
from tests.conftest import run_orch
from tests.fakes.hosts import sshd_available
from tests.fakes.vast_api import PROXY_HOST

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs root, sshd and unshare")

NO_WATCHDOG = {"ORCH_WATCHDOG": "off"}  # the watchdog has its own tests; here it would only cost time


@pytest.fixture(autouse=True)
def _no_watchdog(monkeypatch):
    monkeypatch.setenv("ORCH_WATCHDOG", "off")


def rent(name: str):
    """A ready Vast.ai instance, made as `orch up` makes one (minus provisioning)."""
    orch = open_orch()
    return orch.up(name, "vastai", Request(name=name, gpu="RTX 4090"), ssh_timeout=60, prepare=None)


def detail(name: str, env: dict) -> dict:
    return json.loads(run_orch("status", name, "--json", env=env, check=0).stdout)


def fleet(env: dict) -> dict:
    return {i["name"]: i for i in json.loads(run_orch("status", "--json", env=env, check=0).stdout)}


def ssh_echo(name: str, env: dict, word: str = "hello") -> str:
    proc = run_orch("ssh", name, "--", "echo", word, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def moves(name: str, env: dict) -> list[str]:
    return [e["to"] for e in detail(name, env)["events"] if e["from"] != e["to"]]


# -- the SSH route ------------------------------------------------------------------------------
def test_a_created_instance_keeps_its_proxy_endpoint_across_processes(vast):
    fake, env = vast
    inst = rent("px")
    row = fake.instances[int(inst.provider_id)]
    assert (inst.ssh_host, inst.ssh_port) == (PROXY_HOST, row["ssh_port"]), "the route that answered"
    proxy = f"{PROXY_HOST}:{row['ssh_port']}"

    assert proxy in detail("px", env)["ssh"]  # a new process syncs with Vast: the route is kept
    reap = run_orch("reap", "--json", env=env, check=0)
    assert [o["action"] for o in json.loads(reap.stdout)] == ["keep"]
    assert proxy in fleet(env)["px"]["ssh"]
    assert ssh_echo("px", env) == "hello"
    assert not [e for e in detail("px", env)["events"] if "stopped answering" in e["reason"]]


def test_an_adopted_instance_gets_the_proxy_and_orch_ssh_works_from_a_new_process(vast):
    fake, env = vast
    inst = rent("adopt")
    ledger = open_orch().ledger
    with ledger.engine.begin() as db:  # the ledger row is lost (another laptop's ledger, a restore)
        for table, column in (("events", "instance_id"), ("runs", "instance_id"), ("instances", "id")):
            db.exec_driver_sql(f"DELETE FROM {table} WHERE {column} = ?", (inst.id,))
    assert "adopt" not in fleet(env)

    report = json.loads(run_orch("reconcile", "--json", env=env, check=0).stdout)
    assert next(p for p in report["providers"] if p["provider"] == "vastai")["adopted"] == ["adopt"]
    row = fake.instances[int(inst.provider_id)]
    assert f"{PROXY_HOST}:{row['ssh_port']}" in fleet(env)["adopt"]["ssh"]
    assert ssh_echo("adopt", env, "adopted") == "adopted"  # first thing after the adoption, nothing pinned yet
    assert ssh_echo("adopt", env, "again") == "again"  # the host key pinned at first contact holds
    shown = detail("adopt", env)
    assert shown["state"] == "ready" and f"{PROXY_HOST}:{row['ssh_port']}" in shown["ssh"]
    assert f"{PROXY_HOST}:{row['ssh_port']}" in fleet(env)["adopt"]["ssh"]


# -- starts that wait for their GPU ---------------------------------------------------------------
def test_a_start_that_schedules_for_a_while_succeeds(vast):
    fake, env = vast
    inst = rent("sch")
    run_orch("stop", "sch", env=env, check=0)
    # Someone else's job holds the host's GPU for a few looks (counted in looks, not seconds: a
    # loaded machine may take seconds just to start `orch`).
    fake.gpu_taken(inst.provider_id, polls=3)
    proc = run_orch("start", "sch", "--timeout", "2", env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "waits for a GPU" in proc.stderr
    path = moves("sch", env)
    assert path[-4:] == ["starting", "scheduling", "starting", "ready"], path
    assert ssh_echo("sch", env) == "hello"
    assert f"{PROXY_HOST}:{fake.instances[int(inst.provider_id)]['ssh_port']}" in detail("sch", env)["ssh"]


@pytest.mark.long
def test_a_start_that_schedules_for_ever_is_stopped_again_within_the_bounded_wait(vast):
    fake, env = vast
    inst = rent("never")
    run_orch("stop", "never", env=env, check=0)
    fake.gpu_taken(inst.provider_id)  # for good
    began = time.monotonic()
    proc = orch_proc("start", "never", "--timeout", "0.15", env=env)  # 9 s
    wait_for(lambda: fleet(env)["never"]["state"] == "scheduling", timeout=30, what="orch status to say scheduling")
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - began
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "stopped it again" in err and "--timeout" in err, err
    assert took < 9 + 20, f"the bounded wait took {took:.0f} s"
    remote = open_orch().provider("vastai").get(inst.provider_id)
    assert remote.status == Status.STOPPED, "left scheduling at Vast: it would start later, unwatched"
    assert fake.instances[int(inst.provider_id)]["intended_status"] == "stopped"
    shown = detail("never", env)
    assert shown["state"] == "stopped" and "no GPU within" in shown["events"][-1]["reason"]
    assert moves("never", env)[-3:] == ["starting", "scheduling", "stopped"]
    fake.free_gpu(inst.provider_id)
    assert fake.instances[int(inst.provider_id)]["intended_status"] == "stopped"  # nothing starts it later


@pytest.mark.long
def test_stopped_in_the_ledger_and_running_at_vast_is_billing_and_the_reaper_stops_it(vast):
    fake, env = vast
    inst = rent("unatt")
    run_orch("stop", "unatt", env=env, check=0)
    from vastai import VastAI

    VastAI(api_key=fake.key, server_url=fake.url, retry=1).start_instance(int(inst.provider_id))  # Vast's console

    wait_for(lambda: detail("unatt", env)["state"] == "unattended", timeout=30, what="orch status to see it run")
    text = run_orch("status", "unatt", env=env, check=0).stdout
    assert "RUNNING and BILLING" in text
    assert fleet(env)["unatt"]["state"] == "unattended"
    first = json.loads(run_orch("reap", "--json", env=env, check=0).stdout)
    assert [(o["name"], o["action"]) for o in first] == [("unatt", "keep")]  # its idle minutes not up yet

    orch = open_orch()
    orch.ledger.update(inst.id, policy=policies.Policy(idle_minutes=0.02, on_idle="stop").to_json())
    time.sleep(1.5)
    second = json.loads(run_orch("reap", "--json", env=env, check=0).stdout)
    assert [(o["name"], o["action"], o["acted"]) for o in second] == [("unatt", "stop", True)], second
    assert "running at the provider" in second[0]["reason"]
    assert orch.provider("vastai").get(inst.provider_id).status == Status.STOPPED
    assert detail("unatt", env)["state"] == "stopped"


# -- states that still bill -----------------------------------------------------------------------
def test_a_crashed_instance_shows_in_orch_status_and_orch_reap_destroys_it(vast):
    fake, env = vast
    inst = rent("crash")
    fake.crash(inst.provider_id, "exited")  # the container's process died: Vast still bills it
    shown = detail("crash", env)
    assert shown["state"] == "broken" and "exited" in shown["events"][-1]["reason"], shown["events"][-1]
    assert fleet(env)["crash"]["state"] == "broken"
    assert "container exited" in run_orch("status", "crash", env=env, check=0).stdout

    run_orch("protect", "crash", env=env, check=0)
    held = json.loads(run_orch("reap", "--json", env=env, check=0).stdout)
    assert [(o["action"], o["acted"]) for o in held] == [("report", False)] and fake.live()
    run_orch("unprotect", "crash", env=env, check=0)
    out = json.loads(run_orch("reap", "--json", env=env, check=0).stdout)
    assert [(o["name"], o["action"], o["acted"]) for o in out] == [("crash", "destroy", True)], out
    assert fake.live() == [] and detail("crash", env)["state"] == "destroyed"


def test_a_reaper_pass_lists_vast_once(vast):
    """The reconcile that opens a pass (adoption) and the pass itself read one listing: a fleet's
    pass costs one listing per provider, not two (Vast's search and list calls are rate-limited)."""
    fake, env = vast
    rent("once")
    listings = lambda: len(fake.calls("GET", r"^/api/v1/instances/$"))  # noqa: E731
    before = listings()
    out = json.loads(run_orch("reap", "--json", env=env, check=0).stdout)
    assert [o["name"] for o in out] == ["once"] and listings() - before == 1, out


@pytest.mark.parametrize("state", ["offline", "frozen"])
def test_a_host_that_dropped_or_froze_is_broken_too(vast, state):
    fake, env = vast
    inst = rent("drop")
    fake.crash(inst.provider_id, state)
    shown = detail("drop", env)
    assert shown["state"] == "broken" and state in shown["events"][-1]["reason"]
    assert shown["price_hr"] == pytest.approx(inst.price_hr)  # priced as running, not as storage
    run_orch("reap", env=env, check=0)
    assert fake.live() == []


# -- creates ---------------------------------------------------------------------------------------
def test_a_create_on_a_just_taken_offer_creates_nothing(vast):
    fake, env = vast
    fake.take_after_search(1001)
    proc = run_orch("up", "taken", "--provider", "vastai", "--offer", "1001", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "taken" in proc.stderr, proc.stderr
    [create] = fake.calls("PUT", r"^/api/v0/asks/1001/$")
    assert create.body["cancel_unavail"] is True
    assert fake.live() == [] and fleet(env) == {}
    assert json.loads(run_orch("status", "--all", "--json", env=env, check=0).stdout)[0]["state"] == "failed"


def test_a_create_error_that_made_an_instance_destroys_it_and_says_which(vast):
    fake, env = vast
    fake.min_bid_rises_after_search(1001, 0.50)  # a bid made from the search is too low by the create
    proc = run_orch("up", "lowbid", "--provider", "vastai", "--offer", "1001", "--spot", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    made = re.search(r"instance (\d+)", proc.stderr)
    assert made and int(made[1]) in fake.instances, proc.stderr
    assert fake.calls("DELETE", rf"^/api/v0/instances/{made[1]}/$") and fake.live() == []
    ended = json.loads(run_orch("status", "--all", "--json", env=env, check=0).stdout)
    assert [i["state"] for i in ended] == ["failed"]
    reason = json.loads(run_orch("status", "lowbid", "--json", env=env, check=0).stdout)["events"][-1]["reason"]
    assert made[1] in reason, "the id the error carried is in the ledger"


def test_orch_check_live_passes_against_vast_as_it_behaves(vast):
    fake, env = vast
    proc = run_orch("check", "vastai", "--live", "--json", env=env, timeout=300)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"], report["steps"]
    assert {s["name"] for s in report["steps"]} >= {"stop", "start", "down"}
    assert fake.live() == []
    assert states.DESTROYED in {i["state"] for i in json.loads(run_orch("status", "--all", "--json", env=env,
                                                                            check=0).stdout)}
