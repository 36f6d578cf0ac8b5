"""Volumes on the local provider: made, mounted before anything runs, written by one job and read by
the next on another instance, HF_HOME on them, listed and costed, reported when idle (never
deleted), adopted by reconcile, removed only on request and never while mounted; bad input one
line, exit 2, nothing made."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.clouds import arrange, configure, local_billing, open_orch, wait_for
from tests.conftest import needs_torch, run_orch
from tests.fakes.webhook import Hook
from tests.postgres import pg_server, pg_url  # noqa: F401  (fixtures)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def volumes() -> dict[str, dict]:
    return {v["name"]: v for v in json.loads(run_orch("volume", "ls", "--json", check=0).stdout)}


def make(name: str, size: int = 5) -> None:
    """A volume made as `orch volume create` makes it, in this process (the CLI's own is tested above)."""
    from orchestrator.volumes import volumes as made

    made.create(open_orch(), name, "local", size, None)


def mounting(name: str, *flags: str):
    """A ready local instance mounting each volume FLAGS names (``NAME:PATH``, as `--volume` takes
    them), as `orch up` leaves it but not provisioned (no torch, no probe: what these tests check is
    the volume). The volumes are placed as `orch up` places them, the provider links each at its
    path, and the two steps `orch up` adds are taken here: the mounts attached in the ledger
    (``volume_mounts.record``) and each made ready and checked as the login user
    (``volume_mounts.make_ready``). `orch up --volume` itself: the group and the cannot-be-mounted
    tests below."""
    from orchestrator.volumes import volume_mounts, volume_uses
    from orchestrator.provider import Request

    orch = open_orch()
    uses = [u.to_dict() for u in volume_uses.flags(list(flags))]
    request, _, _ = volume_mounts.narrow(orch, Request(name=name, cpu=True), uses, 1, None)
    inst = arrange(orch, name, mounts=request.mounts)
    volume_mounts.record(orch, inst, request.mounts)
    volume_mounts.make_ready(orch, inst)
    return inst


def job_json(name: str) -> dict:
    return json.loads(run_orch("jobs", "show", name, "--json", check=0).stdout)


def volume_events(name: str) -> list[tuple]:
    from orchestrator.volumes import ledger_volumes

    ledger = open_orch().ledger
    row = next(r for r in ledger_volumes.rows(ledger, live_only=False) if r.name == name)
    return [(e.from_state, e.to_state, e.actor) for e in ledger_volumes.events(ledger, row.id)]


# -- made, listed, costed, removed ---------------------------------------------------------------
def test_a_volume_is_made_listed_costed_and_removed_only_on_request(orch_home):
    configure(orch_home, "local", {"volume_price_gb_month": 0.5})
    out = run_orch("volume", "create", "data", "--provider", "local", "--size", 10, check=0).stdout
    assert "volume data: ready on local" in out and "$5.00/month" in out
    folder = orch_home / "volumes" / "data"
    assert folder.is_dir()
    v = volumes()["data"]
    assert (v["provider"], v["where"], v["size_gb"], v["usd_month"], v["attached_to"]) == \
        ("local", "this machine", 10, 5.0, [])
    table = run_orch("volume", "ls", check=0).stdout
    assert "data" in table and "this machine" in table and "5.00" in table

    cost = json.loads(run_orch("cost", "--json", check=0).stdout)["volumes"]
    assert [(c["name"], c["size_gb"], c["price_gb_month"]) for c in cost] == [("data", 10, 0.5)]
    assert cost[0]["usd"] > 0 and cost[0]["hours"] > 0  # billing from its creation
    assert "data" in run_orch("cost", check=0).stdout

    asked = run_orch("volume", "rm", "data", check=2)  # no terminal to ask on: --yes needed
    assert "--yes" in asked.stderr and folder.is_dir() and "data" in volumes()
    assert run_orch("volume", "rm", "data", "--yes", check=0).stdout.strip() == "volume data: deleted"
    assert not folder.exists() and volumes() == {}
    assert [(a, b) for a, b, _ in volume_events("data")] == [(None, "creating"), ("creating", "ready"),
                                                             ("ready", "deleting"), ("deleting", "deleted")]
    deleted = json.loads(run_orch("cost", "--json", check=0).stdout)["volumes"]
    assert [(c["name"], c["state"]) for c in deleted] == [("data", "deleted")]  # what it billed stays counted


def test_volumes_on_a_shared_postgresql_ledger(pg_url, orch_home):
    """The same verbs on PostgreSQL (a team's ledger): the models' reads, the name's advisory lock."""
    make("data")
    mounting("box", "data:~/data")
    assert [a["instance"] for a in volumes()["data"]["attached_to"]] == ["box"]
    assert "attached to box" in run_orch("volume", "rm", "data", "--yes", check=2).stderr
    assert "box mounts volume data" in run_orch("status", check=0).stdout
    run_orch("down", "box", check=0)
    from providers.local import LocalProvider

    LocalProvider({}, orch_home).create_volume("stray", 3, None)
    assert "stray: adopted from local" in run_orch("reconcile", check=0).stdout
    assert [c["name"] for c in json.loads(run_orch("cost", "--json", check=0).stdout)["volumes"]] == ["data", "stray"]
    run_orch("volume", "rm", "data", "--yes", check=0)
    assert set(volumes()) == {"stray"}


BAD_CREATE = [
    (["Bad_Name", "--provider", "local", "--size", "5"], "is no volume name"),
    (["v", "--provider", "local", "--size", "0"], "--size must be between 1 and"),
    (["v", "--provider", "local", "--size", "99999999"], "--size must be between 1 and"),
    (["v", "--provider", "local", "--size", "5", "--zone", "us-east-1a"], "drop --zone"),
    (["v", "--provider", "local", "--size", "5", "--region", "a", "--zone", "b"], "not both"),
    (["v", "--provider", "nosuch", "--size", "5"], "unknown provider"),
]


@pytest.mark.parametrize("args, says", BAD_CREATE)
def test_a_bad_volume_create_is_one_line_exit_2_and_makes_nothing(orch_home, args, says):
    got = run_orch("volume", "create", *args, check=2)
    assert says in got.stderr and len(got.stderr.strip().splitlines()) == 1
    assert not (orch_home / "volumes").exists() and not (orch_home / "ledger.db").exists()


def test_a_second_volume_of_a_name_and_an_unknown_rm_are_refused(orch_home):
    make("data")
    assert "already exists" in run_orch("volume", "create", "data", "--provider", "local", "--size", 5, check=2).stderr
    assert "no volume named 'nope'" in run_orch("volume", "rm", "nope", "--yes", check=2).stderr


BAD_USE = [
    (["--volume", "nope:~/d"], "unknown volume 'nope'"),
    (["--volume", "data:/data"], "write the path as ~/SOMETHING"),
    (["--volume", "data:data"], "is no mount path"),
    (["--volume", "data:~/../x"], "is no mount path"),
    (["--volume", "data"], "--volume takes NAME:PATH"),
    (["--volume", "data:/home"], "would hide the login's home or its SSH keys"),
    (["--volume", "data:/home/ubuntu"], "would hide the login's home or its SSH keys"),
    (["--volume", "data:/root/"], "would hide the login's home or its SSH keys"),
    (["--volume", "data:~/.ssh"], "would hide the login's home or its SSH keys"),
    (["--volume", "data:/etc/ssh"], "would hide the login's home or its SSH keys"),
    (["--volume", "data:~/a", "--volume", "data:~/b"], "volume data is named twice"),
    (["--volume", "data:~/a", "--volume", "other:~/a/b"], "overlap"),
    (["--provider", "runpod", "--volume", "data:~/a"], "volume data is on local, not runpod"),
]


@pytest.mark.parametrize("args, says", BAD_USE)
@pytest.mark.parametrize("command", ["up", "run"])
def test_a_bad_volume_on_up_or_run_is_one_line_exit_2_and_rents_nothing(orch_home, command, args, says):
    configure(orch_home, "runpod", {"api_key": "not-used"})  # named, with a key: refused for the volume alone
    make("data")
    make("other")
    extra = ["--", "true"] if command == "run" else []
    got = run_orch(command, "box", "--cpu", *args, *extra, check=2)
    assert says in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
    ledger = open_orch().ledger
    assert local_billing(orch_home) == set() and ledger.instances() == [] and ledger.jobs() == []


def test_a_task_files_bad_volumes_name_their_line(orch_home, tmp_path):
    make("data")
    twice = write(tmp_path / "twice.yaml", """
        name: t
        resources: {cpu: true}
        run: "true"
        volumes:
          ~/a: data
          ~/b: {name: data}
        """)
    got = run_orch("run", "-f", twice, check=2)
    assert f"{twice}:4" in got.stderr and "volume data is named twice" in got.stderr
    absolute = write(tmp_path / "abs.yaml", """
        name: t
        resources: {cpu: true}
        run: "true"
        volumes: {/data: data}
        """)
    assert "write the path as ~/SOMETHING" in run_orch("run", "-f", absolute, check=2).stderr
    assert open_orch().ledger.jobs() == [] and local_billing(orch_home) == set()


# -- used: written by one job, read by the next ----------------------------------------------------
def test_a_volume_written_by_one_job_is_read_by_the_next_on_another_instance_with_hf_home_on_it(orch_home, tmp_path):
    make("data")
    writer = write(tmp_path / "writer.yaml", """
        name: writer
        resources: {cpu: true}
        volumes: {~/data: data}
        setup: echo "setup sees $ORCH_VOLUME_DATA" > "$ORCH_VOLUME_DATA/setup.txt"
        run: |
          echo "volumes: $ORCH_VOLUMES"
          echo "hf_home: $HF_HOME"
          echo "written by $ORCH_INSTANCE_ID" > "$ORCH_VOLUME_DATA/msg"
        """)
    run_orch("run", "-f", writer, "--wait", check=0)
    folder = orch_home / "volumes" / "data"
    first = (folder / "msg").read_text().split()[-1]
    assert (folder / "setup.txt").read_text().startswith("setup sees ")  # mounted before setup
    log = (orch_home / "runs" / "writer" / "train.log").read_text()
    path = next(line.split("=", 1)[1] for line in log.splitlines() if line.startswith("volumes: data="))
    assert path.endswith("/home/data") and f"hf_home: {path}/hf" in log  # HF_HOME in the first volume

    # The next job, on another instance, with HF_HOME of its own: it reads what the first wrote.
    run_orch("run", "reader", "--cpu", "--volume", "data:~/store", "--env", "HF_HOME=/tmp/own-hf", "--wait", "--",
             "bash", "-c", 'cat "$ORCH_VOLUME_DATA/msg"; echo "hf_home: $HF_HOME"', check=0)
    log = (orch_home / "runs" / "reader" / "train.log").read_text()
    assert f"written by {first}" in log and "hf_home: /tmp/own-hf" in log
    jobs = {n: job_json(n)["attempts"][0]["instance"] for n in ("writer", "reader")}
    assert jobs == {"writer": "writer-a1", "reader": "reader-a1"}
    assert first != next(i.id for i in open_orch().ledger.instances() if i.name == "reader-a1")
    assert local_billing(orch_home) == set() and (folder / "msg").is_file()  # both gone, the volume kept
    assert volumes()["data"]["attached_to"] == []


def test_status_shows_what_is_mounted_and_rm_is_refused_while_it_is(orch_home):
    make("data")
    mounting("box", "data:~/data")
    run_orch("ssh", "box", "--", "echo kept > ~/data/file", check=0)
    assert (orch_home / "volumes" / "data" / "file").read_text() == "kept\n"

    assert "box mounts volume data at " in run_orch("status", check=0).stdout
    fleet = {i["name"]: i["volumes"] for i in json.loads(run_orch("status", "--json", check=0).stdout)}
    assert [v["volume"] for v in fleet["box"]] == ["data"] and fleet["box"][0]["path"].endswith("/home/data")
    one = json.loads(run_orch("status", "box", "--json", check=0).stdout)
    assert [v["volume"] for v in one["volumes"]] == ["data"]
    assert [a["instance"] for a in volumes()["data"]["attached_to"]] == ["box"]

    refused = run_orch("volume", "rm", "data", "--yes", check=2)
    assert "attached to box" in refused.stderr and (orch_home / "volumes" / "data" / "file").is_file()
    run_orch("down", "box", check=0)
    assert (orch_home / "volumes" / "data" / "file").read_text() == "kept\n"  # the instance went, the data stayed
    assert volumes()["data"]["attached_to"] == []
    run_orch("volume", "rm", "data", "--yes", check=0)
    assert not (orch_home / "volumes" / "data").exists()


def test_a_volume_that_cannot_be_mounted_ends_the_instance_and_is_kept(orch_home):
    make("data")
    # An `orch up` that dies once the instance answers SSH, before anything ran there ...
    run_orch("up", "box", "--cpu", "--volume", "data:~/data", env={"ORCH_TEST_KILL_AT": "ssh-ready"})
    assert len(local_billing(orch_home)) == 1
    # ... and what the volume was is no folder any more when `orch up` resumes.
    folder = orch_home / "volumes" / "data"
    folder.rmdir()
    folder.write_text("not a folder")
    got = run_orch("up", "box", "--cpu", check=1)
    assert "volume data could not be mounted on box" in got.stderr and "the volume is kept" in got.stderr
    assert local_billing(orch_home) == set()  # the instance ended
    assert open_orch().ledger.by_name("box", live_only=False).state == "destroyed"
    assert volumes()["data"]["state"] == "ready" and folder.read_text() == "not a folder"


def staged_birds(tmp_path: Path, *instances: str):
    """A volume ``ds`` mounted at ~/v by each of ``instances`` and orch's tiny synthetic dataset
    packed as `orch run --data` packs it: (orch, the spec, the dataset's folder on the volume)."""
    from orchestrator.tasks import dataset
    from orchestrator.runs import training

    make("ds")
    for name in instances:
        mounting(name, "ds:~/v")
    info = dataset.validate(dataset.synth(tmp_path / "birds", n_train=4, n_val=2), doctor=False)
    tar = dataset.pack(info, tmp_path / "birds.tar")
    spec = training.TrainSpec(data=str(tmp_path / "birds"), local_tar=tar,
                              dataset_name="ds-" + dataset.sha256(tar)[:16], data_bytes=tar.stat().st_size)
    orch = open_orch()
    return orch, spec, Path(orch.home) / "volumes" / "ds" / "orch-data" / spec.dataset_name


def stage_on(orch, spec, name: str = "box") -> tuple[str, str]:
    """The dataset staged as a training on ``name`` stages it: (its data.yaml there, the line said)."""
    from orchestrator.runs import training

    inst, said = orch.ledger.by_name(name), []
    with orch.connect(inst) as c:
        data_yaml = training.stage(orch, inst, c, spec, (1 << 30, 10_000), said.append)
    return data_yaml, said[-1]


def trained_on(data_yaml: str) -> tuple[dict, set[str]]:
    """What LibreYOLO reads through ``data_yaml``: the yaml, and every file under its ``path:``."""
    config = json.loads(Path(data_yaml).read_text())
    root = Path(config["path"])
    return config, {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_a_dataset_is_staged_on_the_volume_once_and_reused_while_every_file_is_as_staged(orch_home, tmp_path):
    orch, spec, on_volume = staged_birds(tmp_path, "box", "twin")  # two instances on one volume, as a group's nodes
    tar = spec.local_tar
    # Both at once: one stages, the other waits for it and reuses what it staged.
    from orchestrator import parallel

    both = parallel.each(lambda name: stage_on(orch, spec, name), ["box", "twin"], 2)
    assert [e for _, e in both] == [None, None]
    said = sorted(s for (_, s), _ in both)
    assert "reused from the volume" in said[0] and "staged on the volume" in said[1], said
    first = both[0][0][0]
    config, files = trained_on(first)
    assert Path(config["path"]).resolve().is_relative_to(on_volume.resolve()) and "data.yaml" in files
    tar_there = on_volume.with_name(spec.dataset_name + ".tar")
    sent_at = tar_there.stat().st_mtime_ns
    again, said = stage_on(orch, spec)
    assert again == first and "reused from the volume" in said, said  # nothing uploaded, nothing unpacked
    assert tar_there.stat().st_mtime_ns == sent_at
    image = next(p for p in on_volume.rglob("*.png"))
    image.write_bytes(b"changed by someone else")
    _, said = stage_on(orch, spec)
    assert "staged again: 1 file changed since orch staged it; unpacked from the tar" in said, said
    assert image.read_bytes() != b"changed by someone else"
    tar_there.write_bytes(b"not the dataset")
    image.write_bytes(b"changed again")
    _, said = stage_on(orch, spec)
    assert "staged again: 1 file changed since orch staged it; uploaded again" in said, said
    assert tar_there.read_bytes() == tar.read_bytes() and image.read_bytes() != b"changed again"
    _, said = stage_on(orch, spec)
    assert "reused from the volume" in said, said
    run_orch("down", "box", "twin", check=0)


def test_what_orch_staged_on_a_volume_is_recorded_on_a_shared_postgresql_ledger(pg_url, orch_home, tmp_path):
    orch, spec, on_volume = staged_birds(tmp_path, "box")
    assert "staged on the volume" in stage_on(orch, spec)[1]
    assert "reused from the volume" in stage_on(orch, spec)[1]
    (next(on_volume.iterdir()) / "extra.txt").write_text("not orch's")
    assert "staged again: 1 file on the volume that orch did not stage" in stage_on(orch, spec)[1]
    assert "reused from the volume" in stage_on(orch, spec)[1]
    run_orch("down", "box", check=0)


# -- a volume written by someone else: the attacks of issue 53 (finding 4) ---------------------------
def test_an_image_and_label_added_on_the_volume_are_not_trained_on(orch_home, tmp_path):
    orch, spec, on_volume = staged_birds(tmp_path, "box")
    data_yaml, _ = stage_on(orch, spec)
    _, staged = trained_on(data_yaml)
    top = next(on_volume.iterdir())
    shutil.copy(next(top.glob("images/train/*.png")), top / "images" / "train" / "poison.png")
    (top / "labels" / "train" / "poison.txt").write_text("0 0.5 0.5 0.9 0.9\n")
    data_yaml, said = stage_on(orch, spec)
    assert "staged again: 2 files on the volume that orch did not stage" in said, said
    config, files = trained_on(data_yaml)
    assert files == staged and not any("poison" in f for f in files)
    assert not (top / "images" / "train" / "poison.png").exists()
    run_orch("down", "box", check=0)


@needs_torch
@pytest.mark.training
def test_a_job_whose_dataset_was_added_to_on_the_volume_stages_it_again_and_says_why(orch_home, tmp_path):
    orch, spec, on_volume = staged_birds(tmp_path, "box")  # a job before this one staged it
    stage_on(orch, spec)
    run_orch("down", "box", check=0)
    top = next(on_volume.iterdir())
    (top / "images" / "train" / "poison.png").write_bytes(b"no image")  # LibreYOLO would fail on it
    (top / "labels" / "train" / "poison.txt").write_text("7 0.5 0.5 0.9 0.9\n")  # class 7 of 2
    proc = run_orch("run", "t", "--data", spec.data, "--epochs", "1", "--cpu", "--imgsz", "64", "--batch", "4",
                    "--train-arg", "workers=0", "--volume", "ds:~/v", "--wait", "--json", check=0)
    why = "data staged again: 2 files on the volume that orch did not stage; unpacked from the tar"
    assert "staged again: 2 files on the volume that orch did not stage" in proc.stderr + proc.stdout
    job = json.loads(proc.stdout)
    assert job["state"] == "completed", job["history"]
    assert any(why in h["text"] for h in job["history"]), job["history"]
    assert why in job["attempts"][0]["resumed_from"]
    assert not any(p.name.startswith("poison") for p in top.rglob("*"))


def test_a_label_rewritten_with_its_manifest_entry_on_the_volume_is_staged_again(orch_home, tmp_path):
    import hashlib

    orch, spec, on_volume = staged_birds(tmp_path, "box")
    stage_on(orch, spec)
    top = next(on_volume.iterdir())
    label = next(top.glob("labels/train/*.txt"))
    kept = label.read_bytes()
    label.write_text("1 0.5 0.5 0.9 0.9\n")
    # An attacker who knows how a staged dataset used to be checked rewrites that record too.
    manifest = on_volume.with_name(spec.dataset_name + ".manifest.json")
    if manifest.exists():
        record = json.loads(manifest.read_text())
        record["files"][label.relative_to(on_volume.resolve()).as_posix()] = [
            label.stat().st_size, hashlib.sha256(label.read_bytes()).hexdigest()]
        manifest.write_text(json.dumps(record))
    _, said = stage_on(orch, spec)
    assert "staged again: 1 file changed since orch staged it" in said, said
    assert label.read_bytes() == kept
    run_orch("down", "box", check=0)


def test_a_data_yaml_pointed_out_of_the_staged_folder_is_not_trained_on(orch_home, tmp_path):
    orch, spec, on_volume = staged_birds(tmp_path, "box")
    stage_on(orch, spec)
    elsewhere = on_volume.resolve().parent.parent / "elsewhere"
    (elsewhere / "images").mkdir(parents=True)
    poison = {"path": str(elsewhere), "train": "images", "val": "images", "nc": 1, "names": ["poison"]}
    (elsewhere / "data.yaml").write_text(json.dumps(poison))
    # The volume's own record pointed there (how reuse read it), and the dataset's data.yaml a link there.
    manifest = on_volume.with_name(spec.dataset_name + ".manifest.json")
    if manifest.exists():
        record = json.loads(manifest.read_text())
        record["data_yaml"] = "../../elsewhere/data.yaml"
        manifest.write_text(json.dumps(record))
    top = next(on_volume.iterdir())
    (top / "data.yaml").unlink()
    (top / "data.yaml").symlink_to(os.path.relpath(elsewhere / "data.yaml", top))
    data_yaml, said = stage_on(orch, spec)
    assert "staged again: 1 file on the volume that orch did not stage" in said, said
    config, files = trained_on(data_yaml)
    assert config["names"] != ["poison"] and Path(config["path"]).resolve().is_relative_to(on_volume.resolve())
    assert not (top / "data.yaml").is_symlink()
    run_orch("down", "box", check=0)


HOSTILE_LISTINGS = [
    (["not", "a", "dict"], "no state"),
    ({"state": "dir", "files": {f"x{i}": [1, None] for i in range(1200)}, "others": [], "more": False},
     "more than 1013 entries"),
    ({"state": "dir", "files": {"birds/data.yaml": [-1, "0" * 64]}, "others": [], "more": False},
     "a file entry that is no path, size"),
    ({"state": "dir", "files": {}, "others": ["x" * 5000], "more": False}, "an entry that is no path"),
]


def test_a_hostile_hosts_listing_of_a_staged_dataset_is_checked_before_use(orch_home, tmp_path, monkeypatch):
    """What the instance says its folder holds is its word: of the wrong shape or beyond the sizes
    asked for, it is not compared, and the dataset is staged again from orch's own tar."""
    from playbooks import train

    orch, spec, on_volume = staged_birds(tmp_path, "box")
    stage_on(orch, spec)
    for listing, why in HOSTILE_LISTINGS:
        monkeypatch.setattr(train, "staged_report", lambda *a, **k: listing)  # the host's answer, as it chose it
        data_yaml, said = stage_on(orch, spec)
        assert f"staged again: the instance's listing of it was not usable ({why}" in said, said
        assert Path(trained_on(data_yaml)[0]["path"]).resolve().is_relative_to(on_volume.resolve())
    run_orch("down", "box", check=0)


def test_a_ledger_record_whose_data_yaml_leaves_the_folder_is_not_used(orch_home, tmp_path):
    """The record is kept at home, and a shared ledger's row is input too: one whose data.yaml
    leaves the dataset's folder is no record, and the dataset is staged again."""
    from sqlalchemy import update

    from orchestrator.volumes.ledger_volumes import StagedDataset

    orch, spec, on_volume = staged_birds(tmp_path, "box")
    stage_on(orch, spec)
    with orch.ledger.session() as s:
        s.exec(update(StagedDataset).values(data_yaml="../../elsewhere/data.yaml"))
        s.commit()
    data_yaml, said = stage_on(orch, spec)
    assert "staged again: orch's record of it is not usable" in said, said
    config, _ = trained_on(data_yaml)
    assert Path(config["path"]).resolve().is_relative_to(on_volume.resolve())
    assert "reused from the volume" in stage_on(orch, spec)[1]  # the record made again at home
    run_orch("down", "box", check=0)


# -- placement and relaunch ------------------------------------------------------------------------
def test_a_dry_run_says_the_plan_goes_where_the_volume_lives(orch_home):
    make("data")
    out = run_orch("run", "t", "--cpu", "--volume", "data:~/d", "--dry-run", "--", "true", check=0).stdout
    assert "only where the volume data lives on local (this machine)" in out
    assert open_orch().ledger.jobs() == [] and local_billing(orch_home) == set()


def test_offers_are_ranked_only_where_the_volume_lives(orch_home):
    from orchestrator.money import offers
    from orchestrator.provider.model import Offer, Volume
    from providers.local import LocalProvider

    local = LocalProvider({}, orch_home)
    here = Volume(name="data", provider="local", volume_id="x", where="this machine", size_gb=1)
    elsewhere = Offer(provider="runpod", offer_id="NVIDIA A100", gpu_name="A100", gpus=1, vram_gb=80, price_hr=1.0)
    mine = Offer(provider="local", offer_id="local", gpu_name="A100", gpus=1, vram_gb=80, price_hr=0.0)
    assert offers._reaches(local, mine, (here,)) and not offers._reaches(local, elsewhere, (here,))
    assert not offers._reaches(None, elsewhere, (here,)) and offers._reaches(None, elsewhere, ())


def test_a_lost_job_is_relaunched_where_its_volume_is_and_finds_what_it_wrote(orch_home):
    from providers.local import LocalProvider

    make("data")
    script = ('if [ -f "$ORCH_VOLUME_DATA/first" ]; then echo "found $(cat "$ORCH_VOLUME_DATA/first")"; '
              'else echo "$ORCH_INSTANCE_ID" > "$ORCH_VOLUME_DATA/first"; sleep 300; fi')
    run_orch("run", "lost", "--cpu", "--volume", "data:~/v", "--", "bash", "-c", script, check=0)
    first = orch_home / "volumes" / "data" / "first"
    wait_for(first.is_file, 60, "attempt 1 writing on the volume")
    label = next(iter(local_billing(orch_home)))
    LocalProvider({}, orch_home).destroy(label)  # the machine is lost under the job

    job = job_json("lost")  # one look: the loss, then attempt 2 on a new instance where the volume is
    wait_for(lambda: job_json("lost")["state"] in ("completed", "failed"), 60, "the job to end")
    job = job_json("lost")
    assert job["state"] == "completed" and [a["instance"] for a in job["attempts"]] == ["lost-a1", "lost-a2"]
    assert "only where the volume data lives on local" in job["plan"]["line"]
    log = (orch_home / "runs" / "lost" / "train.log").read_text()
    assert f"found {first.read_text().strip()}" in log


def test_a_relaunch_whose_volume_is_gone_fails_with_one_line(orch_home):
    from orchestrator.volumes import volume_mounts
    from orchestrator.errors import UsageError
    from orchestrator.provider import Request

    with pytest.raises(UsageError, match=r"unknown volume 'gone'.*orch volume create gone"):
        volume_mounts.narrow(open_orch(), Request(name="x", cpu=True), [{"name": "gone", "path": "~/x"}], 1, None)


# -- groups ----------------------------------------------------------------------------------------
def test_a_group_mounts_one_volume_per_node_and_one_shared(orch_home):
    for name in ("own-0", "own-1", "shared"):
        make(name)
    assert "unknown volume 'own-2'" in run_orch("up", "g3", "--nodes", 3, "--cpu", "--volume", "own:~/own:per-node",
                                                check=2).stderr
    run_orch("up", "g", "--nodes", 2, "--cpu", "--volume", "own:~/own:per-node", "--volume", "shared:~/shared", check=0)
    fleet = {i["name"]: sorted(v["volume"] for v in i["volumes"])
             for i in json.loads(run_orch("status", "--json", check=0).stdout)}
    assert fleet == {"g-0": ["own-0", "shared"], "g-1": ["own-1", "shared"]}
    homes = {p.name.split("-", 2)[2]: p / "home"
             for p in (orch_home / "local").iterdir()}
    assert {n: os.readlink(h / "own") for n, h in homes.items()} == {
        "g-0": str(orch_home / "volumes" / "own-0"), "g-1": str(orch_home / "volumes" / "own-1")}
    assert {os.readlink(h / "shared") for h in homes.values()} == {str(orch_home / "volumes" / "shared")}
    run_orch("down", "g", check=0)
    assert local_billing(orch_home) == set() and set(volumes()) == {"own-0", "own-1", "shared"}


# -- money: the reaper reports, reconcile adopts ---------------------------------------------------
def test_the_reaper_reports_an_idle_volume_once_with_a_webhook_and_never_deletes_it(orch_home):
    hook = Hook()
    try:
        configure(orch_home, volume_idle_days=0)
        with open(orch_home / "config.toml", "a") as f:
            f.write(f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["volume"]\n')
        make("idle")
        for _ in range(2):
            out = run_orch("reap", check=0).stdout
            assert "idle" in out and "report" in out and "orch volume rm idle" in out
        wait_for(lambda: hook.texts(), 10, "the webhook post")
        assert len(hook.texts()) == 1 and "volume idle unattached" in hook.texts()[0]  # once per idle stretch
        assert volumes()["idle"]["state"] == "ready" and (orch_home / "volumes" / "idle").is_dir()
        assert ("ready", "ready", "reaper") in volume_events("idle")
    finally:
        hook.close()


def test_reconcile_adopts_a_tagged_volume_and_settles_a_create_left_halfway(orch_home):
    from providers.local import LocalProvider

    LocalProvider({}, orch_home).create_volume("stray", 3, None)  # made at the provider, never recorded
    run_orch("volume", "create", "half", "--provider", "local", "--size", 2, env={"ORCH_TEST_KILL_AT": "volume-created"})
    assert volumes()["half"]["state"] == "creating"
    out = run_orch("reconcile", check=0).stdout
    assert "stray: adopted from local" in out and "half: creating -> ready" in out
    found = volumes()
    assert (found["stray"]["state"], found["stray"]["size_gb"], found["half"]["state"]) == ("ready", 3, "ready")
    assert volume_events("stray") == [(None, "ready", "reconcile")]
    assert "in step" in run_orch("reconcile", check=0).stdout and "volumes" not in run_orch("reconcile", check=0).stdout
