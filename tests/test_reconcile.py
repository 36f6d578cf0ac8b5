"""orch reconcile: the ledger and every provider's own list end up telling the same story, and a
provider that cannot answer is never taken for one with nothing on it."""

import json
import subprocess
import sys
from datetime import timedelta

import pytest

from orchestrator import config, states
from orchestrator.ledger import claims
from orchestrator.instances import reconcile as rec
from orchestrator.ledger.ledger import new_id
from orchestrator.provider import Request, label_for
from tests.conftest import ROOT, run_orch
from tests.clouds import arrange, legal_path, local_billing, open_orch, runpod, vast  # noqa: F401

GPU = {"vastai": {"gpu": "RTX 4090"}, "runpod": {}, "local": {}}


def reconciled(orch=None) -> dict:
    """One reconcile pass in this process, as the reaper runs it: {provider: its report}."""
    return {p.provider: p for p in rec.reconcile(orch or open_orch()).providers}


def reconcile_json(env=None, rc=0):
    proc = run_orch("reconcile", "--json", env=env)
    assert proc.returncode == rc, proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    return {p["provider"]: p for p in data["providers"]}, data


def fleet(env=None, all_=False):
    return {r["name"]: r for r in json.loads(run_orch("status", "--json", *(["--all"] if all_ else []), env=env,
                                                      check=0).stdout)}


def test_a_stray_instance_is_adopted_once_then_managed_like_any_other(orch_home):
    from providers.local import LocalProvider

    stray = new_id()
    LocalProvider({}, orch_home).create(Request(name="stray", cpu=True), label_for(stray, "stray"), config.ssh_key()[1])
    assert "reconcile: never run" in run_orch("status", check=0).stdout

    report, data = reconcile_json()
    assert report["local"]["adopted"] == ["stray"] and report["local"]["listed"] == 1 and data["ok"]
    row = fleet()["stray"]
    assert (row["id"], row["state"], row["provider_id"]) == (stray, "ready", label_for(stray, "stray"))
    events = open_orch().ledger.events(stray)
    assert legal_path(events) == ["ready"]
    assert events[0].actor == "reconcile" and "adopted" in events[0].reason and "unknown to this ledger" in events[0].reason

    again, _ = reconcile_json()
    assert again["local"]["adopted"] == [] and list(fleet()) == ["stray"], "adopted twice"
    assert "reconcile: last ran" in run_orch("status", check=0).stdout
    run_orch("down", "stray", check=0)
    assert local_billing(orch_home) == set()


def test_an_instance_gone_behind_orchs_back_is_marked_lost_with_the_time(orch_home):
    orch = open_orch()
    inst = arrange(orch, "gone")
    orch.provider("local").destroy(inst.provider_id)  # the provider's console, or its own reaper
    assert reconciled(orch)["local"].lost == ["gone"]
    last = orch.ledger.events(inst.id)[-1]
    assert (last.to_state, last.actor) == ("lost", "reconcile") and "gone at the provider" in last.reason
    assert abs(last.at.replace(tzinfo=None) - orch.ledger.get(inst.id).updated_at.replace(tzinfo=None)) < timedelta(seconds=1)
    assert fleet(all_=True)["gone"]["state"] == "lost"


@pytest.mark.parametrize("provider", ["runpod", "vastai"])
def test_a_failed_listing_is_reported_and_nothing_is_taken_for_gone(orch_home, request, provider):
    fake, env = request.getfixturevalue("runpod" if provider == "runpod" else "vast")
    orch = open_orch()
    inst = arrange(orch, "kept", provider, **GPU[provider])
    orch.provider(provider).destroy(inst.provider_id)  # gone for real: only the listing could tell
    if provider == "runpod":
        fake.fail_listing = 100
    else:
        fake.fail_listing(times=100)

    proc = run_orch("reconcile", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(provider))
    assert "listing failed" in line and "left alone: kept" in line, proc.stdout
    assert "in step" in next(x for x in proc.stdout.splitlines() if x.startswith("local"))
    assert orch.ledger.get(inst.id).state == states.READY, "a failed listing was read as an empty fleet"
    assert f"could not check {provider}" in run_orch("status", check=0).stdout

    if provider == "runpod":
        fake.fail_listing = 0
    else:
        fake._faults.clear()
    assert reconciled(orch)[provider].lost == ["kept"]


