"""Datasets: validate, pack, extract elsewhere, size the disk, and the Hugging Face round trip."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from orchestrator.tasks import dataset, hub
from orchestrator.errors import OrchError, UsageError
from tests.fakes.hf_hub import FakeHub

HAS_LIBREYOLO = importlib.util.find_spec("libreyolo") is not None
LIBREYOLO = Path(sys.executable).parent / "libreyolo"


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    return dataset.synth(tmp_path / "birds")


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch):
    with FakeHub(tmp_path) as h:
        h.patch_client(monkeypatch)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "controller-hf-home"))
        yield h


@pytest.fixture
def argvs(monkeypatch) -> list[list[str]]:
    """The argv of every process started from here on (still started for real)."""
    seen: list[list[str]] = []
    real = subprocess.Popen

    class Recording(real):
        def __init__(self, args, *a, **kw):
            seen.append([str(x) for x in (args if isinstance(args, (list, tuple)) else [args])])
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    return seen


def _label_lines(root: Path) -> int:
    return sum(len(p.read_text().split("\n")) - 1 for p in root.glob("labels/*/*.txt"))


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


ON_INSTANCE = Path(__file__).resolve().parent.parent / "playbooks" / "on_instance"


def _run_on_instance(name: str, *args: str, env: dict | None = None, no_site: bool = False,
                     cwd: Path | None = None) -> subprocess.CompletedProcess:
    """An on_instance script run the way the instance runs it: copied to a folder of its own with
    its siblings, by a Python that may lack site-packages (-S: no PyYAML)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="orch-bin-") as tmp:
        bin_dir = Path(tmp)
        for f in ON_INSTANCE.glob("*.py"):
            shutil.copy(f, bin_dir / f.name)
        cmd = [sys.executable, *(["-S"] if no_site else []), str(bin_dir / name), *map(str, args)]
        return subprocess.run(cmd, text=True, capture_output=True, env=env, timeout=120)


def _result(out: subprocess.CompletedProcess) -> dict:
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ORCH_RESULT "), out.stdout
    return json.loads(line[len("ORCH_RESULT "):])


# -- validate -----------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_LIBREYOLO, reason="libreyolo doctor runs only where LibreYOLO is installed")
def test_validate_accepts_the_synthetic_dataset_and_doctor_agrees(ds):
    info = dataset.validate(ds, imgsz=64)
    assert info.root == ds.resolve() and info.yaml_path == (ds / "data.yaml").resolve()
    assert (info.nc, info.names) == (2, ("class0", "class1"))
    assert info.n_images == {"train": 8, "val": 4}
    assert info.n_labels == _label_lines(ds) > 0
    assert info.bytes == sum(p.stat().st_size for p in ds.rglob("*") if p.suffix in (".png", ".txt"))
    assert dataset.validate(ds / "data.yaml", doctor=False) == info


def _set_yaml(ds: Path, **changes) -> None:
    config = yaml.safe_load((ds / "data.yaml").read_text())
    config.update(changes)
    (ds / "data.yaml").write_text(yaml.safe_dump({k: v for k, v in config.items() if v is not None}))


def _append_label(ds: Path, line: str) -> None:
    with (ds / "labels" / "train" / "0003.txt").open("a") as f:
        f.write(line + "\n")


@pytest.mark.parametrize(
    "break_it, expected",
    [
        (lambda ds: (ds / "data.yaml").unlink(), "no data.yaml in"),
        (lambda ds: shutil.rmtree(ds), "dataset not found"),
        (lambda ds: (ds / "data.yaml").write_text("train: [images/train\nval: x\n"), "is not valid YAML"),
        (lambda ds: (ds / "data.yaml").write_text("- train\n- val\n"), "is not a YAML mapping"),
        (lambda ds: _set_yaml(ds, val="images/nope"), "images/nope does not exist"),
        (lambda ds: _set_yaml(ds, train=None), "no 'train' split"),
        (lambda ds: _set_yaml(ds, nc=3), "nc=3 but 'names' has 2 classes"),
        (lambda ds: _set_yaml(ds, names=None), "'names' is missing"),
        (lambda ds: _set_yaml(ds, names={0: "a", 2: "b"}, nc=None), "no gaps"),
        (lambda ds: [p.unlink() for p in (ds / "images" / "val").iterdir()], "val: no images"),
        (lambda ds: _append_label(ds, "2 0.5 0.5 0.1 0.1"), "0003.txt:"),
        (lambda ds: _append_label(ds, "2 0.5 0.5 0.1 0.1"), "class 2 out of range [0, 2)"),
        (lambda ds: _append_label(ds, "0 1.5 0.5 0.1 0.1"), "coordinate 1.5 outside [0, 1]"),
        (lambda ds: _append_label(ds, "0 0.5 0.5 0.1"), "got 4 fields"),
        (lambda ds: _append_label(ds, "cat 0.5 0.5 0.1 0.1"), "expected numbers"),
    ],
)
def test_validate_refuses_with_one_line(ds, break_it, expected):
    break_it(ds)
    with pytest.raises(UsageError) as e:
        dataset.validate(ds)
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


