"""Whether a LibreYOLO checkpoint can be resumed from: it exists, it is whole, and the epochs it holds.

    python checkpoint.py PATH   ->   ORCH_RESULT {"exists", "loads", "epoch", "size", "error"}

LibreYOLO writes last.pt with a plain ``torch.save`` (not atomic): a process killed mid-write (a
preemption, a SIGKILL) leaves a torn file that ``--resume`` would crash on. ``epoch`` is the number
of epochs completed (LibreYOLO stores the 0-based index of the last one; its resume continues at
that + 1).

Standard library only, so that a look at a training instance costs milliseconds instead of a torch
import (seconds of CPU taken from the training, on every look). ``torch.save`` writes a zip
archive (PyTorch's serialization notes: ``{name}/data.pkl`` plus one stored record per tensor
storage under ``{name}/data/``), with the zip's central directory written last: a torn file has
none and ``zipfile`` refuses it, and every record carries a CRC-32 that ``testzip`` checks, so a
whole archive is the same bytes ``torch.load`` would read. The pickle is read with every class
replaced by an inert stand-in (nothing in it runs), which is enough to find the epoch. A file
that is not a zip (torch's legacy format) is loaded with torch, when the instance has it.
"""
import json
import os
import pickle
import sys
import zipfile

# The few plain containers a checkpoint's pickle builds; everything else becomes a _Stub.
_REAL = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
         ("builtins", "complex"), ("builtins", "bytearray")}


class _Stub:
    """Any object the pickle names (a tensor, a numpy array, a dtype): accepts whatever it is given."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Inert(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _REAL:
            return super().find_class(module, name)
        return _Stub

    def persistent_load(self, pid):  # a tensor storage: a record of the zip, already checked
        return None


def _epoch_of(ckpt):
    if isinstance(ckpt, dict) and isinstance(ckpt.get("epoch"), int) and not isinstance(ckpt["epoch"], bool):
        return ckpt["epoch"] + 1
    return None


def read_zip(path):
    """(loads, epoch, error) of a torch zip checkpoint, without torch."""
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
        if bad is not None:
            return False, None, f"record {bad} fails its CRC"
        pickles = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            return False, None, "no data.pkl in the archive: not a torch checkpoint"
        with z.open(pickles[0]) as f:
            ckpt = _Inert(f).load()
    return True, _epoch_of(ckpt), None


def read_legacy(path):
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return True, _epoch_of(ckpt), None


def check(path):
    out = {"exists": os.path.isfile(path) and not os.path.islink(path), "loads": False, "epoch": None, "size": None,
           "error": None}
    if not out["exists"]:
        return out
    out["size"] = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04":
            out["loads"], out["epoch"], out["error"] = read_zip(path)
        elif head[:1] == b"\x80":  # a pickle: torch's legacy format
            out["loads"], out["epoch"], out["error"] = read_legacy(path)
        else:  # empty or cut before its first bytes: torch.save has only just opened it
            out["error"] = "not a torch checkpoint" if head else "empty"
    except Exception as e:  # noqa: BLE001 - whatever fails to read is not a checkpoint to resume
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


if __name__ == "__main__":
    print("ORCH_RESULT " + json.dumps(check(sys.argv[1])))
