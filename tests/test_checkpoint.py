"""The on-instance checkpoint check: a torn last.pt is never taken for one to resume from.

``checkpoint.py`` reads torch's zip format with the standard library (a look at a training
instance must not cost a torch import); torch itself writes the files here and is the reference
for what a whole one holds.
"""

import os
import random
from collections import OrderedDict

import pytest

from tests.conftest import needs_torch, on_instance

pytestmark = needs_torch
checkpoint = on_instance("checkpoint")  # the script as the instance runs it


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint shaped like LibreYOLO's: model and optimizer state, the three RNG states (numpy's
    as a tensor, the way LibreYOLO keeps it loadable with ``weights_only``), and the 0-based index
    of the last epoch done."""
    import numpy as np
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3, 10, 10)).sum().backward()
    opt.step()
    path = tmp_path_factory.mktemp("ckpt") / "last.pt"
    torch.save({"epoch": 6, "model": model.state_dict(), "optimizer": opt.state_dict(), "best_metric": 0.25,
                "config": OrderedDict(imgsz=64, names=["bird"]),
                "rng_state": {"torch": torch.get_rng_state(), "python": random.getstate(),
                              # as LibreYOLO keeps numpy's state (trainer.py, _save_checkpoint): a tensor and numbers
                              "numpy": {"keys": torch.from_numpy(np.random.get_state()[1].astype("int64")),
                                        "pos": 3, "has_gauss": 0, "cached_gaussian": 0.0}}}, path)
    return path


def test_a_whole_checkpoint_loads_with_its_epoch(saved):
    import torch

    assert torch.load(saved, weights_only=False)["epoch"] == 6
    got = checkpoint.check(str(saved))
    assert (got["exists"], got["loads"], got["epoch"], got["size"]) == (True, True, 7, saved.stat().st_size), got


@pytest.mark.parametrize("keep", [0.0, 0.01, 0.33, 0.5, 0.9, 0.999])
def test_a_torn_checkpoint_does_not_load(saved, tmp_path, keep):
    torn = tmp_path / "last.pt"
    data = saved.read_bytes()
    torn.write_bytes(data[:int(len(data) * keep)])
    got = checkpoint.check(str(torn))
    assert got["exists"] and not got["loads"] and got["epoch"] is None and got["error"], got


def test_a_flipped_byte_in_a_tensor_does_not_load(saved, tmp_path):
    bad = tmp_path / "last.pt"
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the largest storage record
    bad.write_bytes(bytes(data))
    got = checkpoint.check(str(bad))
    assert not got["loads"] and "CRC" in got["error"], got


def test_no_file_and_a_link_are_no_checkpoint(saved, tmp_path):
    assert checkpoint.check(str(tmp_path / "nope.pt"))["exists"] is False
    os.symlink(saved, tmp_path / "link.pt")
    assert checkpoint.check(str(tmp_path / "link.pt"))["exists"] is False, "a link is not the run's file"


def test_tensors_of_every_dtype_and_plain_containers_are_resumable(tmp_path):
    """What torch.save writes for a tensor of each dtype it can save, a parameter, a view, sizes,
    devices, dtypes, and the plain containers: all on the allowlist, so a checkpoint of them loads."""
    import warnings

    import torch

    warnings.simplefilter("ignore")  # complex32 and friends are "experimental"
    held, skipped = {}, []
    for name in sorted({n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}):
        try:
            t = torch.zeros(3, dtype=getattr(torch, name))
            torch.save(t, tmp_path / "probe.pt")  # a dtype torch itself cannot save is none of ours
        except Exception:  # noqa: BLE001 - sub-byte ints, and the quantized ones zeros() cannot make
            skipped.append(name)
            continue
        held[name] = t
    assert {"float32", "float16", "bfloat16", "int64", "uint8", "bool", "float8_e4m3fn", "complex64"} <= set(held)
    held.update(param=torch.nn.Parameter(torch.ones(2)), view=torch.arange(10)[2:5], size=torch.Size([2, 3]),
                device=torch.device("cpu"), dtype=torch.float16, od=OrderedDict(a=1), set={1, 2}, fs=frozenset([1]),
                raw=b"xy", c=1j, ba=bytearray(b"z"), counter=__import__("collections").Counter("aab"),
                qt=torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8), epoch=3,
                grad=torch.ones(2, requires_grad=True))
    path = tmp_path / "last.pt"
    torch.save(held, path)
    got = checkpoint.check(str(path))
    assert got["loads"] and got["epoch"] == 4, (got["error"], skipped)
    # The same dict pickled with protocol 4 (STACK_GLOBAL, memoized names) is as resumable.
    torch.save(held, path, pickle_protocol=4)
    assert checkpoint.check(str(path))["loads"], checkpoint.check(str(path))


class _Boom:
    """Whatever unpickles it runs ``how`` (os.system, eval) to write a marker file."""

    def __init__(self, mark, how="system"):
        self.mark, self.how = mark, how

    def __reduce__(self):
        if self.how == "eval":
            return (eval, (f"open({str(self.mark)!r}, 'w').close()",))
        return (os.system, (f"touch {self.mark}",))


@pytest.mark.parametrize("how", ["system", "eval"])
def test_a_zip_checkpoint_whose_pickle_calls_a_function_is_not_resumable_and_runs_nothing(tmp_path, how):
    import subprocess
    import sys

    import torch

    mark = tmp_path / "ran"
    path = tmp_path / "last.pt"
    torch.save({"epoch": 1, "model": OrderedDict(w=torch.ones(2)), "x": _Boom(mark, how)}, path)
    got = checkpoint.check(str(path))
    assert not got["loads"] and got["epoch"] is None, got
    assert ("eval" if how == "eval" else "posix.system") in got["error"], got
    # As the instance runs it: a separate process, the script itself.
    script = subprocess.run([sys.executable, checkpoint.__file__, str(path)], capture_output=True, text=True)
    assert '"loads": false' in script.stdout, script
    assert not mark.exists(), "the check ran the pickle"
    torch.load(path, weights_only=False)  # the file is live: what LibreYOLO's resume would have done
    assert mark.exists()


def test_the_legacy_format_is_never_loaded(tmp_path):
    import subprocess
    import sys

    import torch

    mark = tmp_path / "ran"
    plain, hostile = tmp_path / "plain.pt", tmp_path / "hostile.pt"
    torch.save({"epoch": 2, "w": torch.ones(3)}, plain, _use_new_zipfile_serialization=False)
    torch.save({"epoch": 2, "x": _Boom(mark)}, hostile, _use_new_zipfile_serialization=False)
    for path in (plain, hostile):
        got = checkpoint.check(str(path))
        assert not got["loads"] and "legacy" in got["error"], got
        out = subprocess.run([sys.executable, checkpoint.__file__, str(path)], capture_output=True, text=True).stdout
        assert '"loads": false' in out and "legacy" in out, out
    assert not mark.exists(), "the check ran the legacy pickle"


def _zip(path, data, name="last/data.pkl", **kw):
    """A zip of one pickle and the version record torch's reader requires, written by Python's zipfile."""
    import zipfile

    with zipfile.ZipFile(path, "w", **kw) as z:
        z.writestr(name, data)
        z.writestr("last/version", "3\n")
    return path


def test_globals_taken_from_the_stack_are_named_whatever_the_route(tmp_path):
    """Protocol 4 names a global from two strings on the stack; the strings may come from the memo.
    Every route to a name is followed, and one the check cannot follow is refused."""
    import pickle
    import pickletools as pt

    def ops(*parts):
        return pt.optimize(b"".join(parts)) if False else b"".join(parts)

    def s(text):  # SHORT_BINUNICODE
        raw = text.encode()
        return b"\x8c" + bytes([len(raw)]) + raw

    proto = b"\x80\x04"
    ok = proto + s("collections") + b"\x94" + s("OrderedDict") + b"\x94" + b"\x93" + b")R" + b"."
    assert checkpoint.refused_global(ok) is None and isinstance(pickle.loads(ok), OrderedDict)
    # 'os' memoized as entry 0, then 'system' read back from the memo: still os.system.
    via_memo = proto + s("os") + b"\x94" + s("collections") + b"0" + s("system") + b"\x94" + b"h\x00h\x01\x93."
    assert checkpoint.refused_global(via_memo) == "os.system"
    # A memo slot written over (BINPUT 0 again) holds the new string.
    overwritten = proto + s("collections") + b"q\x00" + s("posix") + b"q\x00" + s("system") + b"q\x01" \
        + b"h\x00h\x01\x93."
    assert checkpoint.refused_global(overwritten) == "posix.system"
    # Names built by something other than a plain string (a concatenation the check cannot follow): refused.
    computed = proto + s("os") + s("sys") + b"0" + b"N" + b"\x93."  # POP then None: not two strings
    assert checkpoint.refused_global(computed) == "a computed global"
    assert checkpoint.refused_global(proto + b"\x82\x01.") == "a copyreg extension code"
    assert checkpoint.refused_global(b"cposix\nsystem\n(S'id'\ntR.") == "posix.system"
    assert checkpoint.refused_global(b"(ios\nsystem\nS'id'\nb.") == "os.system"  # INST


def test_the_archive_is_torch_s_shape_or_refused(tmp_path):
    import pickle
    import zipfile

    plain = pickle.dumps({"epoch": 0}, protocol=2)
    assert checkpoint.check(str(_zip(tmp_path / "a.pt", plain)))["loads"]
    squeezed = checkpoint.check(str(_zip(tmp_path / "b.pt", plain, compression=zipfile.ZIP_DEFLATED)))
    assert not squeezed["loads"] and "compressed" in squeezed["error"]
    twice = tmp_path / "c.pt"
    with zipfile.ZipFile(twice, "w") as z, __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")  # zipfile warns of the duplicate name, and writes it
        z.writestr("last/data.pkl", plain)
        z.writestr("last/data.pkl", pickle.dumps({"epoch": 0, "x": _Boom(tmp_path / "ran")}, protocol=2))
        z.writestr("last/version", "3\n")
    got = checkpoint.check(str(twice))
    assert not got["loads"] and "named alike" in got["error"], got
    # torch's reader needs a version record, and reads nothing outside the first record's folder.
    unversioned = tmp_path / "d.pt"
    with zipfile.ZipFile(unversioned, "w") as z:
        z.writestr("last/data.pkl", plain)
    assert "version" in checkpoint.check(str(unversioned))["error"]
    elsewhere = _zip(tmp_path / "e.pt", plain)
    with zipfile.ZipFile(elsewhere, "a") as z:
        z.writestr("other/data.pkl", plain)
    assert "not one torch writes" in checkpoint.check(str(elsewhere))["error"]


@pytest.mark.training
def test_a_real_libreyolo_last_pt_names_only_tensors_and_containers(tiny_run):
    """LibreYOLO's own checkpoint, one epoch on a tiny dataset: resumable, and its pickle names the
    few globals the issue saw (nothing the allowlist had to grow for)."""
    import pickletools
    import zipfile

    from orchestrator.runs import checkpoint_vet

    last = tiny_run / "weights" / "last.pt"
    got = checkpoint.check(str(last))
    assert got["loads"] and got["epoch"] == 1, got
    assert checkpoint_vet.vet(last) == (1, None), "at home, in its bounded child process, it passes too"
    with zipfile.ZipFile(last) as z:
        data = z.read("last/data.pkl")
    named = {tuple(a.split(" ")) for op, a, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert named <= checkpoint.ALLOWED and ("torch._utils", "_rebuild_tensor_v2") in named, named
