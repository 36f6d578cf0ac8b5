"""AWS EC2: the `aws` provider through boto3 against moto's server mode, made to behave like AWS where
moto differs (tests/moto_ec2.py says where and why), each instance a real sshd host at its public
address. The module runs in a network namespace of its own (tests/netns.py): only loopback is up, so
even an address moto invented could not be reached."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
from dataclasses import asdict

import pytest

from orchestrator import config, states
from orchestrator.ssh import reach
from orchestrator.provider import Offer, Request, Status, can_stop, label_for
from providers.aws.network import ensure_key, ensure_ssh_group
from tests import netns
from tests.clouds import configure, legal_path, open_orch, wait_for
from tests.conftest import ROOT, needs_torch, run_orch
from tests.fakes.hosts import sshd_available
from tests.moto_ec2 import MotoEC2

pytestmark = pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, sshd and unshare")
SETTINGS = {"region": "us-east-1", "ssh_user": "root", "poll_seconds": 0.05, "stop_timeout": 20,
            "destroy_timeout": 20, "retries": 1}


@pytest.fixture
def ec2(orch_home, tmp_path, monkeypatch):
    """moto's EC2 with a Deep Learning AMI and live spot prices; orch configured for it."""
    pytest.importorskip("moto")
    with MotoEC2(tmp_path) as m:
        for k, v in m.env.items():
            monkeypatch.setenv(k, v)
        m.add_dlami()
        m.spot("g5.xlarge", "us-east-1a", 0.61, minutes_ago=300)  # an old price: superseded
        m.spot("g5.xlarge", "us-east-1a", 0.42, minutes_ago=10)
        m.spot("g5.xlarge", "us-east-1b", 0.47, minutes_ago=3)
        m.spot("g5.12xlarge", "us-east-1b", 2.10, minutes_ago=5)
        m.spot("m6i.large", "us-east-1c", 0.031, minutes_ago=5)
        configure(orch_home, "aws", dict(SETTINGS))
        yield m, m.env


def runs(m) -> list[dict]:
    return m.requests("RunInstances")


def arrange(orch, name: str, spot: bool = False, cpu: bool = True, **request):
    """A ready AWS instance without provisioning (tests/clouds.py `arrange`, with --spot)."""
    provider = orch.provider("aws")
    req = Request(name=name, cpu=cpu, spot=spot, **request)
    inst = orch.ledger.create_instance(name=name, provider="aws", label="", cpu_only=cpu, gpus=0 if cpu else 1,
                                       spot=spot)
    remote = provider.create(req, inst.label, config.ssh_key()[1])
    inst = orch.move(inst, states.PROVISIONING, f"created {remote.provider_id}", provider_id=remote.provider_id,
                     price_hr=provider.prices(remote)[0], stopped_price_hr=provider.prices(remote)[1])
    inst = orch._endpoint(inst, provider, reach.wait_ssh(provider, remote.provider_id, 60, interval=0.1))
    return orch.move(inst, states.READY, "arranged by the test (not provisioned)")


