"""The checkpoint check reads the archive torch reads (issue 42, item 1).

Three ``last.pt`` files a hostile machine served were called resumable (``loads: true``, the right
epoch) while ``torch.load(weights_only=False)`` ran code from them, because Python's ``zipfile``
and torch's reader (miniz) read two different archives out of one file. Each is made here the way
the red team made it, shown live (torch runs its payload), and refused by every check orch runs
(on the instance, at home, in the exported Modal/Beam file) without running it; a plain
``torch.save`` checkpoint still passes and loads.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import warnings
import zipfile
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path

import pytest

from tests.conftest import needs_torch, on_instance

pytestmark = needs_torch
checkpoint = on_instance("checkpoint")  # the script as the instance runs it
HOSTILE = ("second pickle", "two directories", "torchscript")


class _Payload:
    """Whatever unpickles it creates ``mark`` (``eval``: what a pickle may call)."""

    def __init__(self, mark):
        self.mark = str(mark)

    def __reduce__(self):
        return eval, (f"open({self.mark!r}, 'w').close()",)


def _save(path: Path, extra=None) -> bytes:
    import torch

    obj = {"epoch": 2, "model": OrderedDict(w=torch.ones(3)), "best_metric": 0.5}
    if extra is not None:
        obj["x"] = extra
    torch.save(obj, path)
    return path.read_bytes()


def _directory(data: bytes) -> tuple[int, int, int]:
    """(records, central directory size, its offset) from an archive's end record."""
    end = data.rindex(b"PK\x05\x06")
    return struct.unpack_from("<HLL", data, end + 10)


def _shift(directory: bytes, by: int) -> bytes:
    """A central directory whose records' local header offsets are moved by ``by``."""
    out, at = bytearray(directory), 0
    while at < len(out):
        name_len, extra_len, comment_len = struct.unpack_from("<3H", out, at + 28)
        struct.pack_into("<L", out, at + 42, struct.unpack_from("<L", out, at + 42)[0] + by)
        at += 46 + name_len + extra_len + comment_len
    return bytes(out)


def second_pickle(path: Path, mark: Path) -> None:
    """(a) torch's own archive plus ``last/Data.pkl``, a pickle that runs the payload: zipfile matches
    names case-sensitively and reads ``data.pkl``; miniz, blind to case, finds ``Data.pkl``."""
    plain = path.with_name("plain-a.pt")
    _save(plain)
    evil = pickle.dumps({"epoch": 2, "x": _Payload(mark)}, protocol=2)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w") as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
            if info.filename.endswith("/data.pkl"):  # right after it: miniz's sorted lookup then lands on it
                out.writestr(info.filename[:-8] + "Data.pkl", evil)
    plain.unlink()


def two_directories(path: Path, mark: Path) -> None:
    """(b) two archives in one file and two central directories: zipfile reads the one just before the
    end record (taking the difference for prepended bytes), miniz the one at the offset the end record
    states. Both archives hold the same names, so the two directories are the same size."""
    benign = _save(path.with_name("plain-b.pt"))
    hostile = _save(path.with_name("plain-b.pt"), _Payload(mark))
    path.with_name("plain-b.pt").unlink()
    n, size, at = _directory(hostile)
    hostile_records, hostile_dir = hostile[:at], hostile[at:at + size]
    m, size_b, at_b = _directory(benign)
    benign_records, benign_dir = benign[:at_b], benign[at_b:at_b + size_b]
    assert (n, len(hostile_dir)) == (m, len(benign_dir)) and len(hostile_records) > len(hostile_dir)
    # zipfile adds the "concat" (here the hostile directory's length) to every offset it reads.
    benign_dir = _shift(benign_dir, len(hostile_records) - len(hostile_dir))
    body = hostile_records + benign_records + hostile_dir + benign_dir
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(benign_dir),
                      len(hostile_records) + len(benign_records), 0)
    path.write_bytes(body + end)


_SCRIPTED = textwrap.dedent('''
    import sys
    from typing import Tuple

    import torch


    class Writes(torch.nn.Module):
        """Its __setstate__ runs when torch.jit.load rebuilds it: torch.from_file(..., shared=True) makes the file."""

        def __init__(self, path: str):
            super().__init__()
            self.path = path
            self.t = torch.zeros(1)

        @torch.jit.export
        def __getstate__(self) -> Tuple[str, bool]:
            return (self.path, self.training)

        @torch.jit.export
        def __setstate__(self, state: Tuple[str, bool]) -> None:
            self.path = state[0]
            self.training = state[1]
            self.t = torch.from_file(self.path, True, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x


    torch.jit.save(torch.jit.script(Writes(sys.argv[1])), sys.argv[2])
''')