def test_validate_accepts_dict_names_and_segments(ds):
    _set_yaml(ds, names={0: "a", 1: "b"})
    _append_label(ds, "1 0.1 0.1 0.9 0.1 0.5 0.9")  # a triangle
    info = dataset.validate(ds, doctor=False)
    assert info.names == ("a", "b") and info.n_labels == _label_lines(ds)


@pytest.mark.skipif(not HAS_LIBREYOLO, reason="libreyolo doctor runs only where LibreYOLO is installed")
def test_libreyolo_doctor_errors_become_usage_errors(ds):
    # orch's own checks read labels, not pixels: a broken image is for the doctor to find.
    (ds / "images" / "train" / "0002.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    dataset.validate(ds, doctor=False)
    with pytest.raises(UsageError) as e:
        dataset.validate(ds, imgsz=64)
    assert str(e.value).startswith("libreyolo doctor: ") and "0002.png" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not HAS_LIBREYOLO, reason="libreyolo doctor runs only where LibreYOLO is installed")
def test_the_doctor_checks_a_datasets_bytes_once_and_never_remembers_a_failure(ds, tmp_path, monkeypatch):
    """What `orch run` does with local data: the doctor's pass is kept per packed content (in the
    user's cache folder), so an unchanged dataset is not checked again; changed bytes are, and a
    dataset the doctor refuses leaves no verdict and no packed tar."""
    from orchestrator.runs import training

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    home = tmp_path / "orch"

    def prepare() -> list[str]:
        said: list[str] = []
        training.prepare(training.TrainSpec(data=str(ds), imgsz=64), home, said.append)
        return [m for m in said if "doctor" in m]

    # Two at once on the same bytes (the jobs of a sweep, started together): one doctor runs, the
    # other waits for its verdict. Threads, each with its own lock file: as two orch processes.
    import threading

    from orchestrator import config

    info = dataset.validate(ds, doctor=False)
    whole = hashlib.sha256(dataset.pack(info, tmp_path / "packed.tar").read_bytes()).hexdigest()
    said: list[list[str]] = [[], []]
    both = [threading.Thread(target=dataset.doctor, args=(info, 64, whole, config.cache_home() / "doctor", s.append))
            for s in said]
    for t in both:
        t.start()
    for t in both:
        t.join(timeout=600)
    ran = [s for s in said if any("libreyolo doctor checks 12 images" in m for m in s)]
    assert len(ran) == 1, said
    waited = next(s for s in said if s is not ran[0])
    assert any("not run again" in m for m in waited), waited
    assert len(list((tmp_path / "xdg" / "orch" / "doctor").glob("*.passed"))) == 1
    again = prepare()  # `orch run`'s own packing: the same digest
    assert again and all("not run again" in m for m in again), again
    tars = set((home / "cache").glob("*.tar"))
    assert len(tars) == 1
    (ds / "images" / "train" / "0002.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")  # other bytes now
    with pytest.raises(UsageError, match="^libreyolo doctor: .*0002.png"):
        prepare()
    assert len(list((tmp_path / "xdg" / "orch" / "doctor").glob("*.passed"))) == 1, "a failure is remembered"
    assert set((home / "cache").glob("*.tar")) == tars and not list((home / "cache").glob("pack-*")), \
        "the refused data left a tar in the cache"


def _scattered_dataset(tmp_path: Path) -> Path:
    """A yaml outside the data, with a relative ``path:``, a list split and a .txt split."""
    data = dataset.synth(tmp_path / "project" / "data" / "cars", n_train=6, n_val=3)
    (data / "data.yaml").unlink()
    for kind, ext in (("images", "png"), ("labels", "txt")):
        (data / kind / "extra").mkdir()
        shutil.move(data / kind / "train" / f"0005.{ext}", data / kind / "extra" / f"0005.{ext}")
    lst = data / "lists" / "val.txt"
    lst.parent.mkdir()
    lst.write_text("# val images\n../images/val/0000.png\n../images/val/0001.png\n\n../images/val/0002.png\n")
    cfg = tmp_path / "project" / "cars.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"path": "data/cars", "train": ["images/train", "images/extra"], "val": "lists/val.txt", "names": ["a", "b"]}
        )
    )
    return cfg