def test_importing_the_provider_imports_no_boto3():
    code = ("import sys, providers.aws\nfrom orchestrator.provider import plugins\nplugins.providers()\n"
            "print(sorted(m for m in ('boto3', 'botocore', 'moto') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- offers ----------------------------------------------------------------------------------------
def test_offers_gpu_types_with_the_tables_on_demand_price_and_the_latest_spot_price(ec2, orch_home):
    m, env = ec2
    m.spot("g5.xlarge", "us-west-2c", 0.39, minutes_ago=2)
    configure(orch_home, "aws", {**SETTINGS, "regions": ["us-east-1", "us-west-2"]})
    with (orch_home / "config.toml").open("a") as f:  # a TOML table, which tests.clouds.configure does not write
        f.write('on_demand_prices = { "g5.xlarge" = 1.10 }\n')
    config._load.cache_clear()
    data = json.loads(run_orch("offers", "--provider", "aws", "--gpu", "A10G", "--json", env=env, check=0).stdout)
    rows = {r["offer_id"]: r for r in data["offers"]}
    east, west = rows["us-east-1:g5.xlarge"], rows["us-west-2:g5.xlarge"]
    assert (east["gpu"], east["gpus"], east["location"]) == ("A10G", 1, "us-east-1")
    # The latest price per zone (0.61 was superseded by 0.42), the cheapest zone, and the root
    # volume (gp3, 0.08 $/GB-month, 20 GB) on top of the instance.
    disk = 20 * 0.08 / 730
    assert east["spot_hr"] == pytest.approx(0.42 + disk) and east["price_hr"] == pytest.approx(1.10 + disk)
    assert west["spot_hr"] == pytest.approx(0.39 + disk) and west["price_hr"] == pytest.approx(1.10 + disk)
    assert east["stopped_hr"] == pytest.approx(disk, abs=1e-6)  # --json rounds to 6 places
    assert "us-east-1:g5.12xlarge" not in rows, "4 GPUs is another query (--gpus 4)"
    provider = open_orch().provider("aws")
    [offer] = [o for o in provider.offers(Request(name="o", gpu="A10G")) if o.offer_id == "us-east-1:g5.xlarge"]
    assert "on_demand_prices" in offer.note and "us-east-1a" in offer.note and offer.min_bid_per_gpu == 0.42
    four = provider.offers(Request(name="o", gpu="A10G", gpus=4))
    assert [(o.offer_id, o.spot_hr, o.min_bid_per_gpu) for o in four if o.spot_hr] == \
        [("us-east-1:g5.12xlarge", 2.10, 0.525)]
    configure(orch_home, "aws", dict(SETTINGS))
    table = provider.__class__(dict(SETTINGS)).offers(Request(name="o", gpu="T4"))
    assert table and all("aws.amazon.com/ec2/pricing/on-demand, 2026-06" in o.note for o in table)
    asked = m.requests("DescribeSpotPriceHistory")[0]
    products = [v for k, v in asked.items() if k.startswith("ProductDescription")]
    assert products == ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]
    assert "StartTime" in asked, "the price in effect now, not the whole history"


def test_offers_spot_a10g_shows_aws_beside_vast(ec2, orch_home, tmp_path):
    from tests.fakes.vast_api import FakeVast, _offer

    m, env = ec2
    with FakeVast(tmp_path) as vast:
        vast.offers.append(_offer(2001, "A10G", 0.50, min_bid=0.30))
        configure(orch_home, "vastai", {"api_key": vast.key, "server_url": vast.url, "ssh_user": getpass.getuser()})
        data = json.loads(run_orch("offers", "--spot", "--gpu", "A10G", "--json", env=env, check=0).stdout)
        table = run_orch("offers", "--spot", "--gpu", "A10G", env=env, check=0).stdout
    got = [(r["provider"], r["offer_id"]) for r in data["offers"]]
    assert got == [("vastai", "2001"), ("aws", "us-east-1:g5.xlarge")], got
    assert [r["spot_hr"] for r in data["offers"]] == sorted(r["spot_hr"] for r in data["offers"])
    assert not data["partial"] and set(data["query"]["providers"]) >= {"aws", "vastai"}
    assert any(line.startswith("aws") and "A10G" in line for line in table.splitlines())
    assert any(line.startswith("vastai") and "A10G" in line for line in table.splitlines())