def torchscript(path: Path, mark: Path) -> None:
    """(c) a TorchScript archive (``constants.pkl`` and ``code/``) whose ``data.pkl`` is a plain epoch
    dict: torch.load hands it to torch.jit.load, which rebuilds the class named in constants.pkl and
    runs its __setstate__ from code/."""
    scripted, source = path.with_name("scripted.pt"), path.with_name("scripted_source.py")
    source.write_text(_SCRIPTED)  # TorchScript compiles a class from its source file
    subprocess.run([sys.executable, "-W", "ignore", str(source), str(mark), str(scripted)], check=True, timeout=300)
    assert not mark.exists()
    with zipfile.ZipFile(scripted) as src, zipfile.ZipFile(path, "w") as out:
        folder = src.namelist()[0].split("/")[0]
        for info in src.infolist():
            data = src.read(info)
            if info.filename == f"{folder}/constants.pkl":
                data = src.read(f"{folder}/data.pkl")  # the object whose __setstate__ writes the file
            elif info.filename == f"{folder}/data.pkl":
                data = pickle.dumps({"epoch": 2}, protocol=2)
            out.writestr(info.filename, data)
    scripted.unlink()
    source.unlink()


MAKERS = {"second pickle": second_pickle, "two directories": two_directories, "torchscript": torchscript}
SAYS = {"second pickle": "blind to case", "two directories": "central directory is not where",
        "torchscript": "TorchScript"}


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """{name: (path, the file its payload would create)} for the three, and a plain torch.save checkpoint."""
    root = tmp_path_factory.mktemp("archives")
    made = {}
    for name, make in MAKERS.items():
        folder = root / name.replace(" ", "-")
        folder.mkdir()
        path, mark = folder / "last.pt", folder / "ran"
        make(path, mark)
        made[name] = (path, mark)
    plain = root / "plain" / "last.pt"
    plain.parent.mkdir()
    _save(plain)
    made["plain"] = (plain, None)
    return made


def _as_the_instance_runs_it(path: Path) -> dict:
    out = subprocess.run([sys.executable, checkpoint.__file__, str(path)], capture_output=True, text=True,
                         timeout=120).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("ORCH_RESULT "))[12:])


@pytest.mark.parametrize("name", HOSTILE)
def test_each_hostile_archive_is_refused_by_every_check_and_runs_nothing(archives, name):
    import torch

    from orchestrator.runs import checkpoint_vet
    from orchestrator.errors import UsageError

    path, mark = archives[name]
    got = checkpoint.check(str(path))
    assert not got["loads"] and got["epoch"] is None and SAYS[name] in got["error"], got
    there = _as_the_instance_runs_it(path)
    assert not there["loads"] and SAYS[name] in there["error"], there
    held, why = checkpoint_vet.vet(path)  # at home, before a copy is kept or uploaded
    assert held is None and SAYS[name] in why, why
    with pytest.raises(UsageError, match="not resumable"):
        checkpoint_vet.refuse_unsafe(path)  # `orch run --resume`, `orch up --resume`
    assert not mark.exists(), "a check ran the payload"
    # What orch loads itself is loaded with weights_only=True: refused there too, and nothing runs.
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)
    assert not mark.exists()
    # The file is live: what LibreYOLO's resume (weights_only=False) would have done with it.
    with warnings.catch_warnings(), pytest.raises(Exception) if name == "torchscript" else nullcontext():
        warnings.simplefilter("ignore")
        torch.load(path, weights_only=False)  # TorchScript: the object is rebuilt, then torch fails on it
    assert mark.exists(), f"{name}: the fixture is not hostile"
    mark.unlink()


@pytest.mark.parametrize("name", ["second pickle", "two directories"])
def test_python_s_zipfile_alone_sees_a_plain_checkpoint_in_them(archives, name):
    """Why the check cannot lean on zipfile: it reads the benign pickle where torch reads the other."""
    path, _ = archives[name]
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    assert checkpoint.refused_global(data) is None


