"""`orch run` and `orch jobs`: a dataset in, weights home, no instance left, across lost machines.

The local provider for the plain job; the fake RunPod (the real SDK, real sshd pods) for losses
made from the provider's side, as a host failure or a crash would make them. Between two looks a
job moves only when something advances it (`orch jobs show`, `orch reap`), as on a laptop whose
reaper is installed: the tests advance it with `orch reap`, one pass at a time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.tasks import dataset
from tests.clouds import configure, open_orch, runpod  # noqa: F401  (runpod: the fake RunPod fixture)
from tests.conftest import needs_torch, on_instance, run_orch

checkpoint = on_instance("checkpoint")  # the on-instance check, read from this machine's side

TRAIN = ("--cpu", "--imgsz", "64", "--batch", "4", "--train-arg", "workers=0")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return dataset.synth(tmp_path_factory.mktemp("jobs") / "ds", n_train=4, n_val=2, imgsz=64)


def show(name, env=None) -> dict:
    """``orch jobs show NAME --json``: one look, which advances the job."""
    return json.loads(run_orch("jobs", "show", name, "--json", env=env, check=0).stdout)


def epochs_in(path) -> list[int]:
    return [json.loads(line)["epoch"] for line in path.read_text().splitlines() if line.strip()]


def live_instances() -> list:
    return [i for i in open_orch().ledger.instances() if i.state not in ("destroyed", "failed", "lost")]


@needs_torch
@pytest.mark.training
def test_a_job_on_the_local_provider_brings_the_weights_home_and_leaves_nothing(orch_home, ds):
    from tests.fakes.webhook import Hook
    from tests.test_notify import write_config

    hook = Hook()  # the job's end is posted to the webhook in config.toml; local bills 3.6 $/hr (0.001 $/s)
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["job"]\n\n'
                            '[providers.local]\nprice_per_hour = 3.6\n')
    proc = run_orch("run", "j1", "--data", ds, "--epochs", "2", *TRAIN, "--wait", "--json", check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["name"] == "j1"
    assert [a["state"] for a in job["attempts"]] == ["completed"], (job["attempts"], job["history"])
    assert job["attempts"][0]["instance_state"] == "destroyed"
    folder = orch_home / "runs" / "j1"
    assert job["weights"] == str(folder) and (folder / "weights" / "best.pt").stat().st_size > 0
    assert epochs_in(folder / "metrics.jsonl") == [1, 2]
    assert {"provision", "train", "pull"} <= set(job["phases"])
    # Its cost is recorded: what `orch cost` says its one instance cost (3.6 $/hr for about a minute).
    spent = json.loads(run_orch("cost", "--json", check=0).stdout)["providers"]["local"]["total_usd"]
    assert 0 < job["cost"] == pytest.approx(spent, abs=1e-4)
    assert job["attempts"][0]["cost"] == pytest.approx(spent, abs=1e-4)
    assert not (orch_home / "jobs" / "j1").exists(), "the resume copies go once the weights are home"
    assert "plan:" in proc.stderr and live_instances() == []
    assert json.loads(run_orch("status", "--json", check=0).stdout) == [], "nothing live"
    assert [t.split(":")[0] for t in hook.texts()] == ["orch"] and "job j1 completed" in hook.texts()[0]
    hook.close()
    every = json.loads(run_orch("jobs", "--json", check=0).stdout)
    keys = ("name", "state", "attempts", "cost", "weights", "epoch", "epochs", "reason")
    assert [j["name"] for j in every] == ["j1"]
    assert {k: every[0][k] for k in keys} == {k: show("j1")[k] for k in keys} == {k: job[k] for k in keys}
    text = run_orch("jobs", "show", "j1", check=0).stdout
    assert "completed" in text and str(folder) in text and "resume copy" not in text
    # The run reached epoch 2: a resume to 2 epochs is refused up front, with the epoch it reached.
    up = run_orch("up", "j1", "--data", ds, "--resume", "--epochs", "2", *TRAIN, check=2)
    assert "already reached epoch 2 of 2" in up.stderr and len(up.stderr.strip().splitlines()) == 1
    assert live_instances() == []


def _job(name) -> dict:
    """The job as `orch jobs show --json` prints it, read in this process (the ledger only): the
    loops below look often, and an `orch` process a look would be most of the suite's CPU."""
    from orchestrator.views import jobs as job_views

    orch = open_orch()
    return job_views.job_dict(orch, orch.ledger.job(name))


