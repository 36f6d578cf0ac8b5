"""`--nodes N`: a group of local instances brought up together, all or nothing, shown and ended as one."""

import json
import time

import pytest

from tests.conftest import run_orch
from tests.test_offers import fakes  # noqa: F401  (the fake RunPod and Vast.ai APIs)


def _leftovers(home):
    """What would still bill: local instances on disk, live rows in the ledger."""
    from orchestrator.instances.lifecycle import Orch

    root = home / "local"
    dirs = sorted(p.name for p in root.iterdir()) if root.exists() else []
    return dirs, [i.name for i in Orch.open(say=lambda m: None).ledger.instances(live_only=True)]


@pytest.mark.parametrize("args, says", [
    (["--nodes", "0", "--cpu"], "--nodes must be between 1 and 64, not 0"),
    (["--nodes", "1000", "--cpu"], "--nodes must be between 1 and 64, not 1000"),
    (["--nodes", "2", "--provider", "vastai", "--gpu", "RTX 4090", "--data", "DS", "--batch", "8"], "vastai cannot rent a group of instances (its marketplace instances are on unrelated hosts with no private "
     "network between them (Vast's overlay networks are another API, planned separately)); these can: aws, lambda, "
     "local, runpod"),
    (["--nodes", "3", "--cpu", "--data", "DS", "--batch", "4"], "--batch 4 does not divide by the world size 3"),
    (["--nodes", "2", "--gpus", "2", "--provider", "local", "--data", "DS"], "give --batch"),
    (["--nodes", "-1", "--cpu"], "--nodes must be between 1 and 64, not -1"),
])
@pytest.mark.parametrize("command", ["up", "run"])
def test_bad_group_input_is_one_line_exit_2_and_nothing_is_made(orch_home, tmp_path, args, says, command):
    from orchestrator.tasks import dataset

    ds = dataset.synth(tmp_path / "ds", n_train=2, n_val=1)
    args = [str(ds) if a == "DS" else a for a in args]
    if command == "run" and "--data" not in args:
        args += ["--data", str(ds)]
    p = run_orch(command, "g", *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr
    assert not orch_home.exists(), "nothing created: no ledger, no instance, no home"


def test_a_group_jobs_name_must_leave_room_for_its_nodes(orch_home, tmp_path):
    from orchestrator.tasks import dataset

    ds = dataset.synth(tmp_path / "ds", n_train=2, n_val=1)
    p = run_orch("run", "j" * 34, "--nodes", "2", "--cpu", "--data", ds)
    assert p.returncode == 2 and "at most 33 characters" in p.stderr and not orch_home.exists(), p.stderr


def test_vastai_refuses_a_group_before_any_api_call(orch_home, monkeypatch):
    """Its API points at a port where nothing listens (conftest): a refusal that asked it first
    would say so; it names what the provider lacks instead. (RunPod rents groups as Instant Clusters:
    tests/test_runpod_clusters.py.)"""
    monkeypatch.setenv("VAST_API_KEY", "k")
    for provider in ("vastai",):
        p = run_orch("up", "g", "--nodes", "2", "--provider", provider, "--gpu", "RTX 4090")
        assert p.returncode == 2 and "no private network" in p.stderr, p.stderr
        # where a group can be had: every provider that rents one (it named three, leaving RunPod out)
        assert "these can: aws, lambda, local, runpod" in p.stderr, p.stderr
    assert not orch_home.exists()


def test_a_local_group_comes_up_together_is_shown_as_one_and_goes_down_as_one(orch_home):
    t0 = time.monotonic()
    up = run_orch("up", "pair", "--nodes", "2", "--cpu", "--json", check=0)
    took = time.monotonic() - t0
    group = json.loads(up.stdout)
    assert group["group"] == "pair" and [n["name"] for n in group["nodes"]] == ["pair-0", "pair-1"]
    assert {n["state"] for n in group["nodes"]} == {"ready"}
    assert [n["node_rank"] for n in group["nodes"]] == [0, 1] and {n["group_size"] for n in group["nodes"]} == {2}
    ips = [n["private_ip"] for n in group["nodes"]]
    assert len(set(ips)) == 2 and all(ip.startswith("127.") for ip in ips), "each node its own loopback address"
    # Rented in one go, then brought up in parallel: both nodes waited for SSH before either was ready.
    lines = up.stderr.splitlines()
    first_ready = min(i for i, line in enumerate(lines) if "[4/4]" in line)
    assert sum("[1/4] renting 2 nodes" in line for line in lines) == 1, up.stderr
    assert sum("[2/4] waiting for SSH" in line for line in lines[:first_ready]) == 2, up.stderr
    assert took < 600

    fleet = run_orch("status", check=0).stdout
    rows = fleet.splitlines()
    head = next(i for i, r in enumerate(rows) if r.startswith("pair "))
    assert "2 nodes" in rows[head] and "pair-0 (rank 0)" in rows[head + 1] and "pair-1 (rank 1)" in rows[head + 2]
    shown = run_orch("status", "pair", check=0).stdout
    assert "node 0" in shown and "node 1" in shown and ips[1] in shown

    # Each node is a machine of its own: its own instance id, the other reachable at its private address.
    one = run_orch("ssh", "pair", "--node", "1", "--", "echo $ORCH_INSTANCE_ID", check=0).stdout.strip()
    zero = run_orch("ssh", "pair", "--", "echo $ORCH_INSTANCE_ID", check=0).stdout.strip()
    assert one and zero and one != zero and zero in group["nodes"][0]["provider_id"]
    assert one in group["nodes"][1]["provider_id"]
    assert run_orch("ssh", "pair", "--node", "2").returncode == 2

    # No node alone: stop, start, down of a node (or of the group as if it were one machine) refused.
    for verb, target in (("stop", "pair"), ("down", "pair-1"), ("stop", "pair-0")):
        p = run_orch(verb, target)
        assert p.returncode == 2 and "orch down pair" in p.stderr, p.stderr
    assert "ready" in run_orch("status", "pair-1", check=0).stdout

    down = run_orch("down", "pair", check=0).stdout
    assert "pair-0 destroyed" in down and "pair-1 destroyed" in down
    assert _leftovers(orch_home) == ([], [])


def test_a_node_that_cannot_be_had_leaves_nothing_of_the_group(orch_home):
    """Node 1 meets a capacity error at its create; node 0, already up, is destroyed: nothing bills."""
    from orchestrator import states
    from orchestrator.instances import groups
    from orchestrator.errors import NoCapacity, OrchError
    from tests.clouds import provider_installed
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Request
    from providers.local import LocalProvider

    class Scarce(LocalProvider):
        name = "scarce"

        made: list = []

        def create(self, request, label, public_key):
            if request.node_rank == 1:
                from orchestrator.provider import Status
                from tests.clouds import wait_for

                wait_for(lambda: self.made and self.get(self.made[0]).status == Status.RUNNING, timeout=30,
                         what="node 0's machine to run")  # node 0 is up meanwhile
                raise NoCapacity("no capacity for a second machine")
            remote = super().create(request, label, public_key)
            self.made.append(remote.provider_id)
            return remote

    with provider_installed(Scarce):
        orch = Orch.open(say=lambda m: None)
        with pytest.raises(OrchError) as err:
            groups.up(orch, "short", "scarce", Request(name="short", cpu=True), 2)
        assert "node 1 of 2" in str(err.value) and "nothing of the group bills" in str(err.value)
        rows = {i.name: i for i in orch.ledger.instances()}
        assert rows["short-1"].state == states.FAILED
        assert rows["short-0"].state == states.DESTROYED, "the node that came up is given back"
        assert not any((orch_home / "local").iterdir())


def test_a_node_failing_at_its_ssh_wait_calls_its_siblings_bring_up_off_at_once(orch_home):
    """Node 1's machine will never answer (its provider says so); node 0's SSH is slow to come (20
    minutes of wait allowed). Node 0 is not waited for: its bring-up is called off and it is destroyed
    within seconds, not after its own wait."""
    from orchestrator import states
    from orchestrator.instances import groups
    from orchestrator.errors import OrchError
    from tests.clouds import provider_installed
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Request, Status
    from providers.local import LocalProvider

    class Broken(LocalProvider):
        name = "broken"

        def get(self, provider_id):
            remote = super().get(provider_id)
            if remote.status == Status.RUNNING and provider_id.endswith(tuple("0123456789")) and \
                    self._node(provider_id) == 0:
                from dataclasses import replace

                return replace(remote, status=Status.PENDING, detail="booting (slowly)")
            return remote

        def never_answers(self, remote, waited):
            return "its container will never start" if self._node(remote.provider_id) == 1 else None

        def _node(self, provider_id):
            meta = self._meta(provider_id) or {}
            return meta.get("rank")

        def create(self, request, label, public_key):
            made = super().create(request, label, public_key)
            meta = self._meta(made.provider_id)
            meta["rank"] = request.node_rank
            self._save(made.provider_id, meta)
            return made

    with provider_installed(Broken):
        orch = Orch.open(say=lambda m: None)
        t0 = time.monotonic()
        with pytest.raises(OrchError) as err:
            groups.up(orch, "slow", "broken", Request(name="slow", cpu=True), 2, ssh_timeout=1200)
        took = time.monotonic() - t0
        assert "node 1 of 2" in str(err.value) and "will never start" in str(err.value)
        assert took < 60, f"node 0's 20-minute wait was called off, not sat out ({took:.0f} s)"
        rows = {i.name: i for i in orch.ledger.instances()}
        assert {rows["slow-0"].state, rows["slow-1"].state} == {states.DESTROYED}
        assert not any((orch_home / "local").iterdir())


def test_a_local_gpu_group_gives_each_node_its_own_share_of_the_gpus(orch_home, monkeypatch):
    """NCCL refuses one GPU seen by two ranks ("Duplicate GPU detected"): node R of a local group
    sees GPUs R*g .. R*g+g-1 only, and nodes x GPUs beyond the machine is refused before anything."""
    from orchestrator.errors import UsageError
    from orchestrator.provider import Request
    from providers.local import LocalProvider

    monkeypatch.setattr(LocalProvider, "gpus", property(lambda self: ["RTX 4090"] * 4))
    local = LocalProvider({}, orch_home)
    seen = [local._instance_env(Request(name=f"g-{r}", gpus=2, group="abc", node_rank=r, nodes=2))
            ["CUDA_VISIBLE_DEVICES"] for r in range(2)]
    assert seen == ["0,1", "2,3"]
    local.validate(Request(name="g", gpus=2, nodes=2))
    with pytest.raises(UsageError, match="3 nodes x 2"):
        local.validate(Request(name="g", gpus=2, nodes=3))


def test_offers_for_a_group_price_n_machines_and_state_their_scaling(fakes):  # noqa: F811
    """The same live rows, priced for 2 machines: every $/hr doubled, the hours divided by the stated
    speedup (1 + e); providers that cannot rent a group are left out of `orch offers --nodes`."""
    from orchestrator.money import offers
    from tests.test_offers import search

    job = offers.Workload(model="yolo9-t", epochs=10, data="hf://acme/birds/birds.tar", data_bytes=10**9)
    one = search(gpu="RTX 4090", job=job).rows
    two = offers.for_nodes(one, 2, 0.7)
    assert one and len(two) == len(one)
    for a, b in zip(one, two):
        assert b.price_hr == pytest.approx(2 * a.price_hr)
        assert b.hours == pytest.approx(a.hours / 1.7)
        assert b.job_usd(False) == pytest.approx(a.job_usd(False) * 2 / 1.7)
        assert "2 nodes at 70% scaling per added node (assumed" in b.estimate.detail
    shown = run_orch("offers", "--nodes", "2", "--scaling", "0.7", "--gpu", "RTX 4090")
    assert "left out: vastai (cannot rent a group" in shown.stderr, shown.stderr
    # RunPod answers for a group with its Instant Clusters, which it offers of no RTX 4090.
    assert "runpod: RTX 4090 x1 offered as an Instant Cluster in no data center now" in shown.stderr, shown.stderr
    assert "70%" in shown.stdout and "no offer matches" in shown.stdout
    for bad in (["--nodes", "0"], ["--nodes", "2", "--scaling", "0"], ["--scaling", "0.5"]):
        assert run_orch("offers", *bad).returncode == 2


def test_the_reaper_sees_a_group_as_one_and_cost_shows_its_total_and_each_node(orch_home, monkeypatch):
    """Node 0 idle, node 1 training: neither is stopped. Node 1 done: both go in one pass."""
    monkeypatch.setenv("ORCH_WATCHDOG", "off")  # the controller's reaper alone on duty
    orch_home.mkdir(parents=True)
    (orch_home / "config.toml").write_text("[providers.local]\nprice_per_hour = 3.6\n")  # 0.001 $/s
    run_orch("up", "team", "--nodes", "2", "--cpu", "--idle-minutes", "0.01", check=0)
    up_done = time.monotonic()  # node 0 is idle from here on at the latest
    # A training on node 1 (a process that runs train_entry.py, as the watchdog's probe counts one).
    pid = run_orch("ssh", "team", "--node", "1", "--", "setsid python3 -c 'import time; time.sleep(900)' train_entry.py "
                   "> /dev/null 2>&1 < /dev/null & echo $!", check=0).stdout.strip()
    assert pid.isdigit()
    from tests.clouds import wait_for

    def cmdline() -> bytes:  # node 1 is a process tree on this machine: its pid is ours to read
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""

    wait_for(lambda: b"train_entry.py" in cmdline(), timeout=30, what=f"pid {pid} to run train_entry.py")

    def reap() -> dict:
        return {o["name"]: o for o in json.loads(run_orch("reap", "--json", check=0).stdout)}

    # The rule's 0.01 min (0.6 s) spent on node 0 before the first pass, so that only node 1's
    # training keeps it: on a quick machine the pass came sooner and kept node 0 for its own sake.
    time.sleep(max(0.0, 1.0 - (time.monotonic() - up_done)))
    first = reap()
    busy_seen = time.monotonic()  # the pass recorded node 1 busy: the group's idle clock starts over
    assert first["team-0"]["action"] == "keep" and "group team is busy" in first["team-0"]["reason"], first
    assert first["team-1"]["action"] == "keep" and "busy" in first["team-1"]["reason"], first

    run_orch("ssh", "team", "--node", "1", "--", f"kill {pid}", check=0)  # this one process, by its id
    wait_for(lambda: b"train_entry.py" not in cmdline(), timeout=30, what=f"pid {pid} to end")
    # clock: the idle rule's 0.01 min (0.6 s of wall time) counts from the pass that saw node 1 busy
    time.sleep(max(0.0, 1.0 - (time.monotonic() - busy_seen)))
    second = reap()
    assert second["team-0"]["action"] == second["team-1"]["action"] == "stop", json.dumps(second)
    assert second["team-0"]["acted"] and second["team-1"]["acted"]

    spent = json.loads(run_orch("cost", "team", "--json", check=0).stdout)
    assert [n["name"] for n in spent["groups"]["team"]["nodes"]] == ["team-0", "team-1"]
    nodes = {i["name"]: i["total_usd"] for i in spent["instances"]}
    assert set(nodes) == {"team-0", "team-1"} and all(v > 0 for v in nodes.values())
    assert spent["groups"]["team"]["total_usd"] == pytest.approx(sum(nodes.values()))
    shown = run_orch("cost", check=0).stdout
    assert "group team" in shown and "over 2 nodes" in shown
    run_orch("down", "team", check=0)


def test_a_sibling_the_same_pass_is_stopping_is_not_busy_but_an_unreadable_ready_one_is_an_error(orch_home, monkeypatch):
    """The reaper stops a whole idle group in one pass, its nodes in parallel: node 0's group check
    may look at node 1 while node 1 is being stopped (its row already STOPPING, its host going down).
    Whatever that look fails with, node 1 is no longer busy, and node 0 is stopped with it; a node
    still ready that cannot be read stays an error, never a guess. The race is made here at the one
    seam it runs through, the look, so that it happens every time."""
    from orchestrator import states
    from orchestrator.reaper import reaper
    from orchestrator.errors import OrchError
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.reaper.rules import STOP, Decision

    orch = Orch.open(say=lambda m: None)
    head, other = (orch.ledger.create_instance(name=f"team-{r}", provider="local", group_id="g1", group_name="team",
                                               node_rank=r, group_size=2) for r in (0, 1))
    for node in (head, other):
        for state in (states.PROVISIONING, states.READY):
            orch.ledger.transition(node.id, state, reason="test")
    idle = Decision(STOP, "idle 10 of 10 min", kind="idle")

    def stopped_meanwhile(orch_, node, run, writes=True):
        orch_.ledger.transition(node.id, states.STOPPING, reason="stopped by the same pass")
        raise OrchError("the instance's answer was cut short")  # what a host going down may say

    monkeypatch.setattr(reaper, "look", stopped_meanwhile)
    assert reaper._group_busy(orch, orch.ledger.get(head.id), idle) is idle

    def unreadable(orch_, node, run, writes=True):
        raise OrchError("the instance's answer was cut short")

    orch.ledger.transition(other.id, states.READY, reason="the stop failed: ready again")
    monkeypatch.setattr(reaper, "look", unreadable)
    with pytest.raises(OrchError, match="cut short"):
        reaper._group_busy(orch, orch.ledger.get(head.id), idle)


def test_a_groups_hourly_price_counts_the_nodes_that_bill_not_one_it_replaced(orch_home):
    """`orch status --all` after a node was replaced: the lost row is listed, its price not summed (issue 55, 8)."""
    from orchestrator import states
    from orchestrator.instances.lifecycle import Orch

    ledger = Orch.open(say=lambda m: None).ledger
    group = dict(provider="local", label="", cpu_only=True, gpus=0, price_hr=1.0, group_id="grp1", group_name="g-a1",
                 group_size=2)
    rows = [ledger.create_instance(name="g-a1-0", node_rank=0, **group),
            ledger.create_instance(name="g-a1-1", node_rank=1, **group)]
    for inst in rows:
        for state in (states.PROVISIONING, states.READY):
            ledger.transition(inst.id, state, reason="test")
    ledger.transition(rows[1].id, states.LOST, reason="test: lost")
    fresh = ledger.create_instance(name="g-a1-1", node_rank=1, **group)
    for state in (states.PROVISIONING, states.READY):
        ledger.transition(fresh.id, state, reason="test")
    shown = run_orch("status", "--all", check=0).stdout
    [line] = [x for x in shown.splitlines() if x.startswith("g-a1 ")]
    assert "2 nodes  2.000" in line, shown


@pytest.mark.parametrize("nodes", [1, 2])
def test_ctrl_c_right_after_the_create_leaves_nothing_billing_for_one_machine_as_for_a_group(orch_home, nodes):
    """Ctrl-C lands just after the provider made the machines, before their rows say so (here:
    while their prices are read). One machine (`orch up NAME`: ``Orch.up``) is a group of one:
    what was made is destroyed for it too (it was left running, recorded `requested`, until a
    reconcile or a repeated `orch up`)."""
    from orchestrator import states
    from orchestrator.instances import groups
    from tests.clouds import provider_installed
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Request
    from providers.local import LocalProvider

    class Interrupted(LocalProvider):
        name = "interrupted"

        def prices(self, remote):
            raise KeyboardInterrupt  # the user's Ctrl-C, as it reaches the main thread

    with provider_installed(Interrupted):
        orch = Orch.open(say=lambda m: None)
        with pytest.raises(KeyboardInterrupt):
            if nodes == 1:
                orch.up("cut", "interrupted", Request(name="cut", cpu=True))
            else:
                groups.up(orch, "cut", "interrupted", Request(name="cut", cpu=True), nodes)
        rows = orch.ledger.instances()
        assert len(rows) == nodes and {i.state for i in rows} == {states.DESTROYED}, [(i.name, i.state) for i in rows]
        assert not any((orch_home / "local").iterdir()), "a machine made is still there: it would bill"


def test_ctrl_c_inside_a_create_the_provider_finished_destroys_what_it_made_and_goes_on_as_ctrl_c(orch_home):
    """A cloud's create call cut by Ctrl-C after its server made the machine (the answer never came
    back): the lookup by label finds the machine. It is destroyed and the Ctrl-C goes on; it was
    taken as "the create errored but the machine exists: using it", and the bring-up carried on
    after the user pressed Ctrl-C."""
    from orchestrator import states
    from tests.clouds import provider_installed
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Request
    from providers.local import LocalProvider

    class CutAfterMade(LocalProvider):
        name = "cutaftermade"

        def create(self, request, label, public_key):
            super().create(request, label, public_key)  # the server made it...
            raise KeyboardInterrupt  # ...and the user's Ctrl-C lands before its answer

    said = []
    with provider_installed(CutAfterMade):
        orch = Orch.open(say=said.append)
        with pytest.raises(KeyboardInterrupt):
            orch.up("cut", "cutaftermade", Request(name="cut", cpu=True))
        [row] = orch.ledger.instances()
        assert row.state == states.DESTROYED, (row.state, said)
        assert not any((orch_home / "local").iterdir()), "the machine made is still there: it would bill"
        assert not any("using it" in s for s in said), said
