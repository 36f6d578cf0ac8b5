"""Lambda Cloud: the `lambda` provider against a fake of Lambda's REST API v1 (tests/fakes/lambda_api.py)
whose instances are real sshd hosts listening on port 22, as Lambda's do. The module runs in a network
namespace of its own (tests/netns.py): only loopback is up there, and port 22 of a 127.x address is free."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.ssh import reach
from orchestrator import config, states
from orchestrator.provider import Request, Status, label_for
from tests import netns
from tests.clouds import configure, legal_path, open_orch, wait_for
from tests.conftest import needs_torch, run_orch
from tests.fakes.hosts import sshd_available
from tests.fakes.lambda_api import FakeLambda

pytestmark = pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")


@pytest.fixture
def lam(orch_home, tmp_path, monkeypatch):
    """The fake, and orch's config pointing at it; yields (fake, env for run_orch)."""
    with FakeLambda(tmp_path, launch_interval=0) as fake:
        monkeypatch.setenv("LAMBDA_API_BASE_URL", fake.url)
        configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                        "destroy_timeout": 20, "launch_interval": 0.3})
        yield fake, {"LAMBDA_API_BASE_URL": fake.url}


def launches(fake):
    return fake.calls("POST", r"^/instance-operations/launch$")


def arrange_gpu(orch, name: str, gpu: str = "A10"):
    """A Lambda instance arranged ready without provisioning (tests/clouds.py `arrange`, for a GPU type).
    This machine has no GPU, so the row says CPU-only: LibreYOLO then trains on the host's CPU; the rest
    (launch, SSH, staging, the detached run, pull, terminate) is Lambda's path."""
    provider = orch.provider("lambda")
    inst = orch.ledger.create_instance(name=name, provider="lambda", label="", cpu_only=True, gpus=0)
    remote = provider.create(Request(name=name, gpu=gpu), inst.label, config.ssh_key()[1])
    inst = orch.move(inst, states.PROVISIONING, f"created {remote.provider_id}", provider_id=remote.provider_id,
                     price_hr=provider.prices(remote)[0], gpu_name=remote.gpu_name)
    inst = orch._endpoint(inst, provider, reach.wait_ssh(provider, remote.provider_id, 60, interval=0.1))
    return orch.move(inst, states.READY, "arranged by the test (not provisioned)")


# -- offers, and what Lambda cannot do ------------------------------------------------------------
def test_offers_are_the_types_with_capacity_priced_from_cents(lam):
    fake, env = lam
    data = json.loads(run_orch("offers", "--provider", "lambda", "--on-demand", "--json", env=env, check=0).stdout)
    rows = {r["offer_id"]: r for r in data["offers"]}
    assert set(rows) == {"gpu_1x_a10", "gpu_1x_a100_sxm4"}, "no capacity anywhere (H100 PCIe) is no offer"
    a10 = rows["gpu_1x_a10"]
    assert (a10["gpu"], a10["vram_gb"], a10["gpus"]) == ("A10", 24.0, 1)
    assert a10["price_hr"] == pytest.approx(0.75) and a10["spot_hr"] is None and a10["stopped_hr"] is None
    assert a10["location"] == "us-east-1, us-west-1"
    assert rows["gpu_1x_a100_sxm4"]["gpu"] == "A100 SXM"
    eight = json.loads(run_orch("offers", "--provider", "lambda", "--gpus", "8", "--json", env=env, check=0).stdout)
    assert [(r["gpu"], r["price_hr"]) for r in eight["offers"]] == [("H100 SXM", 23.92)]
    two = json.loads(run_orch("offers", "--provider", "lambda", "--gpus", "2", "--gpu", "RTX A6000", "--json", env=env,
                              check=0).stdout)
    assert [r["gpu"] for r in two["offers"]] == ["RTX A6000"]
    spot = json.loads(run_orch("offers", "--provider", "lambda", "--spot", "--json", env=env, check=0).stdout)
    assert spot["offers"] == [] and not spot["partial"], "no spot market is no row, not an error"
    assert fake.calls("GET", "/instance-types")