def test_a_plain_torch_save_checkpoint_passes_every_check_and_loads(archives):
    import torch

    from orchestrator.runs import checkpoint_vet

    path, _ = archives["plain"]
    assert checkpoint.check(str(path))["loads"] and checkpoint.check(str(path))["epoch"] == 3
    assert _as_the_instance_runs_it(path)["loads"]
    assert checkpoint_vet.vet(path) == (3, None)
    checkpoint_vet.refuse_unsafe(path)
    assert torch.load(path, weights_only=True)["epoch"] == 2


@pytest.mark.parametrize("change, says", [
    (lambda d: b"PK\x03\x04" + bytes(12) + d, "not where"),  # bytes before the archive: zipfile shifts past them
    (lambda d: d + b"tail", "end record"),  # bytes after the end record
    (lambda d: d.replace(b"last/byteorder", b"last/Byteorder", 1), "local header"),  # the local header's name only
])
def test_an_archive_torch_and_zipfile_might_read_apart_is_refused(archives, tmp_path, change, says):
    path = tmp_path / "last.pt"
    plain = archives["plain"][0].read_bytes()
    assert plain.count(b"last/byteorder") == 2  # its local header and its directory entry
    path.write_bytes(change(plain))
    got = checkpoint.check(str(path))
    assert not got["loads"] and says in got["error"], got


