"""Whether a LibreYOLO checkpoint can be resumed from: it exists, it is whole, it holds only
tensors and plain containers, and the epochs it holds.

    python checkpoint.py PATH   ->   ORCH_RESULT {"exists", "loads", "epoch", "size", "error"}

The same check answers on the instance and on the controller (``orchestrator.checkpoints``
imports this file): a checkpoint comes from a rented machine, which is not trusted, and LibreYOLO's
resume unpickles it with ``torch.load(weights_only=False)`` on the next machine. ``loads`` is true
only for a file that is safe to hand to that call:

- torch's zip format only. ``torch.save`` has written a zip archive since torch 1.6 (PyTorch's
  serialization notes: ``{name}/data.pkl`` plus one stored record per tensor storage under
  ``{name}/data/``) and LibreYOLO writes nothing else. The legacy format is a bare pickle that
  only running it could read: refused, never loaded.
- whole: the zip's central directory is written last (a torn file has none and ``zipfile``
  refuses it) and every record carries a CRC-32 that ``testzip`` checks. torch stores its records
  uncompressed and with unique names; a compressed or repeated record is not torch's.
- only tensors and plain containers: every global the pickle names (read from its opcodes with
  ``pickletools``; nothing runs) is on ``ALLOWED``, what ``torch.save`` writes for tensors of every
  dtype, parameters, sizes, devices and dtypes, and the plain containers a LibreYOLO ``last.pt``
  holds (model, ema and optimizer state, RNG state as tensors, numbers, strings). It is the set
  torch's own ``weights_only`` unpickler allows (``torch/_weights_only_unpickler.py``,
  ``_get_allowed_globals``) less the rebuilders that take a function or class as an argument
  (``_rebuild_from_type_v2``, ``_rebuild_wrapper_subclass``, ...), which no LibreYOLO checkpoint
  uses. A real LibreYOLO ``last.pt`` names five: ``collections.OrderedDict``,
  ``torch._utils._rebuild_tensor_v2`` and three storage classes.

Then the pickle is read once more with every allowed class replaced by an inert stand-in (nothing
in it runs) to find the epoch: the number of epochs completed (LibreYOLO stores the 0-based index
of the last one; its resume continues at that + 1). Standard library only, so that a look at a
training instance costs a fraction of a second instead of a torch import.
"""
import _compat_pickle
import io
import json
import os
import pickle
import pickletools
import sys
import zipfile

_DTYPES = ("float16 float32 float64 bfloat16 half float double complex32 complex64 complex128 chalf cfloat cdouble "
           "bcomplex32 uint8 uint16 uint32 uint64 int8 int16 int32 int64 short int long bool "
           "float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2 "
           "bits1x8 bits2x4 bits4x2 bits8 bits16 qint8 quint8 qint32 quint4x2 quint2x4").split()
_STORAGES = ("Float Double Half BFloat16 Long Int Short Char Byte Bool ComplexFloat ComplexDouble "
             "QInt8 QUInt8 QInt32 QUInt4x2 QUInt2x4").split()
_QSCHEMES = ("per_tensor_affine per_channel_affine per_tensor_symmetric per_channel_symmetric "
             "per_channel_affine_float_qparams").split()
# (module, name) of every global a checkpoint orch resumes from may name.
ALLOWED = frozenset(
    {("collections", "OrderedDict"), ("collections", "Counter"), ("builtins", "set"), ("builtins", "frozenset"),
     ("builtins", "complex"), ("builtins", "bytearray"), ("builtins", "slice"),
     ("_codecs", "encode"),  # how protocol 2 (torch's) writes bytes
     ("torch", "Size"), ("torch", "device"), ("torch.storage", "UntypedStorage"),
     ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor_v3"),
     ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_qtensor"),
     ("torch.nn.parameter", "Parameter")}
    | {("torch", d) for d in _DTYPES} | {("torch", s + "Storage") for s in _STORAGES}
    | {("torch", q) for q in _QSCHEMES})