def test_a_listing_that_answers_without_pods_is_a_failure_too(orch_home, runpod):
    fake, _ = runpod
    fake.fail_listing, fake.listing_failure = 1, "null"
    report = rec.reconcile(open_orch(), ["runpod"])
    assert not report.ok and "without pods" in report.providers[0].error


def test_requested_rows_are_settled_by_their_label(orch_home, runpod):
    fake, _ = runpod
    orch = open_orch()
    made = orch.ledger.create_instance(name="made", provider="runpod", label="", cpu_only=True)
    # The create went through; the orch that asked died before it could write the pod down.
    orch.provider("runpod").create(Request(name="made", cpu=True), made.label, config.ssh_key()[1])
    never = orch.ledger.create_instance(name="never", provider="runpod", label="", cpu_only=True)

    rp = reconciled(orch)["runpod"]
    assert (rp.found, rp.failed, rp.abandoned, rp.adopted) == (["made"], ["never"], ["made"], [])
    assert orch.ledger.get(made.id).provider_id == fake.live()[0].id and len(fake.live()) == 1
    assert legal_path(orch.ledger.events(made.id)) == ["requested", "provisioning"]
    assert "never created at runpod" in orch.ledger.events(never.id)[-1].reason
    assert orch.ledger.get(never.id).state == states.FAILED


def test_a_half_made_instance_is_kept_for_a_resume_then_destroyed_after_its_idle_minutes(orch_home, monkeypatch):
    orch = open_orch()
    half = orch.ledger.create_instance(name="half", provider="local", label="", cpu_only=True)
    remote = orch.provider("local").create(Request(name="half", cpu=True), half.label, config.ssh_key()[1])
    orch.move(half, states.PROVISIONING, "created", provider_id=remote.provider_id)

    first = rec.reconcile(orch).providers[0]
    assert first.abandoned == ["half"] and first.destroyed == []
    from orchestrator.instances import sync

    later = sync._now() + timedelta(minutes=11)  # past the default 10 idle minutes
    monkeypatch.setattr(sync, "_now", lambda: later)
    second = rec.reconcile(orch).providers[0]
    assert second.destroyed == ["half"] and local_billing(orch_home) == set()
    why = orch.ledger.events(half.id)[-2].reason
    assert "interrupted `orch up`" in why and "never verified" in why