# -- the exported Modal/Beam file carries the same check ------------------------------------------------
_EXPORTED = textwrap.dedent("""
    import importlib.util, json, sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("exported", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = {}
    for path in sys.argv[2:]:
        found = mod.check(path)
        weights = Path(path).parent
        out[path] = {"loads": found["loads"], "error": found["error"], "resumes_from": mod._epochs_done(weights)}
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.parametrize("platform", ["modal", "beam"])
def test_the_exported_file_refuses_them_and_resumes_from_a_plain_one(archives, tmp_path, platform):
    import importlib.util

    from tests.conftest import run_orch

    if importlib.util.find_spec(platform) is None:
        pytest.skip(f"needs the {platform} extra")
    app = tmp_path / f"app_{platform}.py"
    run_orch("export", platform, "birds", "--data", "hf://acme/birds/birds.tar", "--gpu", "T4", "--max-hours", "1",
             "-o", app, check=0)
    offline = {"BEAM_TOKEN": "dummy", "BETA9_GATEWAY_HOST": "127.0.0.1", "BETA9_GATEWAY_PORT": "9",
               "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": "9", "MODAL_SERVER_URL": "http://127.0.0.1:9",
               "CONFIG_PATH": str(tmp_path / "no-beam.ini")}
    paths = [str(archives[name][0]) for name in (*HOSTILE, "plain")]
    proc = subprocess.run([sys.executable, "-c", _EXPORTED, str(app), *paths], capture_output=True, text=True,
                          env={**os.environ, **offline}, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for name in HOSTILE:
        path, mark = archives[name]
        seen = got[str(path)]
        assert not seen["loads"] and SAYS[name] in seen["error"] and seen["resumes_from"] is None, (name, seen)
        assert not mark.exists()
    assert got[paths[-1]] == {"loads": True, "error": None, "resumes_from": 3}


# -- at home: a copy that fails the check is never the job's verified copy -------------------------------
def test_a_copy_that_fails_the_check_is_never_kept_nor_uploaded_and_the_attempt_starts_over(orch_home, archives):
    """The instance vouches for (a) (its Python answers checkpoint.py as it likes): the copy pulled home
    is checked again here and not kept. A kept copy changed at home into (b) is forgotten before it is
    uploaded, and the attempt starts over at epoch 1, saying why."""
    import shutil

    from orchestrator.jobs import resume_copy
    from orchestrator.jobs.record import checkpoint_dir
    from orchestrator.text import row_json as loads
    from tests.clouds import arrange, open_orch
    from tests.test_redteam import VOUCHES

    orch = open_orch()
    inst = arrange(orch, "vouch")
    work = next((orch_home / "local").glob("orch-*-vouch")) / "home" / "orch"
    run_dir = work / "runs" / "r1"
    (run_dir / "weights").mkdir(parents=True)
    shutil.copyfile(archives["second pickle"][0], run_dir / "weights" / "last.pt")
    (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n')
    liar = work / "bin" / "vouching-python"
    liar.parent.mkdir(parents=True, exist_ok=True)
    liar.write_text(VOUCHES.replace("$REAL_PYTHON", sys.executable))
    liar.chmod(0o755)
    (work / "python").write_text(f"{liar}\n")
    run = orch.ledger.add_run(instance_id=inst.id, model="yolo9-t", data="x", epochs=10, run_dir=str(run_dir), pid=1,
                              state="running")
    job = orch.ledger.create_job(("planned", "running"), name="jz", state="running", spec="{}")

    held, why = resume_copy.take(orch, job, inst, run)
    assert held is None and "not kept" in why and "blind to case" in why, why
    assert orch.ledger.get_job(job.id).checkpoint_epoch is None
    assert not list((orch_home / "jobs" / "jz").glob("ckpt-*")), "nothing of it is kept at home"

    copy = checkpoint_dir(orch.home, "jz", 3) / "weights" / "last.pt"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(archives["two directories"][0], copy)
    job = orch.ledger.update_job(job.id, checkpoint_epoch=3)
    assert resume_copy.stage(orch, job, [inst], None, 3) is None, "the attempt starts over"
    job = orch.ledger.get_job(job.id)
    assert job.checkpoint_epoch is None and not copy.exists()
    said = loads(job.history, [])[-1]["text"]
    assert "not uploaded" in said and "central directory" in said and "starts over at epoch 1" in said, said
    assert not (work / "job-resume-in").exists(), "nothing was uploaded"
    assert not any(mark.exists() for _, mark in archives.values() if mark is not None)


def test_a_copy_an_attempt_crashed_on_as_it_resumed_is_forgotten_and_a_lost_machine_keeps_it(orch_home):
    """A copy that passes every check and still crashes the training as it resumes would crash every
    later attempt too, until the retries ran out: forgotten after the first, the next starts over."""
    from orchestrator.jobs import resume_copy
    from orchestrator.jobs.record import checkpoint_dir
    from orchestrator.text import row_json as loads
    from tests.clouds import open_orch

    orch = open_orch()
    job = orch.ledger.create_job(("planned", "running"), name="jc", state="recovering", spec="{}", checkpoint_epoch=3)
    copy = checkpoint_dir(orch.home, "jc", 3)
    (copy / "weights").mkdir(parents=True)
    (copy / "weights" / "last.pt").write_bytes(b"kept")
    resumed = orch.ledger.add_attempt(job_id=job.id, number=2, instance_name="jc-a2", provider="local", start_epoch=4,
                                      state="lost")
    fresh = orch.ledger.add_attempt(job_id=job.id, number=3, instance_name="jc-a3", provider="local", start_epoch=1,
                                    state="lost")
    machine = orch.ledger.create_instance(name="jc-a4", provider="local", label="", cpu_only=True, gpus=0)
    trained = orch.ledger.add_run(instance_id=machine.id, model="yolo9-t", data="x", epochs=10, state="crashed",
                                  completed_epochs=2)
    went_on = orch.ledger.add_attempt(job_id=job.id, number=4, instance_name="jc-a4", provider="local", start_epoch=4,
                                      state="lost", run_id=trained.id)
    # A lost machine says nothing against the copy; nor does a crash of an attempt that did not resume
    # from it, nor one of a run that trained from it (killed in its third epoch).
    assert resume_copy.crashed_on(orch, job, resumed, "instance preempted (spot)").checkpoint_epoch == 3
    assert resume_copy.crashed_on(orch, job, fresh, "training crashed").checkpoint_epoch == 3
    assert resume_copy.crashed_on(orch, job, went_on, "training crashed").checkpoint_epoch == 3
    assert copy.is_dir()
    job = resume_copy.crashed_on(orch, job, resumed, "training crashed: UnpicklingError: Weights only load failed")
    assert job.checkpoint_epoch is None and not copy.exists()
    assert "starts over at epoch 1" in loads(job.history, [])[-1]["text"]


# -- bounded whatever the bytes say (issue 53, finding 3) ---------------------------------------------------
class _Allocates:
    """What the pickle asks the checker to build: ``bytearray(2**31)``, 2 GB on its say-so."""

    def __reduce__(self):
        return bytearray, (2 ** 31,)


def _as_torch_saves(path: Path, data: bytes) -> Path:
    """``data`` as the pickle of a checkpoint in torch's exact layout: written by ``torch.save`` itself,
    through a pickle module whose pickler writes these bytes."""
    import types

    import torch

    class Pickler:
        def __init__(self, out, protocol=None):
            self.out = out

        def dump(self, obj):
            self.out.write(data)

    torch.save(None, path, pickle_module=types.SimpleNamespace(Pickler=Pickler, __name__="raw"))
    return path


def _many_records(path: Path, n: int) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("last/data.pkl", pickle.dumps({"epoch": 0}, protocol=2))
        z.writestr("last/version", "3\n")
        for i in range(n):
            z.writestr(f"last/data/{i}", b"\0")
    return path


_MEASURED = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from orchestrator.runs import checkpoint_vet
    got = [checkpoint_vet.vet(Path(p)) for p in sys.argv[1:]]
    # This process's own peak (VmHWM: its ru_maxrss counts the test process it was forked from), its children's.
    own = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    peak = [own >> 10, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10]
    print("RESULT " + json.dumps({"got": got, "peak_mb": peak, "torch": "torch" in sys.modules}))
""")


