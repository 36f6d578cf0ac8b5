"""Nothing a failed create leaves behind stays stuck or bills unseen: the reaper reconciles at the
start of every pass (an instance a create made and its lookup missed is adopted; a row a failure
left ``requested`` or ``destroying`` is settled), and ``orch forget`` closes a row the provider
confirms gone. Against the fake RunPod (tests/fakes/runpod_api.py), through the ``orch`` CLI."""

from __future__ import annotations

import json

from orchestrator import states
from tests.clouds import arrange, configure, legal_path, open_orch, runpod  # noqa: F401  (fixture)
from tests.conftest import run_orch

QUIET = {"ORCH_WATCHDOG": "off"}  # the reaper alone on duty: these tests are about the ledger's rows


def rows(env, all_=False) -> dict:
    return {r["name"]: r for r in json.loads(run_orch("status", "--json", *(["--all"] if all_ else []), env=env,
                                                      check=0).stdout)}


def events(name: str):
    orch = open_orch()
    inst = orch.ledger.by_name(name, live_only=False)
    return inst, orch.ledger.events(inst.id)


def test_a_pod_a_failed_create_made_is_adopted_by_the_next_reaper_pass(orch_home, runpod):
    """The create answers 500 after making the pod, and the pod stays out of the listing past the
    lookup: `orch up` fails and records the create failed. The next `orch reap` (nobody types
    `orch reconcile`) finds the pod by orch's tag and adopts it, with an event that says so."""
    fake, env = runpod
    configure(orch_home, "runpod", fake.settings(destroy_timeout=5, create_lookup_seconds=0.3))
    fake.fail_create_after = 1
    fake.listing_lag = 10**6
    up = run_orch("up", "lag1", "--provider", "runpod", "--cpu", env=env)
    assert up.returncode == 1 and "no second create" in up.stderr, up.stderr
    assert rows(env).get("lag1") is None and len(fake.live()) == 1, "the pod bills, unseen by the ledger"
    fake.live()[0].hidden_listings = 0  # the listing catches up
    fake.listing_lag = 0

    reap = run_orch("reap", env={**env, **QUIET}, check=0)
    assert "lag1" in reap.stdout
    live = rows(env)
    [adopted] = [r for r in live.values() if r["provider_id"] == fake.live()[0].id]
    assert adopted["state"] == states.READY and adopted["name"].startswith("lag1")
    inst, evs = events(adopted["name"])
    assert evs[0].actor == "reconcile" and evs[0].reason.startswith("adopted:"), evs[0]
    assert "though the ledger recorded it failed" in evs[0].reason
    run_orch("down", adopted["name"], "--no-pull", env=env, check=0)
    assert fake.live() == []


def test_a_create_that_cannot_be_checked_leaves_nothing_stuck_after_a_pass(orch_home, runpod):
    """Issue 33's `orch up bad3`: RunPod fails every request (a rate limit that does not end), so orch
    cannot say whether the create made anything. `orch down` records the intent and says who
    finishes it; the first reaper pass once RunPod answers settles the row (confirmed gone:
    destroyed), and `orch reconcile` settles a row left requested (never made: failed)."""
    fake, env = runpod
    fake.rate_limited = 10**6
    up = run_orch("up", "bad3", "--provider", "runpod", "--gpu", "RTX 4090", env=env)
    assert up.returncode == 1 and "could not say whether it was made" in up.stderr, up.stderr
    assert rows(env)["bad3"]["state"] == states.REQUESTED
    down = run_orch("down", "bad3", env=env)
    assert down.returncode == 1 and "next reaper pass or `orch reconcile` finishes the destroy" in down.stderr
    assert rows(env)["bad3"]["state"] == states.DESTROYING
    run_orch("up", "bad4", "--provider", "runpod", "--gpu", "RTX 4090", env=env, check=1)
    assert run_orch("reap", env={**env, **QUIET}).returncode == 0, "a provider that cannot answer stops no pass"
    assert {n: r["state"] for n, r in rows(env).items()} == {"bad3": "destroying", "bad4": "requested"}

    fake.rate_limited = 0  # RunPod answers again
    run_orch("reap", env={**env, **QUIET}, check=0)
    assert "bad3" not in rows(env) and rows(env, all_=True)["bad3"]["state"] == states.DESTROYED
    inst, evs = events("bad3")
    assert legal_path(evs) == ["requested", "destroying", "destroyed"] and evs[-1].actor == "reconcile"
    # bad4 was settled by the same pass's reconcile; a row left so any other way is settled by `orch reconcile`.
    assert rows(env, all_=True)["bad4"]["state"] == states.FAILED
    assert "never created at runpod" in events("bad4")[1][-1].reason
    assert fake.live() == [] and fake.sent("POST", "/v2/pods") == []


def test_a_create_refused_for_its_key_is_failed_at_once(orch_home, runpod):
    """A rejected key made nothing: the row is settled on the spot, not left for a reconcile that
    the same key could not run either."""
    fake, env = runpod
    configure(orch_home, "runpod", fake.settings(api_key="rpa_wrong"))
    up = run_orch("up", "bad5", "--provider", "runpod", "--cpu", env=env)
    assert up.returncode == 1 and "RunPod rejected the API key" in up.stderr
    assert "bad5" not in rows(env) and rows(env, all_=True)["bad5"]["state"] == states.FAILED
    assert fake.live() == []


def test_forget_closes_only_what_the_provider_confirms_gone(orch_home, runpod):
    fake, env = runpod
    orch = open_orch()
    ghost = orch.ledger.create_instance(name="ghost", provider="runpod", label="", cpu_only=True)  # never sent
    kept = arrange(orch, "kept", "runpod")

    fake.rate_limited = 10**6
    asked = run_orch("forget", "ghost", env=env)
    assert asked.returncode == 2 and "runpod cannot be asked whether ghost is gone" in asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1 and rows(env)["ghost"]["state"] == states.REQUESTED
    fake.rate_limited = 0

    shown = run_orch("forget", "kept", env=env)
    assert shown.returncode == 2 and f"runpod still shows kept ({kept.provider_id}, running)" in shown.stderr
    assert "`orch down kept`" in shown.stderr and rows(env)["kept"]["state"] == states.READY

    done = run_orch("forget", "ghost", env=env, check=0)
    assert "ghost: requested -> failed" in done.stdout
    assert "forgotten" in orch.ledger.events(ghost.id)[-1].reason
    orch.provider("runpod").destroy(kept.provider_id)  # ended in RunPod's console
    run_orch("forget", "kept", env=env, check=0)
    assert rows(env) == {} and rows(env, all_=True)["kept"]["state"] == states.LOST
    missing = run_orch("forget", "kept", env=env)
    assert missing.returncode == 2 and "no live instance named 'kept'" in missing.stderr