def test_an_instance_another_orch_is_working_on_is_left_alone(orch_home):
    orch = open_orch()
    inst = arrange(orch, "held")
    orch.provider("local").destroy(inst.provider_id)
    code = ("import sys, time; from orchestrator.ledger import claims; from orchestrator.instances.lifecycle import Orch\n"
            "with claims.hold(Orch.open().ledger, 'held'):\n    print('held', flush=True); time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        report, _ = reconcile_json()
        assert report["local"]["busy"] == ["held"] and report["local"]["lost"] == []
        assert fleet()["held"]["state"] == "ready"
        assert json.loads(run_orch("status", "held", "--json", check=0).stdout)["state"] == "ready"
        proc = run_orch("down", "held")
        assert proc.returncode == 1 and "busy: another orch process" in proc.stderr
    finally:
        holder.kill()  # as a crash would: the claim goes with the process
        holder.wait()
    assert not claims.busy(orch.ledger, "held")
    assert reconciled(orch)["local"].lost == ["held"]


def test_an_interrupted_destroy_is_finished_and_an_interrupted_stop_settled(orch_home):
    orch = open_orch()
    dying = orch.move(arrange(orch, "dying"), states.DESTROYING, "destroyed by the user")  # then orch died
    halted = orch.move(arrange(orch, "halted"), states.STOPPING, "stopped by the user")
    report = reconciled(orch)["local"]
    assert report.destroyed == ["dying"] and report.settled == ["halted: stopping -> ready"]
    assert local_billing(orch_home) == {orch.ledger.get(halted.id).label}
    assert legal_path(orch.ledger.events(dying.id))[-2:] == ["destroying", "destroyed"]
    assert "interrupted stop left it running" in orch.ledger.events(halted.id)[-1].reason


def test_a_provider_without_its_key_is_reported_when_the_ledger_has_instances_there(orch_home):
    assert [line.split()[0] for line in run_orch("reconcile", check=0).stdout.splitlines()] == ["local"]
    orch = open_orch()
    far = orch.ledger.create_instance(name="far", provider="runpod", label="")
    orch.move(far, states.PROVISIONING, "created elsewhere", provider_id="pod123")
    proc = run_orch("reconcile")
    assert proc.returncode == 1
    line = next(x for x in proc.stdout.splitlines() if x.startswith("runpod"))
    assert "no RunPod API key" in line and "left alone: far" in line
    assert orch.ledger.get(far.id).state == states.PROVISIONING


@pytest.mark.parametrize("provider", ["runpod", "vastai"])
def test_a_duplicate_and_a_resurrected_instance_are_adopted_never_ignored(orch_home, request, provider):
    request.getfixturevalue("runpod" if provider == "runpod" else "vast")
    orch = open_orch()
    cloud = orch.provider(provider)
    req = Request(name="twin", cpu=provider == "runpod", **GPU[provider])
    twin = arrange(orch, "twin", provider, **GPU[provider])
    cloud.create(req, twin.label, config.ssh_key()[1])  # a second one under the same label
    ghost = arrange(orch, "ghost", provider, **({"gpu": "RTX 3090"} if provider == "vastai" else {}))
    orch.move(orch.move(ghost, states.DESTROYING, "test"), states.DESTROYED, "marked gone, never terminated")

    adopted = sorted(reconciled(orch)[provider].adopted)
    assert len(adopted) == 2 and adopted[0] == "ghost" and adopted[1].startswith("twin-"), adopted
    live = orch.ledger.instances(live_only=True, provider=provider)
    at_provider = {r.provider_id for r in cloud.list()}
    assert sorted(i.provider_id for i in live) == sorted(at_provider) and len(at_provider) == 3
    resurrected = next(i for i in live if i.name == "ghost")
    assert resurrected.id != ghost.id
    assert "though the ledger recorded it destroyed" in orch.ledger.events(resurrected.id)[0].reason
    for inst in live:
        orch.down(inst)
    assert cloud.list() == []


def test_an_adopted_pod_that_never_answers_ssh_gets_ups_deadline_then_is_destroyed(orch_home, runpod):
    """A pod orch's label names, found by reconcile, whose container never starts (runtime null for
    ever, as on a host whose driver is older than the image's CUDA): adopted, then given the SSH
    deadline a fresh `orch up` gets (``ssh_timeout_minutes``, here 3 s), then destroyed, the event
    saying why. One whose container starts late answers in time and is kept."""
    from tests.clouds import configure, wait_for

    fake, _ = runpod
    configure(orch_home, ssh_timeout_minutes=0.05)
    orch = open_orch()
    cloud = orch.provider("runpod")
    stuck, late = new_id(), new_id()
    for iid, name in ((stuck, "stuck"), (late, "late")):
        made = cloud.create(Request(name=name, cpu=True), label_for(iid, name), config.ssh_key()[1])
        fake.pods[made.provider_id].stuck = True  # "OCI runtime create failed": RUNNING, no runtime

    assert sorted(reconciled(orch)["runpod"].adopted) == ["late", "stuck"]
    for iid in (stuck, late):
        row = orch.ledger.get(iid)
        assert row.state == states.READY and row.ssh_host is None and "unreached_since" in (row.memory or "")
    assert reconciled(orch)["runpod"].destroyed == [], "within its deadline it is kept"
    fake.pods[orch.ledger.get(late).provider_id].stuck = False  # its container starts after all
    assert reconciled(orch)["runpod"].destroyed == []
    answered = orch.ledger.get(late)
    assert answered.ssh_host and "unreached_since" not in (answered.memory or ""), "an ordinary ready instance now"
    assert "answers SSH" in orch.ledger.events(late)[-1].reason

    def ended() -> bool:  # a reaper pass reconciles first: one pass after another
        reconciled(orch)
        return orch.ledger.get(stuck).state == states.DESTROYED

    wait_for(ended, timeout=30, what="the adopted pod's SSH deadline")
    events = orch.ledger.events(stuck)
    assert legal_path(events)[-3:] == ["ready", "destroying", "destroyed"]
    why = events[-1].reason
    assert "adopted, never reachable" in why and "ssh_timeout_minutes" in why and "container not started" in why, why
    assert [p.id for p in fake.live()] == [answered.provider_id]
    assert orch.ledger.get(late).state == states.READY
    orch.down(orch.ledger.get(late))
    assert fake.live() == []
