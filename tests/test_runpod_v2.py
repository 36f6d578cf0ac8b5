"""The RunPod provider through the ``orch`` CLI on the fake RunPod's REST API v2, its GraphQL pod and
volume mutations answering as retired (the fake's default): stock before renting, and network volumes."""

from __future__ import annotations

import json

from tests.clouds import open_orch, runpod  # noqa: F401 - fixture
from tests.conftest import run_orch


def test_offers_say_an_out_of_stock_type_is_out_of_stock_and_up_never_asks_for_it(orch_home, runpod):
    fake, env = runpod
    proc = run_orch("offers", "--provider", "runpod", "--gpu", "A100 SXM", env=env)
    assert proc.returncode == 0 and "no offer matches" in proc.stdout
    assert "runpod: A100 SXM x1 out of stock in every secure data center" in proc.stderr, proc.stderr
    data = json.loads(run_orch("offers", "--provider", "runpod", "--gpu", "A100 SXM", "--json", env=env).stdout)
    assert data["offers"] == [] and data["out_of_stock"][0]["why"] == "out of stock in every secure data center"
    # In stock on one cloud only: offered there, and ranked.
    pcie = json.loads(run_orch("offers", "--provider", "runpod", "--gpu", "A100 PCIe", "--json", env=env).stdout)
    assert [o["offer_id"] for o in pcie["offers"]] == ["NVIDIA A100 80GB PCIe"]
    assert 1.19 < pcie["offers"][0]["price_hr"] < 1.2  # Community Cloud's price (and the disk)

    up = run_orch("up", "box", "--provider", "runpod", "--gpu", "A100 SXM", "--ssh-timeout", "1", env=env)
    assert up.returncode != 0 and "out of stock in every secure data center" in up.stderr, up.stderr
    assert fake.sent("POST", "/v2/pods") == [] and fake.pods == {}
    cheapest = run_orch("up", "box2", "--provider", "runpod", "--cheapest", "--gpu", "A100 SXM", env=env)
    assert cheapest.returncode != 0 and fake.sent("POST", "/v2/pods") == []


def test_volume_create_and_rm_go_through_v2(orch_home, runpod):
    fake, env = runpod
    made = run_orch("volume", "create", "cache", "--provider", "runpod", "--size", "20", "--region", "EU-RO-1",
                    "--json", env=env)
    assert made.returncode == 0, made.stderr
    [vol] = fake.network_volumes.values()
    assert (vol["name"], vol["size"], vol["dataCenterId"]) == ("orch-vol-cache", 20, "EU-RO-1")
    assert fake.sent("POST", "/v2/network-volumes") == [{"name": "orch-vol-cache", "size": 20, "dataCenter": "EU-RO-1"}]
    gone = run_orch("volume", "rm", "cache", "--yes", env=env)
    assert gone.returncode == 0, gone.stderr
    assert fake.network_volumes == {}
    assert not any(q.lstrip().startswith("mutation") for q in fake.queries)  # no GraphQL at all