def test_validate_resolves_path_lists_and_txt(tmp_path):
    info = dataset.validate(_scattered_dataset(tmp_path), doctor=False)
    assert info.root == (tmp_path / "project" / "data" / "cars").resolve()
    assert info.n_images == {"train": 6, "val": 3} and info.nc == 2
    assert info.name == "cars"


# -- pack and extract ---------------------------------------------------------------------------


def test_pack_is_deterministic_and_its_yaml_works_anywhere(ds, tmp_path):
    info = dataset.validate(ds, doctor=False)
    first = dataset.pack(info, tmp_path / "a" / "birds.tar")
    for p in ds.rglob("*"):
        os.utime(p, (1_000_000, 1_000_000))  # what a fresh checkout or copy does to mtimes
    second = dataset.pack(dataset.validate(ds, doctor=False), tmp_path / "b" / "birds.tar")
    assert _sha256(first) == _sha256(second)

    with tarfile.open(first) as tar:
        names = tar.getnames()
        packed_yaml = tar.extractfile("birds/data.yaml").read().decode()
    assert names == sorted(names) and all(n.startswith("birds/") for n in names)
    assert str(ds) not in packed_yaml and "path" not in json.loads(packed_yaml)

    # The original goes away; the extracted copy must stand on its own. -S: no site-packages (no PyYAML).
    shutil.move(ds, tmp_path / "gone")
    out = _run_on_instance("extract.py", first, tmp_path / "instance" / "data", no_site=True)
    assert out.returncode == 0, out.stderr
    data_yaml = Path(_result(out)["data_yaml"])
    assert data_yaml == tmp_path / "instance" / "data" / "birds" / "data.yaml"
    assert yaml.safe_load(data_yaml.read_text())["path"] == str(data_yaml.parent)
    again = dataset.validate(data_yaml, doctor=False)
    assert (again.n_images, again.n_labels, again.names) == (info.n_images, info.n_labels, info.names)


def test_pack_rewrites_lists_and_scattered_paths(tmp_path):
    info = dataset.validate(_scattered_dataset(tmp_path), doctor=False)
    tar = dataset.pack(info, tmp_path / "cars.tar")
    shutil.rmtree(tmp_path / "project")
    out = _run_on_instance("extract.py", tar, tmp_path / "elsewhere", no_site=True)
    assert out.returncode == 0, out.stderr
    again = dataset.validate(Path(_result(out)["data_yaml"]), doctor=False)
    assert again.n_images == {"train": 6, "val": 3} and again.n_labels == info.n_labels


def test_extract_takes_a_tar_made_by_hand_as_the_seed_shows(ds, tmp_path):
    # tar cf birds.tar ./birds/  -- with the yaml still in block YAML and pointing at the laptop
    (ds / "data.yaml").write_text("path: /home/someone/birds  # laptop\n" + (ds / "data.yaml").read_text())
    with tarfile.open(tmp_path / "birds.tar", "w") as tar:
        tar.add(ds, arcname="./birds")
    shutil.move(ds, tmp_path / "gone")
    out = _run_on_instance("extract.py", tmp_path / "birds.tar", tmp_path / "dest", no_site=True)
    assert out.returncode == 0, out.stderr
    info = dataset.validate(Path(_result(out)["data_yaml"]), doctor=False)
    assert info.root == tmp_path / "dest" / "birds" and info.n_images == {"train": 8, "val": 4}


def test_pack_refuses_files_outside_the_dataset_folder(ds, tmp_path):
    outside = tmp_path / "outside" / "images"
    outside.mkdir(parents=True)
    shutil.copy(ds / "images" / "val" / "0000.png", outside / "x.png")
    _set_yaml(ds, val=["images/val", str(outside)])
    info = dataset.validate(ds, doctor=False)
    with pytest.raises(UsageError, match="outside the dataset folder"):
        dataset.pack(info, tmp_path / "t.tar")