def test_the_fake_refuses_and_reports_a_field_lambdas_description_does_not_define(tmp_path):
    """The fake holds orch to Lambda's published request schemas (tests/fakes/lambda_openapi.json): a
    launch with ``quantity`` (not in v1.10.0's InstanceLaunchRequest) is a 400 naming it, and the
    test that sent it fails when it leaves the fake."""
    import urllib.error
    import urllib.request

    with pytest.raises(AssertionError, match="quantity"):
        with FakeLambda(tmp_path, launch_interval=0) as fake:
            body = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["k"],
                    "quantity": 2}
            req = urllib.request.Request(f"{fake.url}/instance-operations/launch", data=json.dumps(body).encode(),
                                         method="POST", headers={"Authorization": f"Bearer {fake.key}",
                                                                 "Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 400 and "quantity" in refused.value.read().decode()
            assert fake.instances == {}


def test_spot_and_stop_are_refused_in_one_line_and_nothing_is_launched(lam):
    fake, env = lam
    proc = run_orch("up", "s1", "--provider", "lambda", "--gpu", "A10", "--spot", env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "orch: error: lambda has no spot instances (`orch check lambda` lists what it lacks): drop --spot"]
    cpu = run_orch("up", "c1", "--provider", "lambda", "--cpu", env=env)
    assert cpu.returncode == 2 and "CPU-only instances are not supported by lambda" in cpu.stderr
    assert launches(fake) == [] and fake.instances == {}

    arrange_gpu(open_orch(), "keep")
    stop = run_orch("stop", "keep", env=env)
    assert stop.returncode == 2 and len(stop.stderr.strip().splitlines()) == 1
    assert "stop is not supported by lambda: use `orch down keep`" in stop.stderr
    assert [r["status"] for r in fake.live()] == ["active"]
    run_orch("down", "keep", "--no-pull", env=env, check=0)
    assert fake.live() == []


# -- up, verify, down -----------------------------------------------------------------------------
@needs_torch
def test_a_gpu_up_that_fails_verification_here_is_terminated(lam, orch_home):
    fake, env = lam
    proc = run_orch("up", "g1", "--provider", "lambda", "--gpu", "A10", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no working NVIDIA GPU" in proc.stderr or "verify failed on the GPU" in proc.stderr, proc.stderr
    detail = json.loads(run_orch("status", "g1", "--json", env=env, check=0).stdout)
    assert detail["state"] == "destroyed" and "up failed" in detail["events"][-1]["reason"]
    assert legal_path(open_orch().ledger.events(detail["id"]))[-2:] == ["destroying", "destroyed"]
    [launch] = launches(fake)
    key = fake.ssh_keys[0]
    assert launch.body["ssh_key_names"] == [key["name"]] and key["name"].startswith("orch-")
    assert key["public_key"] == " ".join((orch_home / "keys" / "id_ed25519.pub").read_text().split()[:2])
    assert launch.body["name"] == label_for(detail["id"], "g1") and launch.body["region_name"] == "us-east-1"
    assert launch.body["instance_type_name"] == "gpu_1x_a10" and "image" not in launch.body
    assert fake.live() == [], "the instance that failed verify was terminated, not left billing"
    assert fake.calls("POST", r"^/instance-operations/terminate$")


@needs_torch
@pytest.mark.training
def test_an_instance_arranged_ready_trains_end_to_end_and_down_terminates_it(lam, orch_home, tmp_path):
    from orchestrator.tasks import dataset
    from orchestrator.runs import training

    fake, env = lam
    orch = open_orch()
    inst = arrange_gpu(orch, "tr1")
    assert inst.ssh_port == 22 and inst.ssh_host == fake.live()[0]["ip"]
    spec = training.TrainSpec(data=str(dataset.synth(tmp_path / "ds", n_train=8, n_val=4)), epochs=1, imgsz=64,
                              batch=4, train_args=training.parse_train_args(["workers=0"]))
    training.prepare(spec, orch.home, lambda m: None)
    run = training.launch(orch, inst, spec)
    assert run.run_dir.endswith("/runs/r1")

    def finished():
        view = json.loads(run_orch("status", "tr1", "--json", env=env, check=0).stdout)["run"]
        return view if view["state"] in ("completed", "failed", "crashed") else None

    done = wait_for(finished, timeout=400, what="the run on Lambda to end")
    assert done["state"] == "completed" and done["epoch"] == 1, done
    run_orch("pull", "tr1", env=env, check=0)
    assert (orch_home / "runs" / "tr1" / "weights" / "best.pt").stat().st_size > 0
    down = run_orch("down", "tr1", env=env, check=0)
    assert "destroyed" in down.stdout
    assert fake.live() == [] and fake.instances[inst.provider_id]["status"] == "terminated"
    assert (orch_home / "runs" / "tr1" / "weights" / "best.pt").exists(), "the weights outlive the instance"


# -- Lambda's limits ------------------------------------------------------------------------------
def test_a_launch_whose_new_instance_cannot_be_read_is_kept_never_launched_again(lam, orch_home):
    """The launch answers the new id; every read of it then meets the API's rate limit (429): the id
    is kept (the launch happened), never taken for a refused launch and launched again."""
    fake, env = lam
    configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "launch_interval": 0, "retries": 2})
    provider = open_orch().provider("lambda")
    fake.inject(429, "Too Many Requests", method="GET", path=r"^/instances/[0-9a-f]+$", times=2)
    made = provider.create(Request(name="r", gpu="A10"), label_for("r" * 12, "r"), config.ssh_key()[1])
    assert [c.status for c in launches(fake)] == [200] and list(fake.instances) == [made.provider_id]
    assert made.status == Status.PENDING and made.label == label_for("r" * 12, "r")
    assert provider.get(made.provider_id).label == made.label, "found once the reads are answered"
    provider.destroy(made.provider_id)
    assert fake.live() == []


def test_a_rate_limited_launch_waits_and_a_taken_region_gives_way_to_the_next(lam, tmp_path):
    fake, _ = lam
    fake.launch_interval = 1.0  # Lambda's own limiter: one launch per interval (12 s there)
    orch = open_orch()
    provider = orch.provider("lambda")
    pub = config.ssh_key()[1]
    first = provider.create(Request(name="a", gpu="A10"), label_for("a" * 12, "a"), pub)
    t = time.monotonic()
    second = provider.create(Request(name="b", gpu="A10"), label_for("b" * 12, "b"), pub)
    statuses = [c.status for c in launches(fake)]
    assert statuses[0] == statuses[-1] == 200 and set(statuses[1:-1]) == {429}, statuses
    assert time.monotonic() - t >= 0.9 and first.provider_id != second.provider_id, "the 429s were waited out"
    assert len(fake.live()) == 2, "a launch refused by the rate limit made nothing"

    fake.launch_interval = 0
    fake.take_capacity("gpu_1x_a10", "us-east-1")  # someone takes the last A10 there, after orch looked
    third = provider.create(Request(name="c", gpu="A10"), label_for("c" * 12, "c"), pub)
    tried = [(c.body["region_name"], c.status) for c in launches(fake)[len(statuses):]]
    assert tried == [("us-east-1", 400), ("us-west-1", 200)]
    assert fake.instances[third.provider_id]["region"]["name"] == "us-west-1"
    assert len(fake.ssh_keys) == 1, "orch's key is added once"
    for r in (first, second, third):
        provider.destroy(r.provider_id)
    assert fake.live() == []


def test_a_quoted_offer_is_launched_as_listed_without_listing_again(lam):
    """Plan once: the offer a plan chose (``Request.quote``) is launched in the regions it listed, the
    next one where the first was taken meanwhile, with no second GET /instance-types."""
    fake, _ = lam
    provider = open_orch().provider("lambda")
    [quote] = [o for o in provider.offers(Request(name="q", gpu="A10")) if o.offer_id == "gpu_1x_a10"]
    listed = len(fake.calls("GET", r"^/instance-types$"))
    assert listed == 1
    fake.take_capacity("gpu_1x_a10", "us-east-1")  # taken after the plan looked
    made = provider.create(Request(name="q", gpu="A10", offer=quote.offer_id, quote=quote),
                           label_for("c" * 12, "q"), config.ssh_key()[1])
    assert len(fake.calls("GET", r"^/instance-types$")) == listed, "the quote was listed again"
    assert [(c.body["region_name"], c.body["instance_type_name"], c.status) for c in launches(fake)] == [
        ("us-east-1", "gpu_1x_a10", 400), ("us-west-1", "gpu_1x_a10", 200)]
    assert made.price_hr == pytest.approx(0.75) and fake.instances[made.provider_id]["region"]["name"] == "us-west-1"
    provider.destroy(made.provider_id)
    assert fake.live() == []


def test_account_key_is_checked_where_lambda_keeps_keys(lam):
    fake, _ = lam
    provider = open_orch().provider("lambda")
    pub = config.ssh_key()[1]
    assert "not in the Lambda account yet" in provider.account_key(pub)
    provider._ensure_key(pub)
    assert provider.account_key(pub).startswith("held by the Lambda account as SSH key 'orch-")
    name = fake.ssh_keys[0]["name"]
    fake.ssh_keys[0]["public_key"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKeyOtherKeyOther0"
    from orchestrator.errors import ProviderError

    with pytest.raises(ProviderError, match=f"{name}.*not orch's key"):
        provider.account_key(pub)


def test_a_bad_key_is_one_line_and_exit_1(lam, orch_home):
    fake, env = lam
    configure(orch_home, "lambda", {"api_key": "wrong", "ssh_user": "root"})
    proc = run_orch("up", "k1", "--provider", "lambda", "--gpu", "A10", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "Lambda Cloud refused the API key" in proc.stderr and "wrong" not in proc.stderr
    assert fake.instances == {}


# -- reconcile, reap, preemption, secrets -----------------------------------------------------------
def test_reconcile_adopts_a_stray_marks_the_gone_lost_and_leaves_all_alone_when_the_listing_fails(lam):
    from orchestrator.instances import reconcile as rec
    from orchestrator.ledger.ledger import new_id

    fake, env = lam
    orch = open_orch()
    provider = orch.provider("lambda")
    stray = new_id()
    provider.create(Request(name="stray", gpu="A10"), label_for(stray, "stray"), config.ssh_key()[1])
    gone = arrange_gpu(orch, "gone")
    provider.destroy(gone.provider_id)  # the Lambda console, say

    fake.inject(500, {"error": {"code": "global/unknown", "message": "Internal error."}}, method="GET",
                path=r"^/instances$", times=20)
    failed = run_orch("reconcile", env=env)
    line = next(x for x in failed.stdout.splitlines() if x.startswith("lambda"))
    assert failed.returncode == 1 and "listing failed" in line and "left alone: gone" in line
    assert orch.ledger.get(gone.id).state == states.READY, "a failed listing was read as an empty fleet"
    fake._faults.clear()

    report = {p.provider: p for p in rec.reconcile(orch).providers}["lambda"]
    assert report.adopted == ["stray"] and report.lost == ["gone"], report
    adopted = orch.ledger.get(stray)
    assert adopted.state == states.READY and adopted.provider == "lambda" and adopted.price_hr == pytest.approx(0.75)
    assert adopted.gpu_name == "A10" and adopted.ssh_port == 22
    # jupyter_token is a login to the instance: it never reaches the ledger.
    token = next(r["jupyter_token"] for r in fake.instances.values() if r["name"] == adopted.label)
    db = orch.home / "ledger.db"
    if db.exists():
        assert token.encode() not in db.read_bytes() and fake.key.encode() not in db.read_bytes()
    orch.down(adopted)
    assert fake.live() == []


def test_reap_destroys_an_idle_instance_it_cannot_stop(lam, monkeypatch):
    from orchestrator.money import policy as policies
    from orchestrator.reaper import reaper

    fake, _ = lam
    monkeypatch.setenv("ORCH_WATCHDOG", "off")  # the reaper alone on duty
    orch = open_orch()
    inst = arrange_gpu(orch, "idle")
    orch.ledger.update(inst.id, policy=policies.Policy(idle_minutes=0.01).to_json())
    time.sleep(1.5)  # clock: the idle rule's 0.01 min (0.6 s of wall time since ready) must have run out
    out = {o.name: o for o in reaper.reap(open_orch())}["idle"]
    assert out.state == states.DESTROYED, out
    assert "stop is not supported by lambda" in " ".join(e.reason for e in orch.ledger.events(inst.id))
    assert fake.live() == []


def test_a_preempted_instance_is_not_gone_until_lambda_says_terminated(lam, monkeypatch):
    """Lambda took it back ("preempted"): it will not run again, but it is listed and may bill until
    Lambda says terminated. orch records it broken (not ended), the reaper destroys it, and the row
    ends destroyed only once the terminate is confirmed."""
    from orchestrator.reaper import reaper

    fake, _ = lam
    monkeypatch.setenv("ORCH_WATCHDOG", "off")
    orch = open_orch()
    taken = arrange_gpu(orch, "taken")
    fake.preempt(taken.provider_id)
    assert orch.refresh(orch.ledger.get(taken.id)).state == states.BROKEN, "not gone before Lambda says so"
    assert "preempted" in orch.ledger.events(taken.id)[-1].reason
    assert [r.provider_id for r in orch.provider("lambda").list()] == [taken.provider_id], "still listed"
    assert fake.calls("POST", r"^/instance-operations/terminate$") == []
    out = {o.name: o for o in reaper.reap(open_orch())}["taken"]
    assert out.state == states.DESTROYED and out.action == "destroy", out
    assert legal_path(orch.ledger.events(taken.id))[-3:] == ["broken", "destroying", "destroyed"]
    [end] = fake.calls("POST", r"^/instance-operations/terminate$")
    assert end.body == {"instance_ids": [taken.provider_id]} and end.status == 200
    assert fake.instances[taken.provider_id]["status"] == "terminated", "confirmed gone before the row ended"


def test_the_accounts_quota_is_named_and_not_taken_for_no_capacity(lam):
    fake, env = lam
    fake.quota = 0
    proc = run_orch("up", "q1", "--provider", "lambda", "--gpu", "A10", env=env)
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "the account's instance quota is used up (global/quota-exceeded" in error, error
    assert "Contact Support to increase your quota" in error
    assert [(c.body["region_name"], c.status) for c in launches(fake)] == [("us-east-1", 400)], "no other region tried"
    from providers.lambda_cloud.api import QuotaExceeded

    with pytest.raises(QuotaExceeded):
        open_orch().provider("lambda").create(Request(name="q2", gpu="A10"), label_for("e" * 12, "q2"),
                                              config.ssh_key()[1])
    assert fake.instances == {}


# -- right after a launch, and an unhealthy instance -------------------------------------------------
def test_an_ambiguous_launch_is_sent_once_and_its_instance_found_though_not_listed_at_first(lam):
    """A 5xx after the instance was made, the instance missing from its first reads: one launch,
    orch keeps looking until it shows, and the new id is pending (not gone) until it is visible."""
    fake, _ = lam
    provider = open_orch().provider("lambda")
    fake.lose_launch_answers, fake.visibility_lag = 1, 3
    made = provider.create(Request(name="amb", gpu="A10"), label_for("a" * 12, "amb"), config.ssh_key()[1])
    assert [c.status for c in launches(fake)] == [500], "exactly one launch"
    assert list(fake.instances) == [made.provider_id]
    fake.visibility_lag = 2  # a clean launch whose id GET /instances/{id} does not know yet
    fresh = provider.create(Request(name="new", gpu="A10"), label_for("b" * 12, "new"), config.ssh_key()[1])
    assert fresh.status == Status.PENDING and fresh.price_hr == pytest.approx(0.75), fresh
    assert reach.wait_ssh(provider, fresh.provider_id, 60, interval=0.05).status == Status.RUNNING
    for r in (made, fresh):
        provider.destroy(r.provider_id)
    assert fake.live() == []


def test_a_launch_whose_instance_never_shows_is_not_repeated_and_the_reaper_adopts_it(lam, orch_home, monkeypatch):
    fake, env = lam
    configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "launch_interval": 0, "launch_lookup_seconds": 0.5})
    fake.lose_launch_answers, fake.visibility_lag = 1, 10**6
    up = run_orch("up", "lost1", "--provider", "lambda", "--gpu", "A10", env=env)
    assert up.returncode == 1 and "no second launch" in up.stderr, up.stderr
    assert len(launches(fake)) == 1 and len(fake.live()) == 1, "one launch, one instance billing unseen"
    [row] = fake.instances.values()
    row["_hidden_reads"] = 0  # Lambda's listing catches up

    reap = run_orch("reap", env={**env, "ORCH_WATCHDOG": "off"}, check=0)
    assert "lost1" in reap.stdout
    orch = open_orch()
    [inst] = orch.ledger.instances(live_only=True)
    assert inst.provider_id == row["id"] and inst.state == states.READY and inst.price_hr == pytest.approx(0.75)
    first = orch.ledger.events(inst.id)[0]
    assert first.actor == "reconcile" and first.reason.startswith("adopted:") and "recorded it failed" in first.reason
    assert len(launches(fake)) == 1
    run_orch("down", inst.name, "--no-pull", env=env, check=0)
    assert fake.live() == []


def test_an_instance_unhealthy_for_a_few_reads_becomes_ready(lam, orch_home):
    fake, env = lam
    configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "launch_interval": 0, "unhealthy_grace": 30})
    fake.boot_unhealthy_reads = 3
    orch = open_orch()
    inst = orch.up("sick1", "lambda", Request(name="sick1", gpu="A10"), ssh_timeout=60, prepare=None)
    assert inst.state == states.READY
    assert fake.calls("POST", r"/restart$") == [] and fake.calls("POST", r"/terminate$") == []
    orch.down(inst)
    assert fake.live() == []


