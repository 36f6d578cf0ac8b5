"""What the ledger gives back is input (issue 42): whoever can write a shared ledger must not make the
team's reaper upload a folder of its machine, write files an instance chooses outside ORCH_HOME, or
delete there. Each job row here is made as `orch run` makes it, then changed with plain SQL, then met
by a real reaper pass or `orch jobs show`: refused in one clear reason, the job failed, nothing rented,
sent, written or deleted. And a node's address from a provider is a plain IP literal or nothing.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from sqlalchemy import text

from tests.clouds import local_billing, open_orch, wait_for
from tests.conftest import run_orch


def make_job(home, work, name: str, **fields) -> str:
    """A planned command job as `orch run -f` records it (its workdir packed in orch's cache); its id."""
    from orchestrator import jobs
    from orchestrator.tasks import workdir
    from orchestrator.jobs.kinds import CommandSpec
    from orchestrator.provider import Request

    (work / "job.py").parent.mkdir(parents=True, exist_ok=True)
    (work / "job.py").write_text("print('hi')\n")
    tar, size = workdir.pack(work, home / "cache")
    cmd = CommandSpec(run="python job.py", workdir=str(work), workdir_tar=str(tar), workdir_bytes=size,
                      outputs=["out/model.pt"], **fields)
    spec = jobs.JobSpec(kind="command", work=cmd, request=Request(name=name, cpu=True))
    job = open_orch().ledger.create_job(jobs.ACTIVE, name=name, state=jobs.PLANNED, spec=spec.to_json(), plan="{}",
                                        retries=1)
    return job.id


def tamper(job_id: str, **columns) -> None:
    """Straight into the ledger's table, as anyone who can write the database can."""
    orch = open_orch()
    sets = ", ".join(f"{k} = :{k}" for k in columns)
    with orch.ledger.engine.begin() as conn:
        conn.execute(text(f"UPDATE jobs SET {sets} WHERE id = :id"), {**columns, "id": job_id})


def tamper_spec(job_id: str, change) -> None:
    spec = json.loads(open_orch().ledger.get_job(job_id).spec)
    change(spec["command"])
    tamper(job_id, spec=json.dumps(spec))


def refused(job_id: str, says: str) -> None:
    job = open_orch().ledger.get_job(job_id)
    assert job.state == "failed", (job.state, job.reason)
    assert job.reason.startswith("its ledger row is refused") and says in job.reason, job.reason
    assert open_orch().ledger.attempts(job_id) == []


def nothing_rented(orch_home) -> None:
    assert open_orch().ledger.instances() == [] and local_billing(orch_home) == set()


def test_a_job_named_out_of_orch_home_is_refused_and_nothing_outside_is_written_or_deleted(orch_home, tmp_path):
    """`../../victim` with outputs [.ssh] made the reaper write what an instance chose into
    ~/.ssh/authorized_keys, and an rmtree on such a name deletes outside ORCH_HOME."""
    victim = tmp_path / "victim"
    (victim / ".ssh").mkdir(parents=True)
    (victim / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
    job_id = make_job(orch_home, tmp_path / "work", "legit")
    tamper_spec(job_id, lambda cmd: cmd.update(outputs=[".ssh"]))
    tamper(job_id, name="../../victim")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if "orch" not in p.parts)
    proc = run_orch("reap", check=0)
    assert "refused" in proc.stdout, proc.stdout + proc.stderr
    refused(job_id, "invalid name '../../victim'")
    after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if "orch" not in p.parts)
    assert after == before, "something was written or deleted outside ORCH_HOME"
    assert (victim / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAA mine\n"
    nothing_rented(orch_home)


TAMPERED = {
    # what the row says instead: what the refusal names
    "an output out of the workdir": (lambda cmd: cmd.update(outputs=["../../.ssh"]), "output '../../.ssh'"),
    "a checkpoint folder out of it": (lambda cmd: cmd.update(checkpoint="/home/someone"), "checkpoint"),
    "a packed workdir elsewhere": (lambda cmd: cmd.update(workdir_tar="/tmp/elsewhere/id_rsa"), "packed workdir"),
    "a relative workdir": (lambda cmd: cmd.update(workdir="../.ssh"), "workdir '../.ssh'"),
    "an env name of orch's": (lambda cmd: cmd.update(env={"ORCH_NODE_IPS": "x"}), "env 'ORCH_NODE_IPS'"),
    "a NUL in an env value": (lambda cmd: cmd.update(env={"A": "x\0y"}), "env A"),
    "outputs that are no list": (lambda cmd: cmd.update(outputs=".ssh"), "outputs"),
    "a workdir that is your home": (lambda cmd: cmd.update(workdir=os.path.realpath(os.path.expanduser("~"))),
                                    "is your home folder"),
    "a workdir of keys": (lambda cmd: cmd.update(workdir=os.path.realpath(os.path.expanduser("~/.ssh"))),
                          "~/.ssh, which holds credentials"),
}


def test_a_tampered_spec_is_refused_by_the_reaper_and_by_jobs_show(orch_home, tmp_path):
    ids = {}
    for i, case in enumerate(sorted(TAMPERED)):
        ids[case] = make_job(orch_home, tmp_path / f"work{i}", f"job{i}")
        tamper_spec(ids[case], TAMPERED[case][0])
    shown = make_job(orch_home, tmp_path / "shown", "shown")
    tamper(shown, spec="{not json")
    run_orch("reap", check=0)
    for case, job_id in ids.items():
        refused(job_id, TAMPERED[case][1])
    proc = run_orch("jobs", "show", "shown", "--json", check=0)
    assert json.loads(proc.stdout)["state"] == "failed"
    refused(shown, "not JSON")
    nothing_rented(orch_home)


def test_a_packed_workdir_comes_from_orchs_cache_alone_and_a_changed_workdir_is_refused(orch_home, tmp_path):
    """A row may name any tar and any folder: the tar is taken from orch's cache by its name (its
    content hashing to it), and a folder packed again must give that same tar."""
    from orchestrator import jobs
    from orchestrator.tasks import workdir
    from orchestrator.errors import UsageError

    work = tmp_path / "work"
    job_id = make_job(orch_home, work, "cached")
    cache = orch_home / "cache"
    (tmp_path / "user" / ".ssh").mkdir(parents=True, exist_ok=True)
    (tmp_path / "user" / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = next(cache.glob("workdir-*.tar"))
    (elsewhere / real.name).write_bytes(b"not the job's tar")
    tamper_spec(job_id, lambda cmd: cmd.update(workdir_tar=str(elsewhere / real.name)))
    js = jobs.JobSpec.of(open_orch().ledger.get_job(job_id))
    assert js.work.workdir_tar == str(real), "a tar outside orch's cache was taken"
    said = []
    js.work.workdir = str(tmp_path / "user" / ".ssh")  # past the row's own check (test_a_tampered_spec...)
    workdir.ready(js.work, cache, said.append)
    assert js.work.workdir_tar == str(real) and said == [], "the cached tar is the job's: no folder is packed"
    real.unlink()  # the cache cleaned: a folder of credentials is never packed, whatever the spec says
    with pytest.raises(UsageError, match=r"~/\.ssh, which holds credentials"):
        workdir.ready(js.work, cache, said.append)
    assert list(cache.glob("workdir-*.tar")) == [], "nothing of ~/.ssh was packed"
    js.work.workdir = str(elsewhere)  # another folder: packed again, it must give the job's tar
    with pytest.raises(UsageError, match="not what the job was made with"):
        workdir.ready(js.work, cache, said.append)
    assert list(cache.glob("workdir-*.tar")) == [], "a packed copy of the other folder was kept"
    js = jobs.JobSpec.of(open_orch().ledger.get_job(job_id))
    js.work.workdir = str(work)  # the job's own folder, unchanged: packed again to the same tar
    workdir.ready(js.work, cache, said.append)
    assert js.work.workdir_tar == str(real) and real.is_file()
    (work / "job.py").write_text("print('changed')\n")
    real.unlink()
    with pytest.raises(UsageError, match="not what the job was made with"):
        workdir.ready(js.work, cache, said.append)


def test_a_name_never_becomes_a_path_unchecked(orch_home):
    from orchestrator.errors import UsageError
    from orchestrator.jobs import record

    for make in (record.weights_dir, record.job_dir, lambda home, name: record.checkpoint_dir(home, name, 1)):
        with pytest.raises(UsageError, match="invalid name"):
            make(orch_home, "../../victim")
    assert record.checkpoint_dir(orch_home, "fine", 2) == orch_home / "jobs" / "fine" / "ckpt-2"


# -- addresses a provider gives -----------------------------------------------------------------------
SCOPED = ["fe80::1%eth0", "fe80::1%a b", "fe80::1%x\n10.0.0.9", "fe80::1%$(touch /tmp/pwned)", "fe80::1%'\"",
          "node-0.internal", " 10.0.0.1", "10.0.0.1\n10.0.0.2"]


@pytest.mark.parametrize("address", SCOPED)
def test_only_a_plain_ip_literal_is_a_nodes_address(orch_home, address):
    """An IPv6 scope id may hold spaces, newlines, quotes and `$(...)`: ORCH_NODE_IPS gained lines.
    A provider's private address is recorded only when it is a plain IP literal, and no other
    reaches a node's environment."""
    from orchestrator import states
    from orchestrator.nodes import node_env
    from orchestrator.provider import Endpoint, Remote, Status

    with pytest.raises(ValueError):
        node_env(0, ["10.0.0.1", address], 0)
    env = node_env(1, ["10.0.0.1", "fd00::2"], 0)
    assert env["ORCH_NODE_IPS"] == "10.0.0.1\nfd00::2" and env["ORCH_MASTER_ADDR"] == "10.0.0.1"
    orch = open_orch()
    for given, kept in ((address, None), ("10.0.0.7", "10.0.0.7")):
        inst = orch.ledger.create_instance(name=f"n{len(orch.ledger.instances())}", provider="local", label="",
                                           host_key="ssh-ed25519 AAAA vouched")
        remote = Remote("p1", inst.label, Status.RUNNING, endpoint=Endpoint("127.0.0.1", 22), private_ip=given)
        assert orch._endpoint(inst, orch.provider("local"), remote).private_ip == kept
        orch.ledger.transition(inst.id, states.FAILED, "test")


def test_a_job_row_naming_a_provider_key_fails_before_renting_and_the_key_never_leaves(orch_home, tmp_path):
    """Finding 2 of issue 53, from the ledger: a job row a teammate wrote (or changed) naming a
    provider key got the key of whoever relaunched it (a reaper runs with every provider's key).
    Refused unless a person handed it over on this machine (`--allow-secret`, kept at home): the
    job fails saying which variable and why, nothing rented."""
    key = "rpa_" + os.urandom(16).hex()
    job_id = make_job(orch_home, tmp_path / "work", "keyed")
    tamper_spec(job_id, lambda cmd: cmd.update(secrets=["RUNPOD_API_KEY"]))
    from orchestrator.jobs import record

    stale = open_orch().ledger.get_job(job_id)
    stale.id = "another-job"  # an allowance of another job of that name (an old one, or a row that took its name)
    record.allow_secrets(orch_home, stale, ["RUNPOD_API_KEY"])
    shown = json.loads(run_orch("jobs", "show", "keyed", "--json", env={"RUNPOD_API_KEY": key}, check=0).stdout)
    job = open_orch().ledger.get_job(job_id)
    assert shown["state"] == job.state == "failed", (job.state, job.reason)
    assert "secret RUNPOD_API_KEY is one of the runpod provider's own settings" in job.reason, job.reason
    assert open_orch().ledger.attempts(job_id) == []
    nothing_rented(orch_home)
    for path in orch_home.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_a_provider_key_handed_to_a_job_on_this_machine_goes_with_its_relaunch(orch_home, tmp_path):
    """`--allow-secret` is kept at home for that job (its id), so the job's next launch, from the
    ledger's row, still gets the key it was given on purpose."""
    from orchestrator.tasks import workdir
    from orchestrator.jobs import record

    key = "rpa_" + os.urandom(16).hex()
    work = tmp_path / "work"
    job_id = make_job(orch_home, work, "handed")
    (work / "job.py").write_text("import hashlib, os, pathlib\npathlib.Path('out').mkdir()\n"
                                 "pathlib.Path('out/model.pt').write_text(hashlib.sha256("
                                 "os.environ['RUNPOD_API_KEY'].encode()).hexdigest())\n")
    tar, size = workdir.pack(work, orch_home / "cache")  # the job as made with this job.py and that secret
    tamper_spec(job_id, lambda cmd: cmd.update(secrets=["RUNPOD_API_KEY"], workdir_tar=str(tar), workdir_bytes=size))
    record.allow_secrets(orch_home, open_orch().ledger.get_job(job_id), ["RUNPOD_API_KEY"])

    def ended():
        shown = json.loads(run_orch("jobs", "show", "handed", "--json", env={"RUNPOD_API_KEY": key}, check=0).stdout)
        return shown if shown["state"] in ("completed", "failed") else None

    shown = wait_for(ended, timeout=90, what="the job to end")
    assert shown["state"] == "completed", (shown["state"], shown.get("reason"))
    got = (orch_home / "runs" / "handed" / "out" / "model.pt").read_text()
    assert got == hashlib.sha256(key.encode()).hexdigest()
    assert local_billing(orch_home) == set() and not (orch_home / "jobs" / "handed").exists()


def test_a_kind_with_no_stored_spec_check_is_refused_and_its_secrets_are_hidden(orch_home, monkeypatch):
    """A third kind added without ``JobKind.check_stored`` never has its rows acted on unchecked: a
    look at the job fails it with the refusal, nothing rented. The secret names its stored part
    keeps are hidden from the job's lines like a command's."""
    from dataclasses import dataclass, field

    from orchestrator import jobs
    from orchestrator.jobs import record
    from orchestrator.jobs.kinds import KINDS, JobKind
    from orchestrator.provider import Request

    @dataclass
    class BoxSpec:
        image: str = "ubuntu"
        secrets: list = field(default_factory=list)

    class DevBox(JobKind):  # every verb it must have, none of them reached
        key, spec_type, noun, doing = "devbox", BoxSpec, "dev box", "open"
        prepare = launch = read = watch = take_checkpoint = bring_home = completed = None

    monkeypatch.setitem(KINDS, "devbox", DevBox)
    spec = jobs.JobSpec(kind="devbox", work=BoxSpec(secrets=["BOX_TOKEN"]), request=Request(name="box", cpu=True))
    orch = open_orch()
    job = orch.ledger.create_job(jobs.ACTIVE, name="box", state=jobs.PLANNED, spec=spec.to_json(), plan="{}", retries=1)
    monkeypatch.setenv("BOX_TOKEN", "tok-3f9a1c")
    assert record.scrub(job, "it printed tok-3f9a1c") == "it printed ***"
    jobs.advance(orch, job)
    refused(job.id, "orch checks no stored devbox spec")
    nothing_rented(orch_home)