@pytest.mark.parametrize("evil", ["../escaped.txt", "/tmp/absolute.txt", "birds/link"])
def test_extract_refuses_unsafe_members(tmp_path, evil):
    tar_path = tmp_path / "evil.tar"
    with tarfile.open(tar_path, "w") as tar:
        ti = tarfile.TarInfo("birds/data.yaml")
        ti.size = 2
        tar.addfile(ti, io.BytesIO(b"{}"))
        ti = tarfile.TarInfo(evil)
        if evil.endswith("link"):
            ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(ti)
        else:
            ti.size = 4
            tar.addfile(ti, io.BytesIO(b"evil"))
    out = _run_on_instance("extract.py", tar_path, tmp_path / "dest")
    assert out.returncode != 0 and "refusing unsafe member" in out.stderr
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "dest" / "birds").exists()


# -- disk size ----------------------------------------------------------------------------------


def test_suggest_disk_gb_adds_data_checkpoints_environment_and_margin():
    # 2 × 5 GB data + 12 × 35 MB (yolo9-t: best, last, 100/10 snapshots) + 15 GB = 25.42 GB; × 1.3 = 33.05
    gb, why = dataset.suggest_disk_gb(5 * 10**9, "yolo9-t", 100, 10)
    assert gb == 34
    assert "10.00 GB data" in why and "12 × 35 MB" in why and "15 GB environment" in why and "\n" not in why
    # 1.3 × 10 is 13.000000000000002 in floating point: it must still round up to 13, not 14.
    assert dataset.suggest_disk_gb(0, "mystery-net", 0, 10, base_gb=9)[0] == 13  # 2 × 500 MB assumed + 9
    # libreyolo train's defaults (yolox-s, 300 epochs, save_period 10) when nothing is said.
    assert dataset.suggest_disk_gb(0, None, None, None) == dataset.suggest_disk_gb(0, "yolox-s", 300, 10)
    assert dataset.suggest_disk_gb(10**9, "rfdetr-l", 300, 10)[0] > dataset.suggest_disk_gb(10**9, "yolo9-t", 300, 10)[0]
    assert dataset.suggest_disk_gb(10**9, "yolo9-t", 300, 0)[0] < dataset.suggest_disk_gb(10**9, "yolo9-t", 300, 10)[0]
    assert dataset.checkpoint_mb("LibreYOLO9t.pt") == dataset.checkpoint_mb("yolo9-t")


# -- Hugging Face -------------------------------------------------------------------------------


def test_parse_hf():
    assert hub.parse_hf("hf://acme/birds/birds.tar") == ("acme/birds", "birds.tar")
    assert hub.parse_hf("hf://acme/birds/v2/birds.tar") == ("acme/birds", "v2/birds.tar")
    for bad in ("acme/birds/birds.tar", "hf://acme/birds.tar", "hf://acme/birds/", "hf://a/b/../x.tar", "s3://a/b/c"):
        with pytest.raises(UsageError, match="hf://ORG/REPO/FILE.tar"):
            hub.parse_hf(bad)