# The few plain containers the epoch reader builds for real; every other allowed name is a _Stub.
_REAL = {("collections", "OrderedDict"), ("collections", "Counter"), ("builtins", "set"), ("builtins", "frozenset"),
         ("builtins", "slice"), ("builtins", "complex"), ("builtins", "bytearray"), ("_codecs", "encode")}
MAX_PICKLE = 256 << 20  # LibreYOLO's data.pkl is about 1 MB (the tensors are records of their own)

_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_NEUTRAL = {"PROTO", "FRAME"}  # change nothing on the stack


def _resolved(module, name):
    """(module, name) as the unpickler resolves it: protocol 2 writes Python 2's names
    (``__builtin__.set``), which it maps as ``_compat_pickle`` says."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def allowed(module, name):
    return (module, name) in ALLOWED or _resolved(module, name) in ALLOWED


def refused_global(data):
    """None when every global the pickle ``data`` names is allowed, else what it names. Read from
    the opcodes alone. STACK_GLOBAL takes its names from the stack: the two strings pushed just
    before it are tracked (directly, or through the memo), and any other shape is refused."""
    memo = {}
    top = below = None  # the strings on top of the stack, when known
    for op, arg, _ in pickletools.genops(data):
        kind = op.name
        if kind in ("GLOBAL", "INST"):
            module, _, name = arg.partition(" ")
            if not allowed(module, name):
                return f"{module}.{name}"
            below = top = None
        elif kind == "STACK_GLOBAL":
            if not (isinstance(below, str) and isinstance(top, str) and allowed(below, top)):
                return f"{below}.{top}" if isinstance(below, str) and isinstance(top, str) else "a computed global"
            below = top = None
        elif kind.startswith("EXT"):
            return "a copyreg extension code"
        elif kind in _STRINGS or kind in _GETS:
            below, top = top, (arg if kind in _STRINGS else memo.get(arg))
        elif kind in _PUTS:
            memo[arg] = top
        elif kind == "MEMOIZE":
            memo[len(memo)] = top
        elif kind not in _NEUTRAL:
            below = top = None
    return None


class _Stub:
    """An allowed object the pickle names (a tensor, a storage, a dtype): accepts whatever it is given."""

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
        if not allowed(module, name):  # refused_global already said no; never reached for a checked pickle
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed")
        if _resolved(module, name) in _REAL:
            return super().find_class(module, name)
        return _Stub

    def persistent_load(self, pid):  # a tensor storage: a record of the zip, already checked
        return None


def _epoch_of(ckpt):
    if isinstance(ckpt, dict) and isinstance(ckpt.get("epoch"), int) and not isinstance(ckpt["epoch"], bool):
        return ckpt["epoch"] + 1
    return None


def read_zip(path):
    """(loads, epoch, error) of a torch zip checkpoint, without torch and running nothing."""
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            return False, None, "a record is in the archive twice: not written by torch"
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
            return False, None, "a record is compressed: not written by torch"
        bad = z.testzip()
        if bad is not None:
            return False, None, f"record {bad} fails its CRC"
        pickles = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
        if len(pickles) != 1:
            return False, None, "no data.pkl in the archive: not a torch checkpoint"
        if pickles[0].file_size > MAX_PICKLE:
            return False, None, f"its data.pkl is {pickles[0].file_size} bytes: not a checkpoint of tensors"
        data = z.read(pickles[0])
    named = refused_global(data)
    if named is not None:
        return False, None, f"its pickle names {named[:120]}, not only tensors and plain containers: not resumed from"
    ckpt = _Inert(io.BytesIO(data)).load()
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
        elif head[:1] == b"\x80":  # a bare pickle: torch's legacy format, which only running it reads
            out["error"] = "torch's legacy (non-zip) format, which LibreYOLO never writes: not resumed from"
        else:  # empty or cut before its first bytes: torch.save has only just opened it
            out["error"] = "not a torch checkpoint" if head else "empty"
    except Exception as e:  # noqa: BLE001 - whatever fails to read is not a checkpoint to resume
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


if __name__ == "__main__":
    print("ORCH_RESULT " + json.dumps(check(sys.argv[1])))
