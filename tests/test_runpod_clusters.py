"""`--nodes N` on RunPod: one Instant Cluster (REST API v2 ``/v2/clusters``) on the fake RunPod, its
member pods real sshd hosts on 127.x and its GraphQL pod mutations retired: made all or nothing, its
members mapped to orch's nodes by the cluster's ranks and addresses, ended whole."""

from __future__ import annotations

import json

from tests.clouds import open_orch, runpod  # noqa: F401 - fixture
from tests.conftest import run_orch

SHOW = (". /etc/rp_environment; "  # RunPod's own variables, as its image gives them to a login shell
        'echo "rank=$ORCH_NODE_RANK of=$ORCH_NUM_NODES head=$ORCH_MASTER_ADDR primary=$PRIMARY_ADDR '
        'node=$NODE_ADDR noderank=$NODE_RANK"')


def test_run_on_two_nodes_rents_one_cluster_and_both_ranks_agree_on_the_head(orch_home, runpod):
    fake, env = runpod
    proc = run_orch("run", "pair", "--provider", "runpod", "--gpu", "H100 SXM", "--nodes", "2", "--wait", "--json",
                    "--", "sh", "-c", SHOW, env=env, check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed", (job["history"][-5:], proc.stderr[-2000:])
    [sent] = fake.sent("POST", "/v2/clusters")
    assert sent["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 1, "podCount": 2}
    assert sent["dataCenterIds"] == ["EU-RO-1"]  # the one data center the catalog offers clusters of it in
    assert fake.sent("POST", "/v2/pods") == []  # no single-pod create
    members = sorted((p for p in fake.pods.values() if p.cluster), key=lambda p: p.rank)
    assert [p.rank for p in members] == [0, 1]
    folder = orch_home / "runs" / "pair"
    seen = {}
    for rank, log in ((0, "train.log"), (1, "train.node1.log")):
        line = next(x for x in (folder / log).read_text().splitlines() if x.startswith("rank="))
        seen[rank] = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
    head = members[0].cluster_ip
    for rank, fields in seen.items():
        assert fields["rank"] == fields["noderank"] == str(rank) and fields["of"] == "2"
        assert fields["head"] == fields["primary"] == head  # orch's head is the cluster's primary
        assert fields["node"] == members[rank].cluster_ip
    assert fake.clusters == {} and fake.live() == []  # the cluster is gone, every member with it
    rows = [i for i in open_orch().ledger.instances() if i.name.startswith("pair-")]
    assert {i.private_ip for i in rows} == {p.cluster_ip for p in members}
    assert all(i.state == "destroyed" for i in rows)


def test_a_gpu_type_without_clusters_is_refused_before_anything_is_asked(orch_home, runpod):
    fake, env = runpod
    proc = run_orch("run", "pair", "--provider", "runpod", "--gpu", "RTX 4090", "--nodes", "2", "--", "true",
                    env=env)
    assert proc.returncode != 0, proc.stderr
    assert "RunPod offers no Instant Cluster of RTX 4090 x1 per node in any data center now" in proc.stderr
    assert "those it offers: H100 SXM" in proc.stderr
    assert fake.sent("POST", "/v2/clusters") == [] and fake.sent("POST", "/v2/pods") == []