def test_push_then_download_on_the_instance(ds, tmp_path, fake_hub, argvs, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # no verdict from another test
    info = dataset.validate(ds, doctor=False)
    uri = hub.push_dataset(ds, "acme/birds", token=fake_hub.token)
    assert uri == "hf://acme/birds/birds.tar"
    assert "libreyolo doctor checks 12 images" in capsys.readouterr().err
    # Pushed again (or trained on with `orch run`): the doctor's pass on these bytes holds.
    assert hub.push_dataset(ds, "acme/birds", token=fake_hub.token) == uri
    assert "not run again" in capsys.readouterr().err
    assert fake_hub.repos[("dataset", "acme/birds")].private
    assert fake_hub.file_bytes("dataset", "acme/birds", "birds.tar") == dataset.pack(info, tmp_path / "p.tar").read_bytes()

    repo_id, filename = hub.parse_hf(uri)
    assert hub.dataset_size(uri) == (tmp_path / "p.tar").stat().st_size, "the disk is sized from the hub's metadata"
    env = {**os.environ, **fake_hub.env, "HF_HOME": str(tmp_path / "instance" / "hf-home")}
    out = _run_on_instance("hf_download.py", repo_id, filename, tmp_path / "instance" / "data", env=env)
    assert out.returncode == 0, out.stderr
    data_yaml = Path(_result(out)["data_yaml"])
    assert data_yaml.is_relative_to(tmp_path / "instance" / "data")
    got = dataset.validate(data_yaml, doctor=False)
    assert (got.n_images, got.n_labels) == (info.n_images, info.n_labels)
    assert any((tmp_path / "instance" / "hf-home").rglob("birds.tar")), "HF_HOME from the environment holds the cache"

    # The token went in headers, and nowhere else.
    token = fake_hub.token
    assert all(token not in r.path for r in fake_hub.requests)
    assert all(token not in arg for argv in argvs for arg in argv)
    to_repo = [r for r in fake_hub.requests if "acme/birds" in r.path]
    assert to_repo and all(r.headers.get("authorization") == f"Bearer {token}" for r in to_repo)
    downloads = [r for r in fake_hub.requests if "/resolve/" in r.path]
    assert {r.method for r in downloads} == {"HEAD", "GET"}

    # The repo is private: the same script without the token is refused.
    anonymous = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    anonymous["HF_HOME"] = str(tmp_path / "stranger-hf-home")
    refused = _run_on_instance("hf_download.py", repo_id, filename, tmp_path / "instance" / "data2", env=anonymous)
    assert refused.returncode != 0 and "RepositoryNotFound" in refused.stderr


def test_pushing_the_same_dataset_again_uploads_nothing(ds, fake_hub):
    hub.push_dataset(ds, "acme/birds", token=fake_hub.token, doctor=False)
    puts = sum(r.method == "PUT" for r in fake_hub.requests)
    assert hub.push_dataset(ds, "acme/birds", token=fake_hub.token, doctor=False) == "hf://acme/birds/birds.tar"
    assert sum(r.method == "PUT" for r in fake_hub.requests) == puts == 1
    assert len(fake_hub.repos[("dataset", "acme/birds")].commits) == 1


def test_push_with_a_bad_token_is_a_clear_error(ds, fake_hub):
    with pytest.raises(OrchError, match="Hugging Face refused the dataset upload to acme/birds") as e:
        hub.push_dataset(ds, "acme/birds", token="hf_wrong", doctor=False)
    assert "hf_wrong" not in str(e.value)


def test_hub_without_huggingface_hub_says_how_to_install(ds, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # what a missing package looks like to import
    with pytest.raises(OrchError, match=r"pip install 'orch-gpu\[hf\]'"):
        hub.push_dataset(ds, "acme/birds", token="x")


# -- real trainings -----------------------------------------------------------------------------


@pytest.mark.training
@pytest.mark.skipif(not LIBREYOLO.exists(), reason="needs the libreyolo CLI (the local extra)")
def test_synthetic_dataset_trains_with_the_libreyolo_cli(tiny_run):
    """orch's synthetic dataset is one LibreYOLO's own CLI trains on (``tiny_run``: its ``train``,
    one epoch at 64 px)."""
    assert json.loads((tiny_run / "status.json").read_text())["state"] == "completed"
    assert (tiny_run / "weights" / "best.pt").stat().st_size > 1_000_000


_TRAIN_WITH_CALLBACK = """
import pickle
from libreyolo.models.yolo9.model import LibreYOLO9
from hub_push import OrchHubPush

orch_hub_push = OrchHubPush("acme/birds-run")

if __name__ == "__main__":
    pickle.dumps(orch_hub_push)  # what LibreYOLO needs of a callback to hand it to multi-GPU workers
    model = LibreYOLO9(None, size="t", device="cpu")  # random weights: no download
    model.train(data={data!r}, epochs=2, batch=4, imgsz=64, device="cpu", workers=0, eval_interval=1,
                save_period=1, project={project!r}, name="cb", callbacks=[orch_hub_push])
"""


@pytest.mark.training
@pytest.mark.skipif(not HAS_LIBREYOLO, reason="needs LibreYOLO (the local extra)")
def test_upload_callback_pushes_weights_during_a_real_training(ds, tmp_path, fake_hub):
    bin_dir = tmp_path / "instance" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(ON_INSTANCE / "hub_push.py", bin_dir / "hub_push.py")
    entry = bin_dir / "train_entry.py"
    entry.write_text(_TRAIN_WITH_CALLBACK.format(data=str(ds / "data.yaml"), project=str(tmp_path / "runs")))
    env = {**os.environ, **fake_hub.env, "HF_HOME": str(tmp_path / "instance-hf-home")}
    out = subprocess.run([sys.executable, str(entry)], text=True, capture_output=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "upload of" not in out.stderr, out.stderr[-3000:]

    repo = fake_hub.repos[("model", "acme/birds-run")]
    assert repo.private
    assert {"weights/epoch_1.pt", "weights/epoch_2.pt", "weights/best.pt", "weights/last.pt"} <= set(repo.files)
    assert "train_config.yaml" in repo.files
    weights = tmp_path / "runs" / "cb" / "weights"
    for name in ("epoch_1.pt", "epoch_2.pt", "best.pt", "last.pt"):
        assert fake_hub.file_bytes("model", "acme/birds-run", f"weights/{name}") == (weights / name).read_bytes()
