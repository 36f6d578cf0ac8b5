"""`orch cost` from a known timeline: running and stopped time at the price paid, idle waste, exact."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.money import cost
from orchestrator.ledger.ledger import Event, Instance, new_id
from tests.conftest import run_orch

DAY = datetime(2026, 7, 31, tzinfo=timezone.utc)


def at(hhmm: str, day: int = 0) -> datetime:
    h, m = map(int, hhmm.split(":"))
    return DAY + timedelta(days=day, hours=h, minutes=m)


def build(ledger, name, provider, price, stopped, timeline, runs=()):
    """An instance whose events happened at fixed times (what the ledger would hold afterwards)."""
    with ledger.session() as s:
        inst = Instance(id=new_id(), name=name, provider=provider, label=f"orch-x-{name}",
                        state=timeline[-1][1], price_hr=price, stopped_price_hr=stopped)
        s.add(inst)
        s.flush()
        prev = None
        for when, to in timeline:
            s.add(Event(instance_id=inst.id, from_state=prev, to_state=to, reason="test", at=when))
            prev = to
        s.commit()
    for started, ended in runs:
        ledger.add_run(instance_id=inst.id, model="yolo9-t", data="x", epochs=1, started_at=started, ended_at=ended,
                       state="completed")
    return inst


@pytest.fixture
def fleet(ledger):
    # The seed's machine: 3.4828 $/hr running, 0.0694 $/hr stopped (250 GB at 0.20 $/GB-month).
    build(ledger, "big", "vastai", 3.4828, 0.0694, [
        (at("10:00"), "requested"), (at("10:01"), "provisioning"), (at("10:16"), "ready"),
        (at("12:50"), "stopping"), (at("12:51"), "stopped"),            # 30 min idle after the run
        (at("12:51", 1), "starting"), (at("12:53", 1), "ready"),        # stopped exactly 24 h
        (at("13:53", 1), "destroying"), (at("13:54", 1), "destroyed"),
    ], runs=[(at("10:20"), at("12:20"))])
    build(ledger, "small", "vastai", 1.0, 0.0, [
        (at("10:00"), "requested"), (at("10:00"), "provisioning"), (at("11:00"), "ready"),
        (at("11:30"), "destroying"), (at("11:31"), "destroyed"),
    ])
    return ledger


def test_known_timeline_exact_figures(fleet):
    rows, totals = cost.report(fleet, until=at("00:00", 5))
    big = next(r for r in rows if r.name == "big")
    # compute: provisioning 15 + ready 154 + stopping 1 + starting 2 + ready 60 = 232 min
    assert big.running_hours == pytest.approx(232 / 60)
    assert big.running_usd == pytest.approx(232 / 60 * 3.4828)
    assert big.stopped_hours == pytest.approx(24.0)
    assert big.stopped_usd == pytest.approx(24 * 0.0694)
    assert big.total_usd == pytest.approx(232 / 60 * 3.4828 + 24 * 0.0694)
    # billed after the run ended at 12:20 until it stopped at 12:51: 30 min ready + 1 min stopping
    assert big.idle_hours == pytest.approx(31 / 60)
    assert big.idle_usd == pytest.approx(31 / 60 * 3.4828)
    small = next(r for r in rows if r.name == "small")
    assert (small.running_hours, small.running_usd, small.idle_usd) == (pytest.approx(1.5), pytest.approx(1.5), 0)
    vast = totals["vastai"]
    assert vast["total_usd"] == pytest.approx(big.total_usd + 1.5)
    assert vast["idle_usd"] == pytest.approx(big.idle_usd)


def test_since_clips_the_timeline(fleet):
    rows, _ = cost.report(fleet, since=at("00:00", 1), until=at("00:00", 5))
    assert [r.name for r in rows] == ["big"], "nothing billed since then: small is left out"
    big = rows[0]
    assert big.stopped_hours == pytest.approx(12 + 51 / 60)  # 00:00 -> 12:51 of the second day
    assert big.running_hours == pytest.approx(62 / 60) and big.idle_hours == 0


def test_cost_command_json_and_table(fleet):
    out = json.loads(run_orch("cost", "--json", check=0).stdout)
    big = next(r for r in out["instances"] if r["name"] == "big")
    assert big["total_usd"] == pytest.approx(232 / 60 * 3.4828 + 24 * 0.0694)
    assert out["providers"]["vastai"]["running_usd"] == pytest.approx(232 / 60 * 3.4828 + 1.5)
    one = json.loads(run_orch("cost", "big", "--since", "2026-08-01", "--json", check=0).stdout)
    assert [r["name"] for r in one["instances"]] == ["big"] and one["since"].startswith("2026-08-01")
    table = run_orch("cost", check=0).stdout
    assert "big" in table and "$15.13" in table and "vastai" in table  # 13.4668 + 1.6656 = 15.1324
    bad = run_orch("cost", "--since", "last tuesday")
    assert bad.returncode == 2 and "--since" in bad.stderr
    assert run_orch("cost", "nosuch").returncode == 2


def test_live_instance_bills_until_now():
    start = datetime(2026, 7, 31, 10, tzinfo=timezone.utc)
    from types import SimpleNamespace as NS

    inst = NS(name="live", id="x", provider="local", state="ready", price_hr=2.0, stopped_price_hr=0.0)
    events = [NS(at=start, to_state="provisioning", id=1), NS(at=start + timedelta(hours=1), to_state="ready", id=2)]
    run = NS(started_at=start + timedelta(hours=1), ended_at=start + timedelta(hours=2))
    c = cost.instance_cost(inst, events, [run], until=start + timedelta(hours=5))
    assert c.running_hours == pytest.approx(5.0) and c.idle_hours == pytest.approx(3.0) and c.idle_usd == pytest.approx(6.0)