def _vetted_at_home(*paths: Path) -> dict:
    """``checkpoint_vet.vet`` of each, as the controller runs it, and the peak memory (MB) of that process
    and of its children. The process may not take more than 1.5 GB: without bounds the check would take
    gigabytes (MemoryError then)."""
    import resource

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))

    proc = subprocess.run([sys.executable, "-c", _MEASURED, *map(str, paths)], capture_output=True, text=True,
                          timeout=300, preexec_fn=capped)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def test_a_checkpoint_that_asks_for_gigabytes_is_refused_in_megabytes(tmp_path):
    """Three small archives in torch's own layout, each passing the check on main while the checking
    process (the controller's own) took what the pickle asked: ``bytearray(2**31)`` (2 GB for a
    file of a kilobyte), one ``LONG_BINPUT`` of index 2**28 (the unpickler sizes its memo by it: 4 GB
    and 30 s), five million opcodes. Each is refused, saying why, and the check took megabytes."""
    allocates = _as_torch_saves(tmp_path / "bytearray.pt",
                                pickle.dumps({"epoch": 1, "x": _Allocates()}, protocol=2))
    memo = _as_torch_saves(tmp_path / "memo.pt",
                           b"\x80\x02}q\x00X\x05\x00\x00\x00epochq\x01K\x01sr" + struct.pack("<I", 2 ** 28) + b".")
    busy = _as_torch_saves(tmp_path / "busy.pt", b"\x80\x02" + b"N0" * 2_600_000 + b"}X\x05\x00\x00\x00epochK\x01s.")
    assert allocates.stat().st_size < 2000 and memo.stat().st_size < 2000
    for path in (allocates, memo, busy):
        with zipfile.ZipFile(path) as z:  # torch's layout: its writer's records, and the check's reading of them
            assert {n.split("/", 1)[1] for n in z.namelist()} >= {"data.pkl", "byteorder", "version"}

    seen = _vetted_at_home(allocates, memo, busy)
    (held_a, why_a), (held_m, why_m), (held_b, why_b) = seen["got"]
    assert held_a is None and "bytearray(2147483648)" in why_a, why_a
    assert held_m is None and f"memo slot {2 ** 28}" in why_m, why_m
    assert held_b is None and "opcodes" in why_b, why_b
    controller, child = seen["peak_mb"]
    assert controller < 200 and child < 100, seen["peak_mb"]
    assert not seen["torch"], "the controller imported torch"


def test_an_archive_of_too_many_records_is_refused(tmp_path):
    """Every record is read and held (a CRC, a name) before the pickle is: 150,000 of them took the
    check's time and memory on main and passed. A real checkpoint has a few thousand."""
    path = _many_records(tmp_path / "many.pt", 150_000)
    held, why = _vetted_at_home(path)["got"][0]
    assert held is None and "150002 records" in why, why
    assert checkpoint.check(str(_many_records(tmp_path / "few.pt", 3)))["loads"], "a few records are fine"


def test_the_check_at_home_runs_in_a_child_that_cannot_take_the_controller_s_memory(tmp_path, monkeypatch):
    """Whatever the script's own bounds missed costs the child, refused, never the controller: here the
    child's memory cap is set below what a check needs, and the answer is a refusal that says so."""
    from orchestrator.runs import checkpoint_vet

    path = tmp_path / "last.pt"
    _save(path, "x" * (8 << 20))  # 8 MB of text in its pickle: reading it takes that much more
    assert checkpoint_vet.vet(path) == (3, None)
    monkeypatch.setattr(checkpoint_vet, "MEMORY_MB", 4)
    held, why = checkpoint_vet.vet(path)
    assert held is None and "more memory than this check may take" in why, why