def _advance_until(name, done, env=None, timeout=240.0, every=1.0, ready=None) -> dict:
    """Reaper passes (`orch reap`, which advances every job once) until ``done(job)``. ``ready``: what
    the next pass has to find on the instance (read from this machine's side, no SSH): the loop waits
    for it, a while at most, instead of spending passes that would find nothing new."""
    end = time.monotonic() + timeout
    while True:
        if ready is not None:
            _wait(ready, min(60.0, max(0.0, end - time.monotonic())))
        run_orch("reap", env=env, check=0)
        job = _job(name)
        if done(job):
            return job
        assert time.monotonic() < end, f"job {name} is still {job['state']}: {job['history'][-3:]}"
        time.sleep(every)


def _freeze(instance: str, fake=None, at_least: int = 1, patience: float = 120.0, send=None):
    """Pause the instance's training between two checkpoints, once its last.pt is whole at epoch
    ``at_least`` or later, so that what follows (a reaper pass, a kill) meets a known state however
    fast this machine trains; returns what resumes it. ``send(signal)``: how the training's processes
    are signalled (by default the run's pid, or by name in a fake pod)."""
    import signal

    def by_default(sig):
        if fake is None:
            ledger = open_orch().ledger
            os.kill(ledger.latest_run(ledger.by_name(instance).id).pid, sig)
        else:  # '[t]rain': the pattern does not match the shell that runs pkill
            _pod_of(fake, instance).host.run(f"pkill -{signal.Signals(sig).name[3:]} -f '[t]rain_entry.py'")
    send = send or by_default
    end = time.monotonic() + patience
    root = None
    while time.monotonic() < end:
        root = root or _run_root(instance, fake)  # None until the run is recorded
        rows, state = _trained(root) if root else (0, None)
        assert state not in ("completed", "failed"), f"{instance}'s training ended before epoch {at_least}"
        if rows >= at_least:  # only then a signal: the looks in between read files, nothing else
            send(signal.SIGSTOP)
            # Between epochs: last.pt whole, and the metrics row of its epoch written (after it).
            info = checkpoint.check(str(root / "weights" / "last.pt"))
            if info["loads"] and at_least <= (info["epoch"] or 0) <= _trained(root)[0]:
                return lambda: send(signal.SIGCONT)
            send(signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError(f"no whole last.pt of epoch {at_least} on {instance} to pause at")


def _wait(cond, patience: float) -> bool:
    end = time.monotonic() + patience
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def _run_root(instance: str, fake=None) -> Path | None:
    """The run folder of the instance's training, seen from this machine: a local instance's own
    folder, or the path into a fake pod's root."""
    orch = open_orch()
    inst = orch.ledger.by_name(instance)
    run = orch.ledger.latest_run(inst.id) if inst is not None else None
    if run is None or not run.run_dir:
        return None
    try:
        return Path(run.run_dir) if fake is None else _pod_of(fake, instance).host.path(run.run_dir)
    except (StopIteration, RuntimeError):
        return None  # the pod is gone


def _trained(root: Path | None) -> tuple[int, str | None]:
    """(epochs in the run's metrics.jsonl, the state its status.json says)."""
    try:
        rows = (root / "metrics.jsonl").read_text().splitlines() if (root / "metrics.jsonl").exists() else []
        state = json.loads((root / "status.json").read_text()).get("state") if (root / "status.json").exists() else None
    except (OSError, ValueError, TypeError):
        return 0, None  # between writes, or not there yet
    return sum(1 for r in rows if r.strip()), state


def _watch(instance: str, fake, done) -> callable:
    root = []  # looked up once: the ledger is not opened on every look

    def look() -> bool:
        if not root:
            found = _run_root(instance, fake)
            if found is None:
                return False
            root.append(found)
        return done(*_trained(root[0]))
    return look


def _ended(instance: str, fake=None):
    return _watch(instance, fake, lambda n, state: state in ("completed", "failed"))


def _pod_of(fake, attempt: str):
    return next(p for p in fake.live() if attempt in p.name)


@needs_torch
@pytest.mark.training
def test_a_pod_destroyed_mid_training_is_relaunched_and_the_job_resumes_not_restarts(orch_home, ds, runpod):
    fake, env = runpod
    epochs = 5
    run_orch("run", "jr", "--provider", "runpod", "--data", ds, "--epochs", str(epochs), "--save-period", "1", *TRAIN,
             env=env, check=0)
    _freeze("jr-a1", fake, at_least=2)  # it dies paused, with its pod
    job = _advance_until("jr", lambda j: (j["checkpoint_epoch"] or 0) >= 2, env, every=0.5)
    assert job["state"] == "running" and job["epoch"] < epochs
    kept = job["checkpoint_epoch"]  # the job's verified copy; the pod's own last.pt goes with the pod
    pod = _pod_of(fake, "jr-a1")
    with fake._lock:  # the host fails: RunPod's side terminates the pod, its disk with it
        fake._podTerminate(pod, {})
    lost_at = time.time()
    job = _advance_until("jr", lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["state"] == "running", env)
    again = time.time() - lost_at
    second = job["attempts"][1]
    first = job["attempts"][0]
    assert first["state"] == "lost" and "instance" in first["reason"], first
    assert second["start_epoch"] == kept + 1, f"resumed from the pulled checkpoint (epoch {kept}): {second}"
    assert second["instance"] == "jr-a2" and second["provider"] == "runpod"
    job = _advance_until("jr", lambda j: j["state"] not in ("running", "recovering"), env, timeout=300,
                         ready=_ended("jr-a2", fake))
    assert job["state"] == "completed", job["history"][-5:]
    folder = orch_home / "runs" / "jr"
    assert epochs_in(folder / "metrics.jsonl") == list(range(1, epochs + 1))
    # LibreYOLO's own record of the second run: it began where the checkpoint ended.
    assert json.loads((folder / "status.json").read_text())["start_epoch"] == kept + 1
    assert (folder / "weights" / "best.pt").stat().st_size > 0
    assert fake.live() == [] and live_instances() == []
    print(f"\nloss to training again: {again:.1f} s (reaper passes back to back); the job's record: "
          f"recover {job['phases'].get('recover')} s, attempt 2 {second['phases']}")


@needs_torch
@pytest.mark.training
def test_a_torn_last_pt_is_never_resumed_from(orch_home, ds, runpod):
    fake, env = runpod
    epochs = 6
    run_orch("run", "jt", "--provider", "runpod", "--data", ds, "--epochs", str(epochs), "--save-period", "1", *TRAIN,
             env=env, check=0)
    thaw = _freeze("jt-a1", fake)
    job = _advance_until("jt", lambda j: (j["checkpoint_epoch"] or 0) >= 1, env, every=0.5)
    thaw()
    kept = job["checkpoint_epoch"]
    assert kept + 2 < epochs, f"the copy kept at home is of epoch {kept}: no room left to get ahead of it"
    # With nothing advancing the job, the instance's training gets ahead of the copy kept at home...
    _freeze("jt-a1", fake, at_least=kept + 2)
    run_dir = _run_root("jt-a1", fake)
    # ...then it dies while torch.save is writing last.pt: the newest file on the instance is torn.
    _pod_of(fake, "jt-a1").host.run("pkill -9 -f '[t]rain_entry.py'; sleep 0.5")
    last = run_dir / "weights" / "last.pt"
    with open(last, "r+b") as f:
        f.truncate(last.stat().st_size // 3)
    job = _advance_until("jt", lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["state"] == "running", env)
    second = job["attempts"][1]
    assert second["start_epoch"] == kept + 1, f"resumed from the intact copy of epoch {kept}: {second}"
    assert any("does not load" in h["text"] for h in job["history"]), job["history"][-5:]
    job = _advance_until("jt", lambda j: j["state"] not in ("running", "recovering"), env, timeout=300,
                         ready=_ended("jt-a2", fake))
    assert job["state"] == "completed", job["history"][-5:]
    assert epochs_in(orch_home / "runs" / "jt" / "metrics.jsonl") == list(range(1, epochs + 1))
    assert fake.live() == []


@needs_torch
@pytest.mark.training
def test_a_torn_resume_copy_at_home_is_never_resumed_from(orch_home, ds):
    epochs = 5
    run_orch("run", "jh", "--data", ds, "--epochs", str(epochs), "--save-period", "1", *TRAIN, check=0)
    thaw = _freeze("jh-a1")
    job = _advance_until("jh", lambda j: (j["checkpoint_epoch"] or 0) >= 1, every=0.5)
    thaw()
    kept = job["checkpoint_epoch"]
    copy = orch_home / "jobs" / "jh" / f"ckpt-{kept}" / "weights" / "last.pt"
    with open(copy, "r+b") as f:  # the copy at home tears (a full disk, this machine crashing)...
        f.truncate(copy.stat().st_size // 3)
    run_orch("down", "jh-a1", "--no-pull", "--yes", check=0)  # ...and the machine goes
    job = _advance_until("jh", lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["state"] == "running")
    second = job["attempts"][1]
    assert second["start_epoch"] == 1, f"the torn copy of epoch {kept} was resumed from: {second}"
    # Refused on this machine before it is uploaded (the torn zip fails the controller's check) or,
    # had it passed, on the instance: either way the history says why the attempt starts over.
    assert any(f"resume copy (epoch {kept}) " in h["text"] and ("is not uploaded" in h["text"] or "does not load" in h["text"])
               for h in job["history"]), job["history"][-5:]
    assert not copy.exists(), "a copy that does not load is forgotten"
    job = _advance_until("jh", lambda j: j["state"] not in ("running", "recovering"), timeout=300,
                         ready=_ended("jh-a2"))
    assert job["state"] == "completed", job["history"][-5:]
    assert epochs_in(orch_home / "runs" / "jh" / "metrics.jsonl") == list(range(1, epochs + 1))
    assert live_instances() == []


def test_ctrl_c_leaves_the_job_running_and_cancel_ends_it_with_no_instance_left(orch_home):
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    # A command job: what is checked is the job's wait and its cancel, the same for every kind (a
    # LibreYOLO training here cost a torch import on the instance and nothing more to the check).
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "run", "jc", "--cpu", "--wait", "--", "sleep", "3600"],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=os.environ.copy())
    seen = ""
    for line in proc.stderr:
        seen += line
        if "attempt 1 running on local" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "orch jobs cancel jc" in rest, seen + rest
    assert show("jc")["state"] == "running" and len(live_instances()) == 1
    cancel = run_orch("jobs", "cancel", "jc", check=0)
    job = show("jc")
    assert job["state"] == "cancelled" and "cancel" in cancel.stderr + cancel.stdout
    assert live_instances() == []


@needs_torch
@pytest.mark.training
def test_max_cost_is_a_hard_cap_while_the_job_runs(orch_home, ds):
    configure(orch_home, "local", {"price_per_hour": 360.0})  # 0.10 $ a second: the cap comes quickly
    # A reaper scheduled every 5 s: the job looks 5 s ahead ($0.50) so the cap is not crossed between looks.
    open_orch().ledger.set_meta("reaper:schedule", json.dumps({"every": 5}))
    # About 35 s of training once the look-ahead is taken off: on a loaded machine each `orch reap` takes
    # seconds, and the instance's own deadline (the same cap) must leave the job a few looks to copy.
    cap = 4.0
    run_orch("run", "jx", "--data", ds, "--epochs", "500", *TRAIN, "--max-cost", str(cap), check=0)
    # Paused once its last.pt is whole at epoch 1, and never resumed: the instance bills on while its
    # training neither ends nor spins a CPU for the 40 s the cap takes, and there are always weights
    # for the job to bring home before the instance goes.
    _freeze("jx-a1")
    end = time.monotonic() + 240
    while (job := _job("jx"))["state"] in ("planned", "running", "recovering"):
        assert time.monotonic() < end, job["history"][-3:]
        run_orch("reap", check=0)
        time.sleep(1)
    shown = show("jx")  # what `orch jobs show` prints is what the loop read
    assert (shown["state"], shown["reason"], shown["cost"]) == (job["state"], job["reason"], job["cost"])
    assert job["state"] == "failed" and "max-cost" in job["reason"], job["reason"]
    assert live_instances() == []
    assert job["cost"] <= cap * 1.5, f"the cap held within a look: ${job['cost']:.2f} spent for a ${cap} cap"
    # What it trained came home first: the final pull, or (when the instance's own deadline, the same
    # cap, stopped it before the job's look) the last intact checkpoint copy the reason names.
    home = list((orch_home / "runs" / "jx").rglob("last.pt")) + list((orch_home / "jobs" / "jx").rglob("last.pt"))
    assert job["epoch"] is not None and job["epoch"] >= 1, job
    assert home and (job["checkpoint_epoch"] is None or str(job["checkpoint_epoch"]) in job["reason"]), "\n".join(h["text"] for h in job["history"][-10:])


def test_keep_stops_the_instance_instead_of_destroying_it(orch_home):
    # A command job: --keep is the job's, whatever its kind runs.
    job = json.loads(run_orch("run", "jk", "--cpu", "--keep", "--wait", "--json", "--", "true", check=0).stdout)
    assert job["state"] == "completed" and job["attempts"][0]["instance_state"] == "stopped"
    run_orch("down", "jk-a1", "--no-pull", "--yes", check=0)


@pytest.mark.parametrize("args, says", [
    (("run", "Bad Name", "--data", "{ds}", "--cpu"), "name"),
    (("run", "j", "--cpu"), "--data"),
    (("run", "j", "--data", "{ds}", "--provider", "nosuch"), "nosuch"),
    (("run", "j", "--data", "{ds}", "--cpu", "--retries", "-1"), "--retries"),
    (("run", "j", "--data", "{ds}", "--cpu", "--max-cost", "0"), "--max-cost"),
    (("run", "j", "--data", "/nonexistent/ds", "--cpu"), "/nonexistent/ds"),
    (("jobs", "show", "nosuch"), "nosuch"),
    (("jobs", "cancel", "nosuch"), "nosuch"),
])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(orch_home, ds, args, says):
    proc = run_orch(*[a.replace("{ds}", str(ds)) for a in args], check=2)
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (orch_home / "runs").exists() or not any((orch_home / "runs").iterdir())
    if (orch_home / "ledger.db").exists():
        assert open_orch().ledger.jobs() == [] and open_orch().ledger.instances() == []


def test_a_plan_over_max_cost_is_refused_before_anything_is_rented(orch_home, ds, runpod):
    fake, env = runpod
    proc = run_orch("run", "jm", "--provider", "runpod", "--gpu", "RTX 4090", "--data", ds, "--epochs", "100",
                    "--max-cost", "0.0001", env=env, check=2)
    assert "over --max-cost" in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("orch: error:")
    assert fake.sent("POST", "/v2/pods") == [] and fake.live() == []
    assert open_orch().ledger.jobs() == [] and open_orch().ledger.instances() == []