def test_an_unhealthy_instance_gets_one_restart_then_is_given_up(lam, orch_home):
    fake, env = lam
    configure(orch_home, "lambda", {"api_key": fake.key, "ssh_user": "root", "poll_seconds": 0.05,
                                    "destroy_timeout": 20, "launch_interval": 0, "unhealthy_grace": 0.5})
    orch = open_orch()
    provider = orch.provider("lambda")
    cured = arrange_gpu(orch, "cured")
    fake.break_host(cured.provider_id)  # unhealthy until something is done about it
    assert provider.get(cured.provider_id).status == Status.PENDING, "unhealthy is not final"
    assert reach.wait_ssh(provider, cured.provider_id, 30, interval=0.05).status == Status.RUNNING
    assert len(fake.calls("POST", r"/restart$")) == 1, "one restart, after the grace"

    fake.restart_cures = False
    lost = arrange_gpu(orch, "lost")
    fake.break_host(lost.provider_id)
    from orchestrator.errors import SSHError

    with pytest.raises(SSHError, match="before and after a restart: given up"):
        reach.wait_ssh(provider, lost.provider_id, 30, interval=0.05)
    restarts = [c.body["instance_ids"] for c in fake.calls("POST", r"/restart$")]
    assert restarts == [[cured.provider_id], [lost.provider_id]]
    assert orch.refresh(orch.ledger.get(lost.id)).state == states.BROKEN
    for inst in (cured, lost):
        orch.down(orch.ledger.get(inst.id))
    assert fake.live() == []


@pytest.mark.parametrize("code, says", [("global/account-inactive", "account is inactive: verify its email address"),
                                        ("global/invalid-address", "billing address is invalid")])
def test_the_launchs_403s_name_their_cause(lam, code, says):
    fake, env = lam
    fake.account_refusal = code
    proc = run_orch("up", "k2", "--provider", "lambda", "--gpu", "A10", env=env)
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and error.startswith("orch: error: Lambda Cloud refused"), proc.stderr
    assert says in error and code in error and "API key" not in proc.stderr
    assert [c.status for c in launches(fake)] == [403] and fake.instances == {}
    assert json.loads(run_orch("status", "k2", "--json", env=env, check=0).stdout)["state"] == "failed"


netns.isolate(globals())
