"""``orch check runpod [--live]`` against the fake RunPod (real SDK, real sshd pods whose login shell is
bash): the whole cycle passes and leaves no pod; a fault in any step fails that step, by name, and
still leaves no pod."""

from __future__ import annotations

import json

import pytest

from orchestrator import states
from tests.clouds import configure, open_orch, runpod  # noqa: F401 - fixture
from tests.conftest import run_orch

STEPS = ["key", "offers", "ssh key", "rent", "detach", "stop", "start", "down"]
# A setsid that starts nothing: the image's own tool, broken (hosts.py writes it over the image's).
BROKEN_SETSID = {"/usr/bin/setsid": {"text": "#!/bin/sh\nexit 1\n", "mode": "755"}}


def check(env, *args):
    proc = run_orch("check", "runpod", *args, "--json", env=env, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, json.loads(proc.stdout)


def test_without_live_nothing_is_rented_and_spot_is_listed_as_missing(runpod):
    fake, env = runpod
    proc, report = check(env)
    assert proc.returncode == 0 and report["ok"], proc.stderr
    assert [s["name"] for s in report["steps"]] == ["key", "offers", "ssh key"]
    assert report["cannot"] == ["spot"]
    assert fake.sent("POST", "/v2/pods") == [] and fake.pods == {}


def test_live_check_runs_the_whole_cycle_and_leaves_no_pod(runpod):
    fake, env = runpod
    proc, report = check(env, "--live")
    assert proc.returncode == 0 and report["ok"], report["steps"]
    assert [s["name"] for s in report["steps"]] == STEPS
    steps = {s["name"]: s for s in report["steps"]}
    assert "outlived its SSH session" in steps["detach"]["detail"]
    assert "confirmed gone" in steps["down"]["detail"]
    [pod] = fake.pods.values()  # one CPU pod, the cheapest thing with SSH
    assert fake.sent("POST", "/v2/pods")[0]["cpu"] and fake.actions("stop") and fake.actions("start")
    assert pod.host.boots == 2  # started again: new host keys, which orch accepted (the start held)
    assert fake.live() == []
    inst = open_orch().ledger.by_name(report["instance"], live_only=False)
    assert inst.state == states.DESTROYED and report["spent_usd"] > 0
    notes = [e.reason for e in open_orch().ledger.events(inst.id)]
    assert any("host key changed at the start orch asked for" in n for n in notes), notes
    human = run_orch("check", "runpod", env=env)
    assert human.returncode == 0 and "runpod: every step held" in human.stdout


@pytest.mark.parametrize("step, fault, says", [
    ("rent", {"no_capacity": 1}, "no capacity"),
    ("detach", {"image_files": BROKEN_SETSID}, "did not outlive its SSH session"),
    ("stop", {"fail_stop": 100}, "Something went wrong"),
    ("start", {"refuse_resume": 1}, "could not give pod"),
    ("down", {"terminate_ignored": 1}, "a second try destroyed it"),
])
def test_a_fault_in_any_step_fails_that_step_and_leaves_no_pod(orch_home, runpod, step, fault, says):
    fake, env = runpod
    configure(orch_home, "runpod", fake.settings(destroy_timeout=0.5, retries=2))
    for knob, value in fault.items():
        setattr(fake, knob, value)
    proc, report = check(env, "--live")
    assert proc.returncode == 1 and not report["ok"]
    failed = [s for s in report["steps"] if not s["ok"]]
    assert [s["name"] for s in failed] == [step], report["steps"]
    assert says in failed[0]["detail"], failed[0]
    assert fake.live() == [], f"a fault in {step} left a pod billing"
    for inst in open_orch().ledger.instances():
        assert inst.state in (states.DESTROYED, states.FAILED), (inst.name, inst.state)
    for knob in fault:  # the fault gone, the same account passes
        setattr(fake, knob, {} if knob == "image_files" else 0)
    again = run_orch("check", "runpod", "--live", env=env)
    assert again.returncode == 0 and "every step held" in again.stdout, again.stdout
    assert fake.live() == []
