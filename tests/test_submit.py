"""One path from a request to a machine: `orch run` plans once, records the offer it will rent, and
the first attempt rents that very offer without asking the provider for its offers again."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from orchestrator.jobs.kinds import JobKind, Launched
from orchestrator.jobs.kinds import command
from tests.clouds import open_orch, runpod, vast, wait_for  # noqa: F401  (the fake RunPod and Vast.ai fixtures)
from tests.conftest import needs_torch, run_orch


def _before(queries: list[str], mutation: str) -> list[str]:
    first = next(i for i, q in enumerate(queries) if mutation in q)
    return queries[:first]


def test_one_launch_lists_runpods_offers_once_and_rents_the_offer_it_planned(orch_home, runpod):
    fake, env = runpod
    fake.queries.clear()
    proc = run_orch("run", "h1", "--provider", "runpod", "--gpu", "RTX 4090", "--wait", "--", "true", env=env,
                    check=0)
    assert proc.returncode == 0, proc.stderr
    listings = [q for q in _before(fake.queries, "POST /v2/pods") if q.startswith("GET /v2/catalog/gpus")]
    assert sorted(q.rsplit("cloud=", 1)[1] for q in listings) == ["COMMUNITY", "SECURE"], listings  # one listing
    job = json.loads(run_orch("jobs", "show", "h1", "--json", env=env).stdout)
    assert job["state"] == "completed", job
    planned, rented = job["plan"]["offer"], job["attempts"][0]["offer_key"]
    assert planned == rented and planned.startswith("runpod/"), (planned, rented)
    assert fake.sent("POST", "/v2/pods")[0]["gpu"]["id"] == planned.split("/", 1)[1]
    text = run_orch("jobs", "show", "h1", env=env).stdout
    assert f"offer {planned} (the plan's)" in text, text
    assert fake.live() == []


def test_a_dry_run_lists_the_offers_once_and_rents_nothing(orch_home, runpod):
    fake, env = runpod
    fake.queries.clear()
    proc = run_orch("run", "h2", "--provider", "runpod", "--gpu", "RTX 4090", "--dry-run", "--", "true", env=env)
    assert "offers (on-demand, per hour)" in proc.stdout and "nothing rented" in proc.stdout, proc.stdout
    assert len([q for q in fake.queries if q.startswith("GET /v2/catalog/gpus")]) == 2, fake.queries  # one per cloud
    assert fake.sent("POST", "/v2/pods") == [] and open_orch().ledger.jobs() == []


def test_one_launch_searches_vasts_offers_once(orch_home, vast):
    fake, env = vast
    before = len(fake.calls("POST", r"/bundles/$"))
    proc = run_orch("run", "v1", "--provider", "vastai", "--gpu", "RTX 4090", "--wait", "--", "true", env=env,
                    check=0)
    assert proc.returncode == 0, proc.stderr
    assert len(fake.calls("POST", r"/bundles/$")) - before == 1
    job = json.loads(run_orch("jobs", "show", "v1", "--json", env=env).stdout)
    assert job["state"] == "completed" and job["plan"]["offer"] == job["attempts"][0]["offer_key"], job
    assert fake.live() == []


def test_a_job_spec_written_by_the_previous_orch_reads_back():
    """Jobs in flight when orch is upgraded: the spec layout of every orch so far reads back as its kind."""
    from orchestrator.jobs import JobSpec

    train = {"train": {"data": "hf://acme/birds/b.tar", "model": "yolo9-s", "epochs": 7, "imgsz": None, "batch": None,
                       "save_period": 1, "train_args": {}, "push_to": None, "resume": False, "local_tar": None,
                       "data_bytes": 10, "dataset_name": None},
             "request": {"name": "j", "gpu": "A10", "gpus": 1, "cpu": False, "disk_gb": 30, "image": None,
                         "spot": False, "bid": None, "offer": None, "group": None, "node_rank": 0, "nodes": 1},
             "providers": None, "ssh_timeout": None, "policy": "{}", "images": None, "nodes": 1}
    command = dict(train, train=None, command={"run": "echo hi", "setup": None, "env": {"A": "1"}, "secrets": ["T"],
                                                "workdir": None, "outputs": [], "checkpoint": None,
                                                "checkpoint_minutes": 10.0, "nodes": 1, "workdir_max_mb": 200.0,
                                                "excludes": [], "workdir_bytes": None, "workdir_tar": None},
                   max_price=0.5)
    js = JobSpec.from_json(json.dumps(train))
    assert js.kind == "train" and js.work.epochs == 7 and js.request.disk_gb == 30
    js = JobSpec.from_json(json.dumps(command))
    assert js.kind == "command" and js.work.run == "echo hi" and js.work.secrets == ["T"] and js.max_price == 0.5
    again = json.loads(js.to_json())
    assert again["command"]["run"] == "echo hi" and again["train"] is None and "quote" not in again["request"]


@dataclass
class Note:
    text: str


class NoteKind(JobKind):
    """A job kind written the way a new one would be: one class, its spec, its verbs; registered
    with one line. It writes its text to a file on the machine, and the file comes home."""

    key, spec_type, noun, doing, results = "note", Note, "note", "writing", "outputs"  # no provisioning: its base's None

    def _cmd(self):
        from orchestrator.jobs.kinds import CommandSpec

        return CommandSpec(run=f"printf %s {shlex.quote(self.spec.text)} > note.txt", outputs=["note.txt"])

    @classmethod
    def check_stored(cls, spec, cache):  # a kind says what its stored spec may hold, or its rows are refused
        from orchestrator.errors import UsageError

        if not isinstance(spec.text, str) or len(spec.text) > 1000:
            raise UsageError("the job's stored spec is refused: its note is not a short text")

    def prepare(self, orch, js, disk_given: bool):
        return js

    def launch(self, orch, job, nodes, copy, kept=frozenset()) -> Launched:
        return Launched(command.launch(orch, nodes, self._cmd(), None), None, "started")

    def read(self, orch, inst, run) -> dict:
        return command.read(orch, inst, run)

    def watch(self, orch, job, inst, run, view) -> None:
        return None

    def take_checkpoint(self, orch, job, inst, run):
        return None, None

    def bring_home(self, orch, job, inst, run, dest, view=None, strict=True) -> list[str]:
        return command.pull_outputs(orch, inst, self._cmd(), dest, strict=strict)[0]

    def completed(self, job, how, dest, ended):
        return f"noted; {how}; {ended}", {"weights": str(dest)}


def test_a_new_job_kind_is_one_class_and_one_registration(orch_home, monkeypatch):
    """Nothing in submit or the engine names a kind: a kind they have never seen is planned,
    launched, watched, brought home and ended like the two orch has."""
    from orchestrator import jobs
    from orchestrator.jobs.kinds import KINDS
    from orchestrator.provider import Request

    monkeypatch.setitem(KINDS, NoteKind.key, NoteKind)
    orch = open_orch()
    js = jobs.JobSpec(kind="note", work=Note("hello from a new kind"), request=Request(name="n1", cpu=True))
    job = jobs.submit(orch, jobs.Submission("n1", js)).job
    job = wait_for(lambda: (lambda j: j if j.state in jobs.ENDED else None)(jobs.advance(orch, orch.ledger.job("n1"))),
                   timeout=60, what="the note job to end")
    assert job.state == "completed", (job.state, job.reason)
    assert (orch_home / "runs" / "n1" / "note.txt").read_text() == "hello from a new kind"
    assert json.loads(job.spec)["note"] == {"text": "hello from a new kind"}
    assert [i for i in orch.ledger.instances() if i.state not in ("destroyed", "failed", "lost")] == []


class ProvisionedNoteKind(NoteKind):
    """The note kind, its machine made ready with a package of its own over torch."""

    def provisioning(self):
        from orchestrator.provisioning import Provisioning

        return Provisioning(packages=("tenacity",), says="torch for the device, then tenacity")


@needs_torch
def test_a_new_kinds_provisioning_makes_its_machines_ready_before_its_launch(orch_home, monkeypatch):
    """A kind says what its machines get once SSH answers (``JobKind.provisioning``): the engine
    hands it to the bring-up, which installs and proves it before the kind's launch; orch names no
    package of it anywhere else."""
    from orchestrator import jobs
    from orchestrator.jobs.kinds import KINDS
    from orchestrator.instances.lifecycle import Orch
    from orchestrator.provider import Request

    monkeypatch.setitem(KINDS, NoteKind.key, ProvisionedNoteKind)
    lines: list[str] = []
    orch = Orch.open(say=lines.append)
    js = jobs.JobSpec(kind="note", work=Note("provisioned"), request=Request(name="n2", cpu=True))
    jobs.submit(orch, jobs.Submission("n2", js))
    assert "[3/4] provisioning (torch for the device, then tenacity)" in lines, lines
    [inst] = orch.ledger.instances()  # its attempt's machine
    assert "matmul sum" in (inst.device or ""), inst.device
    job = wait_for(lambda: (lambda j: j if j.state in jobs.ENDED else None)(jobs.advance(orch, orch.ledger.job("n2"))),
                   timeout=60, what="the note job to end")
    assert job.state == "completed", (job.state, job.reason)


def test_run_resume_of_a_training_is_checked_for_its_files_not_refused_as_a_replace(orch_home, tmp_path):
    """`orch run NAME --data DS --resume` is asked for the run's last.pt (it used to be refused
    always, as if --replace had been given with it), and an ended training's files are kept unless
    --replace is given."""
    from orchestrator.tasks import dataset

    ds = dataset.synth(tmp_path / "ds", n_train=2, n_val=1)
    got = run_orch("run", "rs", "--data", ds, "--cpu", "--resume", check=2)
    assert "--resume starts from" in got.stderr and "which does not exist" in got.stderr, got.stderr
    assert "--replace removes them" not in got.stderr
    kept = orch_home / "runs" / "rs" / "weights" / "best.pt"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"weights of an ended run")
    got = run_orch("run", "rs", "--data", ds, "--cpu", "--dry-run", check=None)
    assert "the launch would be refused" in got.stderr and "already holds job rs's files" in got.stderr, got.stderr
    assert kept.read_bytes() == b"weights of an ended run"