# -- up ----------------------------------------------------------------------------------------------
@needs_torch
@pytest.mark.training
def test_up_spot_runs_end_to_end_then_stop_is_refused_and_down_terminates(ec2, orch_home, tmp_path):
    from orchestrator.tasks import dataset

    m, env = ec2
    ds = dataset.synth(tmp_path / "ds", n_train=8, n_val=4)
    up = run_orch("up", "sp1", "--provider", "aws", "--spot", "--cpu", "--disk", "30", "--data", ds, "--epochs", "1",
                  "--imgsz", "64", "--batch", "4", "--train-arg", "workers=0", "--wait", "--json", env=env, check=0)
    inst = json.loads(up.stdout)
    assert inst["state"] == "ready" and inst["spot"] and inst["run"]["state"] == "completed", up.stderr
    assert (orch_home / "runs" / "sp1" / "weights" / "best.pt").stat().st_size > 0
    [moto] = m.billing()
    assert moto.lifecycle == "spot" and moto.instance_type == "m6i.large" and moto.state == "running"
    assert inst["provider_id"] == f"{moto.id}@us-east-1" and inst["ssh"] == f"root@{moto.public_ip}:22"
    [sent] = runs(m)
    label = label_for(inst["id"], "sp1")
    assert sent["ClientToken"] == label and sent["InstanceMarketOptions.MarketType"] == "spot"
    assert sent["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert "InstanceMarketOptions.SpotOptions.MaxPrice" not in sent, "no ceiling without --bid: the live price"
    assert sent["Placement.AvailabilityZone"] == "us-east-1c"
    assert sent["InstanceInitiatedShutdownBehavior"] == "terminate", "a one-time spot instance cannot stop"
    assert sent["BlockDeviceMapping.1.Ebs.VolumeSize"] == "30" and sent["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    tags = {t["key"]: t["value"] for t in moto.get_tags()}
    assert tags["Name"] == tags["orch:label"] == label and tags["orch:disk-gb"] == "30"
    # Its security group opens port 22 only; its key pair is orch's key.
    [group] = [g for g in m.backend().describe_security_groups() if g.name == "orch-ssh"]
    assert [(r.ip_protocol, r.from_port, r.to_port) for r in group.ingress_rules] == [("tcp", 22, 22)]
    pair = m.backend().key_pairs[moto.key_name]
    assert pair.public_key.split()[:2] == (orch_home / "keys" / "id_ed25519.pub").read_text().split()[:2]
    assert inst["price_hr"] == pytest.approx(0.031 + 30 * 0.08 / 730), "the spot price at launch, disk included"

    stop = run_orch("stop", "sp1", env=env)
    assert stop.returncode == 2 and "stop is not supported by this spot instance: use `orch down sp1`" in stop.stderr
    assert moto.state == "running"
    run_orch("down", "sp1", env=env, check=0)
    assert m.billing() == [] and moto.state == "terminated"


@needs_torch
def test_a_gpu_spot_up_that_fails_verification_here_is_terminated(ec2):
    m, env = ec2
    proc = run_orch("up", "g1", "--provider", "aws", "--gpu", "A10G", "--spot", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no working NVIDIA GPU" in proc.stderr or "verify failed on the GPU" in proc.stderr, proc.stderr
    detail = json.loads(run_orch("status", "g1", "--json", env=env, check=0).stdout)
    assert detail["state"] == "destroyed" and "up failed" in detail["events"][-1]["reason"]
    [sent] = runs(m)
    assert sent["InstanceType"] == "g5.xlarge" and sent["Placement.AvailabilityZone"] == "us-east-1a"
    assert m.billing() == [], "the instance that failed verify was terminated"


def test_a_spot_up_whose_ssh_never_answers_ends_with_nothing_running(ec2):
    m, env = ec2
    m.boot = False  # the instance runs, nothing answers at its address
    proc = run_orch("up", "mute", "--provider", "aws", "--gpu", "A10G", "--spot", "--ssh-timeout", "0.1", env=env)
    assert proc.returncode == 1 and "did not answer" in proc.stderr and "destroying" in proc.stderr, proc.stderr
    assert len(m.instances()) == 1 and m.billing() == []
    events = open_orch().ledger.events(json.loads(run_orch("status", "mute", "--json", env=env, check=0).stdout)["id"])
    assert legal_path(events)[-2:] == ["destroying", "destroyed"]


def test_bids_are_per_gpu_and_a_bid_below_the_live_price_is_refused_before_anything_runs(ec2):
    m, env = ec2
    low = run_orch("up", "b1", "--provider", "aws", "--gpu", "A10G", "--gpus", "4", "--spot", "--bid", "0.5", env=env)
    assert low.returncode == 2 and "below g5.12xlarge's live spot price 0.5250" in low.stderr, low.stderr
    assert runs(m) == []
    provider = open_orch().provider("aws")
    remote = provider.create(Request(name="b2", gpu="A10G", gpus=4, spot=True, bid=0.6), label_for("b" * 12, "b2"),
                             config.ssh_key()[1])
    assert runs(m)[-1]["InstanceMarketOptions.SpotOptions.MaxPrice"] == "2.4000"  # 0.6 $/h per GPU x 4
    assert remote.gpus == 4 and remote.gpu_name == "A10G" and remote.spot
    # The same label again (a create repeated after an error) is the same instance: ClientToken.
    again = provider.create(Request(name="b2", gpu="A10G", gpus=4, spot=True, bid=0.6), label_for("b" * 12, "b2"),
                            config.ssh_key()[1])
    assert again.provider_id == remote.provider_id and len(m.billing()) == 1
    provider.destroy(remote.provider_id)
    assert m.billing() == []
    bad = run_orch("up", "b3", "--provider", "aws", "--image", "ubuntu:22.04", "--cpu", env=env)
    assert bad.returncode == 2 and "AMI id" in bad.stderr and runs(m)[-1]["ClientToken"] != "b3"


# -- stop, start, the watchdog's power-off, preemption -----------------------------------------------
def test_on_demand_stops_and_starts_on_a_new_address_and_its_watchdog_powers_it_off(ec2, orch_home):
    from orchestrator.money import policy as policies
    from orchestrator.reaper import reaper

    m, env = ec2
    orch = open_orch()
    inst = arrange(orch, "od")
    provider = orch.provider("aws")
    assert runs(m)[-1]["InstanceInitiatedShutdownBehavior"] == "stop" and "InstanceMarketOptions.MarketType" \
        not in runs(m)[-1]
    assert provider.self_stop_command(inst.provider_id, destroy=False) and \
        provider.self_stop_command(inst.provider_id, destroy=True) is None
    first = inst.ssh_host
    run_orch("stop", "od", env=env, check=0)
    iid = inst.provider_id.split("@")[0]
    assert m.instance(iid).state == "stopped" and provider.get(inst.provider_id).stopped_price_hr > 0

    inst = orch.ledger.update(inst.id, policy=policies.Policy(idle_minutes=0.02).to_json())
    run_orch("start", "od", env=env, check=0)
    # Read the ledger, not `orch status`: the watchdog (idle after 1.2 s) may already be powering it off.
    inst = orch.ledger.get(inst.id)
    assert inst.state == states.READY and orch.ledger.events(inst.id)[-1].from_state == states.STARTING
    assert inst.ssh_host != first, "a new public address after a start"
    assert orch.ledger.recall(inst.id, "watchdog")["commands"] == ["stop"]
    wait_for(lambda: m.instance(iid).state == "stopped", timeout=60, what="the watchdog's power-off")
    assert m.instance(iid).state_reason.code == "Client.InstanceInitiatedShutdown"
    out = {o.name: o for o in reaper.reap(open_orch())}["od"]
    assert out.state == states.STOPPED
    stop = [e for e in orch.ledger.events(inst.id) if e.to_state == states.STOPPED and e.from_state == states.READY]
    # EC2's word is that it powered off from inside; who ran the power-off is its watchdog's to say
    # (its state file, read once it is back): never inferred (issue 43).
    assert stop[-1].actor != "watchdog" and "not by orch" in stop[-1].reason, stop[-1].reason
    assert "Client.InstanceInitiatedShutdown" in stop[-1].reason  # the provider's word, kept
    run_orch("down", "od", "--no-pull", env=env, check=0)
    assert m.billing() == []


def test_a_spot_instance_taken_back_by_the_market_is_preempted_not_lost(ec2):
    m, env = ec2
    orch = open_orch()
    inst = arrange(orch, "sp", spot=True)
    provider = orch.provider("aws")
    assert not can_stop(provider, spot=True) and can_stop(provider, spot=False)
    assert provider.self_stop_command(inst.provider_id, destroy=True) and \
        provider.self_stop_command(inst.provider_id, destroy=False) is None
    m.preempt(inst.provider_id.split("@")[0])
    remote = provider.get(inst.provider_id)
    assert (remote.status, remote.preempted) == (Status.GONE, True) and "SpotInstanceTermination" in remote.detail
    refreshed = orch.refresh(orch.ledger.get(inst.id))
    # Terminated, its root volume with it: the row ends, and nothing is billed from then on.
    assert refreshed.state == states.DESTROYED
    events = orch.ledger.events(inst.id)
    assert legal_path(events)[-3:] == ["preempted", "destroying", "destroyed"]
    assert "spot market" in events[-3].reason and "nothing of it bills" in events[-2].reason
    assert m.billing() == []
    from orchestrator.money import cost

    [row], _ = cost.report(orch.ledger, "sp", None)
    time.sleep(1.0)  # clock: a second of wall time, which anything still billing would be charged for
    [later], _ = cost.report(orch.ledger, "sp", None)
    assert later.total_usd == row.total_usd, "nothing billed after the termination, its disk included"
    assert row.stopped_hours < 1 / 3600, "no stretch at the disk's rate: the volume went with the instance"


def test_a_spot_instance_ec2_has_forgotten_is_preempted_not_lost(ec2):
    """Nobody looked while EC2 still showed the termination's reason (about an hour): the instance is
    simply not found. A spot instance gone without orch destroying it was taken back by its market."""
    m, env = ec2
    orch = open_orch()
    inst = arrange(orch, "old", spot=True)
    iid = inst.provider_id.split("@")[0]
    m.preempt(iid)
    m.backend().reservations.clear()  # EC2 forgets terminated instances
    assert orch.provider("aws").get(inst.provider_id).status == Status.GONE
    assert orch.refresh(orch.ledger.get(inst.id)).state == states.DESTROYED
    assert legal_path(orch.ledger.events(inst.id))[-3:] == ["preempted", "destroying", "destroyed"]


# -- reconcile and reap ------------------------------------------------------------------------------
def test_reconcile_adopts_a_stray_marks_the_gone_lost_and_a_failed_listing_leaves_all_alone(ec2):
    from orchestrator.instances import reconcile as rec
    from orchestrator.ledger.ledger import new_id

    m, env = ec2
    orch = open_orch()
    provider = orch.provider("aws")
    stray = new_id()
    provider.create(Request(name="stray", cpu=True, spot=True), label_for(stray, "stray"), config.ssh_key()[1])
    gone = arrange(orch, "gone")
    m.backend().terminate_instances([gone.provider_id.split("@")[0]])  # the EC2 console, say

    m.fail("DescribeInstances", times=20)
    failed = run_orch("reconcile", env=env)
    line = next(x for x in failed.stdout.splitlines() if x.startswith("aws"))
    assert failed.returncode == 1 and "listing failed" in line and "left alone: gone" in line, failed.stdout
    assert orch.ledger.get(gone.id).state == states.READY, "a failed listing was read as an empty fleet"
    m.fail("DescribeInstances", times=0)

    report = {p.provider: p for p in rec.reconcile(orch).providers}["aws"]
    assert report.adopted == ["stray"] and report.lost == ["gone"], report
    adopted = orch.ledger.get(stray)
    assert adopted.state == states.READY and adopted.spot and adopted.cpu_only
    assert adopted.price_hr == pytest.approx(0.031 + 20 * 0.08 / 730), "the price at launch, from its tags"
    orch.down(adopted)
    assert m.billing() == []


def test_reap_destroys_an_idle_spot_instance_it_cannot_stop(ec2, monkeypatch):
    from orchestrator.money import policy as policies
    from orchestrator.reaper import reaper

    m, _ = ec2
    monkeypatch.setenv("ORCH_WATCHDOG", "off")  # the reaper alone on duty
    orch = open_orch()
    inst = arrange(orch, "idle", spot=True)
    orch.ledger.update(inst.id, policy=policies.Policy(idle_minutes=0.01).to_json())
    time.sleep(1.5)  # clock: the idle rule's 0.01 min (0.6 s of wall time since ready) must have run out
    out = {o.name: o for o in reaper.reap(open_orch())}["idle"]
    assert out.state == states.DESTROYED, out
    assert m.billing() == []


def test_account_key_is_the_key_pair_orch_imports(ec2):
    m, _ = ec2
    provider = open_orch().provider("aws")
    pub = config.ssh_key()[1]
    assert "not imported yet" in provider.account_key(pub)
    ensure_key(provider.session, "us-east-1", pub)
    assert provider.account_key(pub).startswith("held as EC2 key pair orch-")


def test_without_credentials_aws_is_not_asked_and_says_why_when_named(orch_home, monkeypatch):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    assert "aws" not in [line.split()[0] for line in run_orch("reconcile", check=0).stdout.splitlines()]
    proc = run_orch("offers", "--provider", "aws")
    assert proc.returncode == 1 and "aws" in proc.stderr and "Traceback" not in proc.stderr


# -- spot zones, errors, the security group, regions, the catalogue ----------------------------------
def test_a_spot_create_sends_no_max_price_and_a_full_zone_gives_way_to_the_next(ec2):
    m, env = ec2
    provider = open_orch().provider("aws")
    m.no_capacity = {"us-east-1a"}  # the cheapest zone (0.42) has no g5.xlarge now
    made = provider.create(Request(name="z", gpu="A10G", spot=True), label_for("c" * 12, "z"), config.ssh_key()[1])
    tried = [(r["Placement.AvailabilityZone"], r.get("InstanceMarketOptions.SpotOptions.MaxPrice")) for r in runs(m)]
    assert tried == [("us-east-1a", None), ("us-east-1b", None)], tried
    [inst] = m.billing()
    assert inst.placement.zone == "us-east-1b" and made.provider_id == f"{inst.id}@us-east-1"
    assert made.price_hr == pytest.approx(0.47 + 20 * 0.08 / 730), "the price of the zone it got"
    provider.destroy(made.provider_id)

    m.no_capacity = {"us-east-1a", "us-east-1b"}
    proc = run_orch("up", "full", "--provider", "aws", "--gpu", "A10G", "--spot", env=env)
    assert proc.returncode == 1 and "AWS has no capacity for g5.xlarge in us-east-1" in proc.stderr
    assert "InsufficientInstanceCapacity" in proc.stderr and m.billing() == []
    from orchestrator.errors import NoCapacity

    with pytest.raises(NoCapacity):  # so a job moves on to the next offer
        provider.create(Request(name="z2", gpu="A10G", spot=True), label_for("d" * 12, "z2"), config.ssh_key()[1])


def test_an_on_demand_create_walks_the_zones_and_unsupported_is_not_read_as_no_capacity(ec2):
    """On demand, as spot: a zone out of capacity gives way to the next zone that offers the type. A
    zone that does not support the request (EC2's ``Unsupported``) gives way too; one that no zone
    supports is an error of its own, not "no capacity" (which would send a job on to the next offer
    as if the market were full)."""
    from orchestrator.errors import NoCapacity, ProviderError

    m, env = ec2
    provider = open_orch().provider("aws")
    pub = config.ssh_key()[1]
    m.no_capacity = {"us-east-1a"}  # where EC2 puts an on-demand launch that names no zone
    made = provider.create(Request(name="od", cpu=True), label_for("1" * 12, "od"), pub)
    assert [r.get("Placement.AvailabilityZone") for r in runs(m)] == ["us-east-1a", "us-east-1b"]
    assert m.instance(made.provider_id.split("@")[0]).placement.zone == "us-east-1b"
    provider.destroy(made.provider_id)

    m.no_capacity = set()
    unsupported = ("Your requested instance type (m6i.large) is not supported in your requested Availability "
                   "Zone (us-east-1a). Please retry your request by not specifying an Availability Zone or "
                   "choosing us-east-1b, us-east-1c.")
    m.fail("RunInstances", code="Unsupported", message=unsupported)
    made = provider.create(Request(name="od2", cpu=True), label_for("2" * 12, "od2"), pub)
    assert m.instance(made.provider_id.split("@")[0]).placement.zone == "us-east-1b"
    provider.destroy(made.provider_id)

    m.fail("RunInstances", times=10, code="Unsupported", message="The requested configuration is currently not "
           "supported. Please check the documentation for supported configurations.")
    with pytest.raises(ProviderError, match="does not support this request") as refused:
        provider.create(Request(name="od3", cpu=True), label_for("3" * 12, "od3"), pub)
    assert not isinstance(refused.value, NoCapacity) and "Unsupported" in str(refused.value)
    assert m.billing() == []


def test_a_create_with_a_quote_rents_it_as_listed_and_lists_nothing_again(ec2):
    """Plan once: the offer a plan chose (``Request.quote``) is rented as it was listed, its type,
    prices and zones by spot price included; neither the types nor the spot market is asked again."""
    m, _ = ec2
    provider = open_orch().provider("aws")
    [spot] = [o for o in provider.offers(Request(name="q", gpu="A10G", spot=True))
              if o.offer_id == "us-east-1:g5.xlarge"]
    assert spot.raw["spot_zones"] == {"us-east-1a": 0.42, "us-east-1b": 0.47}, "every zone's price, cheapest first"
    # As the offers cache keeps it (JSON), and after the listing: a new cheaper zone the quote never saw.
    spot = Offer(**json.loads(json.dumps(asdict(spot), default=str)))
    m.spot("g5.xlarge", "us-east-1c", 0.30, minutes_ago=1)
    m.no_capacity = {"us-east-1a"}
    listed = len(m.requests("DescribeInstanceTypes")), len(m.requests("DescribeSpotPriceHistory"))
    assert listed[0] and listed[1]
    made = provider.create(Request(name="q", gpu="A10G", spot=True, offer=spot.offer_id, quote=spot),
                           label_for("e" * 12, "q"), config.ssh_key()[1])
    assert (len(m.requests("DescribeInstanceTypes")), len(m.requests("DescribeSpotPriceHistory"))) == listed
    assert [r["Placement.AvailabilityZone"] for r in runs(m)] == ["us-east-1a", "us-east-1b"], "the quote's zones"
    assert runs(m)[-1]["InstanceType"] == "g5.xlarge" and made.gpu_name == "A10G" and made.spot
    assert made.price_hr == pytest.approx(0.47 + 20 * 0.08 / 730)
    provider.destroy(made.provider_id)

    [on_demand] = [o for o in provider.offers(Request(name="q", gpu="A10G")) if o.offer_id == "us-east-1:g5.xlarge"]
    listed = len(m.requests("DescribeInstanceTypes")), len(m.requests("DescribeSpotPriceHistory"))
    made = provider.create(Request(name="r", gpu="A10G", offer=on_demand.offer_id, quote=on_demand),
                           label_for("f" * 12, "r"), config.ssh_key()[1])
    assert (len(m.requests("DescribeInstanceTypes")), len(m.requests("DescribeSpotPriceHistory"))) == listed
    # On demand too, the zones in turn (us-east-1a is still out): where EC2 offers the type, in name order.
    assert [r["Placement.AvailabilityZone"] for r in runs(m)[-2:]] == ["us-east-1a", "us-east-1b"]
    assert runs(m)[-1]["InstanceType"] == "g5.xlarge" and "InstanceMarketOptions.MarketType" not in runs(m)[-1]
    assert made.price_hr == pytest.approx(on_demand.price_hr + 20 * 0.08 / 730) and not made.spot
    provider.destroy(made.provider_id)
    # Without a quote, the create lists the offers itself, as before.
    made = provider.create(Request(name="s", gpu="A10G"), label_for("a" * 12, "s"), config.ssh_key()[1])
    assert len(m.requests("DescribeInstanceTypes")) == listed[0] + 1
    provider.destroy(made.provider_id)
    assert m.billing() == []


def test_a_destroy_right_after_the_create_terminates_what_ec2_does_not_show_yet(ec2):
    m, _ = ec2
    provider = open_orch().provider("aws")
    made = provider.create(Request(name="v", cpu=True), label_for("9" * 12, "v"), config.ssh_key()[1])
    iid = made.provider_id.split("@")[0]
    # EC2's eventual consistency: the lookups right after run_instances do not show it yet.
    m.fail("DescribeInstances", times=2, code="InvalidInstanceID.NotFound",
           message=f"The instance ID '{iid}' does not exist")
    assert provider.get(made.provider_id).status == Status.PENDING, "just made: pending, not gone"
    provider.destroy(made.provider_id)
    assert [r["InstanceId.1"] for r in m.requests("TerminateInstances")] == [iid]
    assert m.billing() == []
    # Once shown, not shown is gone; and a provider that did not make it gives no grace.
    for provider in (provider, provider.__class__(dict(SETTINGS))):
        m.fail("DescribeInstances", code="InvalidInstanceID.NotFound",
               message=f"The instance ID '{iid}' does not exist")
        assert provider.get(made.provider_id).status == Status.GONE


@pytest.mark.parametrize("code, spot, quota", [
    ("VcpuLimitExceeded", False, 'quota "Running On-Demand G and VT instances" (L-DB2E81BA'),
    ("MaxSpotInstanceCountExceeded", True, 'quota "All G and VT Spot Instance Requests" (L-3819A6DF')])
def test_a_quota_error_is_one_line_naming_the_quota_and_how_to_raise_it(ec2, code, spot, quota):
    m, env = ec2
    m.quota = code
    proc = run_orch("up", "q1", "--provider", "aws", "--gpu", "A10G", *(["--spot"] if spot else []), env=env)
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and error.startswith("orch: error: AWS refused g5.xlarge in us-east-1"), proc.stderr
    assert quota in error and code in error and "service-quotas request-service-quota-increase" in error
    assert m.billing() == [] and len(runs(m)) == 1, "a quota is no zone's problem: not tried elsewhere"
    assert json.loads(run_orch("status", "q1", "--json", env=env, check=0).stdout)["state"] == "failed"


def test_an_orch_ssh_group_without_its_rule_gets_it_back(ec2):
    import boto3

    m, _ = ec2
    ec2c = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2c.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    # What a failed authorize (or a rule deleted by hand) leaves: the group, and no port 22.
    gid = ec2c.create_security_group(GroupName="orch-ssh", VpcId=vpc, Description="orch: SSH (port 22) only")["GroupId"]
    provider = open_orch().provider("aws")
    assert ensure_ssh_group(provider.session, "us-east-1") == gid
    [rule] = ec2c.describe_security_groups(GroupIds=[gid])["SecurityGroups"][0]["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 22, 22)
    assert [r["CidrIp"] for r in rule["IpRanges"]] == ["0.0.0.0/0"]
    again = ensure_ssh_group(provider.session, "us-east-1")
    assert again == gid, "the rule is there: nothing to add (no Duplicate error)"
    assert len(m.requests("AuthorizeSecurityGroupIngress")) == 1
    # Two orch processes importing the key at once: the second's Duplicate is "look again", not a failure.
    pub = config.ssh_key()[1]
    name = ensure_key(provider.session, "us-east-1", pub)
    m.fail("DescribeKeyPairs", code="InvalidKeyPair.NotFound", message=f"The key pair '{name}' does not exist")
    # Its look missed the other's key; its import: Duplicate.
    assert ensure_key(provider.session, "us-east-1", pub) == name
    assert m.requests("ImportKeyPair")[-1]["KeyName"] == name and len(m.requests("ImportKeyPair")) == 2


def test_an_offer_in_another_region_is_listed_and_found_after_a_crash(ec2, orch_home):
    m, env = ec2
    m.add_dlami("us-west-2")
    killed = run_orch("up", "west", "--provider", "aws", "--cpu", "--offer", "us-west-2:m6i.large",
                      env={**env, "ORCH_TEST_KILL_AT": "create-returned"})
    assert killed.returncode == -9
    [inst] = m.billing("us-west-2")
    provider = open_orch().provider("aws")
    assert provider.regions == ["us-east-1"], "configured for us-east-1 only"
    assert [r.provider_id for r in provider.list()] == [f"{inst.id}@us-west-2"], "listed where it was made"
    run_orch("reap", env={**env, "ORCH_WATCHDOG": "off"}, check=0)
    row = json.loads(run_orch("status", "west", "--json", env=env, check=0).stdout)
    assert row["provider_id"] == f"{inst.id}@us-west-2" and row["state"] in ("provisioning", "ready"), row
    assert "found at aws" in row["events"][1]["reason"]
    run_orch("down", "west", "--no-pull", env=env, check=0)
    assert m.billing("us-west-2") == []


def test_the_catalogue_is_what_the_deep_learning_ami_runs(ec2, orch_home):
    m, env = ec2
    # Prices for types the built-in table lacks, so that only the catalogue decides what is offered.
    priced = {"gr6.4xlarge": 1.54, "g6f.xlarge": 0.2, "gr6f.4xlarge": 0.9, "p3dn.24xlarge": 31.2}
    provider = open_orch().provider("aws").__class__({**SETTINGS, "on_demand_prices": priced}, orch_home)
    l4 = {o.offer_id for o in provider.offers(Request(name="o", gpu="L4"))}
    assert "us-east-1:gr6.4xlarge" in l4 and "us-east-1:g6.xlarge" in l4
    assert not any(":g6f." in o or ":gr6f." in o for o in l4), "fractional GPUs are not offered"
    assert provider.offers(Request(name="o", gpu="V100", gpus=8)) == [], "p3dn: not on the default AMI"
    proc = run_orch("up", "v1", "--provider", "aws", "--offer", "p3dn.24xlarge", env=env)
    assert proc.returncode == 2 and "p3dn instances do not run orch's default Deep Learning AMI" in proc.stderr
    assert runs(m) == []
    with_ami = provider.__class__({**SETTINGS, "ami": "ami-0123456789abcdef0", "on_demand_prices": priced}, orch_home)
    assert [o.offer_id for o in with_ami.offers(Request(name="o", gpu="V100", gpus=8))] == ["us-east-1:p3dn.24xlarge"]


netns.isolate(globals(), shards=2)
