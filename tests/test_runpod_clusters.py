"""`--nodes N` on RunPod: one Instant Cluster (REST API v2 ``/v2/clusters``) on the fake RunPod, its
member pods real sshd hosts on 127.x and its GraphQL pod mutations retired: made all or nothing, its
members mapped to orch's nodes by the cluster's ranks and addresses, ended whole."""

from __future__ import annotations

import json
import signal

from tests.clouds import configure, open_orch, orch_proc, runpod, wait_for  # noqa: F401 - fixture
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
    assert "runpod: RTX 4090 x1 offered as an Instant Cluster in no data center now" in proc.stderr
    up = run_orch("up", "pair", "--provider", "runpod", "--gpu", "RTX 4090", "--nodes", "2", env=env)
    assert up.returncode == 2, up.stderr  # bad input: exit 2, one error line naming why, nothing made
    assert up.stderr.strip().splitlines()[-1].startswith(
        "orch: error: --nodes 2: RunPod offers no Instant Cluster of RTX 4090 x1 per node in any data center now")
    assert not [i for i in open_orch().ledger.instances() if i.name.startswith("pair")]
    assert "those it offers: H100 SXM" in up.stderr
    assert fake.sent("POST", "/v2/clusters") == [] and fake.sent("POST", "/v2/pods") == []


def test_ctrl_c_during_a_clusters_bring_up_leaves_nothing(orch_home, runpod):
    fake, env = runpod
    fake.runtime_delay = 10**6  # its members stay STARTING: the bring-up waits on them
    proc = orch_proc("up", "g", "--provider", "runpod", "--gpu", "H100 SXM", "--nodes", "2", env=env)

    def made():
        if proc.poll() is not None:
            return "ended"
        return (orch_home / "ledger.db").exists() and \
            len([i for i in open_orch().ledger.instances() if i.state == "provisioning"]) == 2
    try:
        got = wait_for(made, 120, "the cluster made and both nodes provisioning", every=0.1)
        assert got is True, f"orch up ended ({proc.returncode}) first: {proc.communicate()[1][-3000:]}"
        assert len(fake.live_clusters()) == 1
        member = next(p for p in fake.pods.values() if p.cluster)
        # A member can neither stop nor delete itself (409): its watchdog gets no self-ending command.
        assert open_orch().provider("runpod").self_stop_command(member.id, destroy=True) is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "orch: interrupted" in err, err
    assert fake.live_clusters() == [] and fake.live() == [], "the cluster deleted, every member with it"
    assert all(i.state in ("destroyed", "failed") for i in open_orch().ledger.instances())


def test_a_member_that_never_starts_fails_the_bring_up_and_deletes_the_cluster(orch_home, runpod):
    fake, env = runpod
    configure(orch_home, "runpod", fake.settings(destroy_timeout=5, container_start_minutes=0.02))
    fake.fail_cluster_member = 1  # its last member's container never starts
    proc = run_orch("up", "g", "--provider", "runpod", "--gpu", "H100 SXM", "--nodes", "2", env=env)
    assert proc.returncode != 0 and "has not started its container" in proc.stderr, proc.stderr
    assert fake.live_clusters() == [] and fake.live() == []
    assert len(fake.sent("POST", "/v2/clusters")) == 1  # all or nothing: no second cluster, no lone pod
    assert fake.sent("POST", "/v2/pods") == []


def test_reconcile_ends_a_cluster_of_orchs_that_the_ledger_does_not_hold(orch_home, runpod):
    """A cluster named for an orch group with no live node (an orch killed after its create, a group
    whose nodes ended one by one): reconcile deletes it, every member with it. Others' clusters stay."""
    from providers.runpod.api import Rest

    fake, env = runpod
    api = Rest(fake.key, attempts=1)
    body = {"name": "orch-grp-0a1b2c3d4e5f-lost", "type": "TRAINING", "image": "runpod/base", "ports": ["22/tcp"],
            "compute": {"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCountPerPod": 1, "podCount": 2}}
    api.once("POST", "/clusters", body)
    theirs = api.once("POST", "/clusters", {**body, "name": "someone-elses"})
    report = json.loads(run_orch("reconcile", "--json", env=env).stdout)
    swept = next(p for p in report["providers"] if p["provider"] == "runpod")["swept"]
    assert len(swept) == 1 and "orch-grp-0a1b2c3d4e5f-lost" in swept[0], report
    assert [c["id"] for c in fake.live_clusters()] == [theirs["id"]]
    assert len(fake.live()) == 2  # the other cluster's members, untouched


def test_a_lost_member_relaunches_the_whole_cluster_and_the_history_says_why(orch_home, runpod):
    """No pod can be added to an Instant Cluster: a lost member is not replaced alone (as on AWS or
    Lambda), the group is relaunched as a new cluster, and the job's history says so."""
    fake, env = runpod
    proc = orch_proc("run", "pair", "--provider", "runpod", "--gpu", "H100 SXM", "--nodes", "2", "--wait", "--json",
                     "--", "sh", "-c", "sleep 6; echo done", env=env)
    try:
        ledger = open_orch().ledger
        wait_for(lambda: (ledger.job("pair") or None) and ledger.job("pair").state == "running", 240,
                 "the job running on both nodes")
        [first] = fake.live_clusters()
        member = next(fake.pods[p] for p in first["pods"] if fake.pods[p].rank == 1)
        with fake._lock:  # its host fails: RunPod's side ends the member pod, the cluster stays
            fake._end(member)
        out, err = proc.communicate(timeout=480)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.strip(), err[-3000:]
    job = json.loads(out)
    assert job["state"] == "completed", (job["history"][-5:], err[-2000:])
    history = " ".join(h["text"] for h in job["history"])
    assert "RunPod cannot add a pod to an Instant Cluster" in history and "whole cluster is relaunched" in history
    assert len(fake.sent("POST", "/v2/clusters")) == 2 and fake.sent("POST", "/v2/pods") == []
    assert fake.live_clusters() == [] and fake.live() == []


def test_offers_for_a_group_are_instant_cluster_offers(orch_home, runpod):
    """`orch offers --nodes 2` on RunPod asks the catalog for clusters (product=CLUSTER): the H100 SXM
    where clusters of it are offered, at its Secure Cloud price for both machines; no pod-only type."""
    fake, env = runpod
    data = json.loads(run_orch("offers", "--provider", "runpod", "--nodes", "2", "--json", env=env).stdout)
    rows = [o for o in data["offers"] if o["provider"] == "runpod"]
    assert [o["offer_id"] for o in rows] == ["NVIDIA H100 80GB HBM3"], rows
    assert 2 * 2.99 < rows[0]["price_hr"] < 2 * 3.0 and "EU-RO-1" in rows[0]["location"]
    assert any("product=CLUSTER" in q for q in fake.queries)
