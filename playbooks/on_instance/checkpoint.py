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
- the very bytes torch reads (``torch_pickle``). Python's ``zipfile`` and torch's reader (miniz,
  in ``caffe2/serialize/inline_container.cc``) can read two different archives out of one file:
  miniz matches names blind to case, so ``A/Data.pkl`` beside ``A/data.pkl`` may be the one torch
  unpickles; miniz reads the central directory at the offset the end record states, ``zipfile``
  just before the end record; and ``torch.load`` hands an archive with ``constants.pkl`` to
  ``torch.jit.load``, which runs what its ``code/`` says. So the archive is read here as miniz
  reads it, and taken only in the one layout torch's writer makes, where both readers agree: every
  record under one folder (the first record's, as torch takes it) and named as torch names its
  own (``data.pkl``, ``data/N``, ``byteorder``, ``version``, ``.data/version``,
  ``.data/serialization_id``, ``.format_version``, ``.storage_alignment``), no two names alike
  but for case; the end record the file's last bytes (with its zip64 record just before, where
  there is one) and the central directory ending exactly where it begins; the records one after
  the other from byte 0 to the directory, each local header saying what the directory says.
- whole: the end record is written last (a torn file has none) and every record carries a
  CRC-32, checked here. torch stores its records uncompressed: a compressed record is not torch's.
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

Bounded whatever the bytes say, as the controller runs it on a file a rented machine wrote: no more
than ``MAX_RECORDS`` records, ``MAX_PICKLE`` bytes of pickle and ``MAX_OPS`` opcodes in it (a real
LibreYOLO ``last.pt`` of yolo9-t: 4,445 records, 0.9 MB and 225,000 opcodes); a memo index only
next to those already written (the unpickler sizes its memo by the largest index: one
``LONG_BINPUT`` of 2**28 cost 4 GB and 30 s); the few real callables take only what torch writes
for them (``bytearray(2**31)`` allocates 2 GB on the pickle's say-so; ``_codecs.encode`` with
another codec may cost far more than its input). ``--max-mb N`` also caps the process's memory
(``RLIMIT_AS``), as the controller runs it (``orchestrator.runs.checkpoint_vet``).
"""
import _compat_pickle
import io
import json
import os
import pickle
import pickletools
import re
import struct
import sys
import zlib

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
MAX_PICKLE = 64 << 20  # LibreYOLO's data.pkl is about 1 MB (the tensors are records of their own)
MAX_OPS = 5_000_000  # its opcodes: about 225,000 in yolo9-t's, 50 a tensor; reading them costs about 1 us each

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
    before it are tracked (directly, or through the memo), and any other shape is refused.
    NotTorch for a pickle the unpickler could not read within bounds: over ``MAX_OPS`` opcodes, or a
    memo index past those written so far (a pickler numbers them 0, 1, 2...), or one read unwritten."""
    memo = {}
    top = below = None  # the strings on top of the stack, when known
    for count, (op, arg, _) in enumerate(pickletools.genops(data)):
        kind = op.name
        if count >= MAX_OPS:
            raise NotTorch(f"its pickle holds over {MAX_OPS} opcodes: not a checkpoint of tensors")
        if kind in _PUTS and not (isinstance(arg, int) and 0 <= arg <= len(memo)):
            raise NotTorch(f"its pickle writes memo slot {arg} after {len(memo)}: no pickler numbers them so "
                           "(the unpickler would size its memo by it)")
        if kind in _GETS and arg not in memo:
            raise NotTorch(f"its pickle reads memo slot {arg}, never written")
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


def _bytearray(source=b"", *args):
    """``bytearray`` as torch's pickles call it (from a string and its codec); a size is refused:
    ``bytearray(N)`` allocates N bytes on the pickle's say-so."""
    if not isinstance(source, (str, bytes)):
        raise NotTorch(f"its pickle asks for bytearray({_clipped(source)}), not one made from bytes: not a checkpoint")
    return bytearray(source, *args)


def _encode(obj, encoding="utf-8", errors="strict"):
    """``_codecs.encode`` as protocol 2 writes bytes (a string in latin-1); any other codec is refused:
    some cost far more than their input (``punycode``, ``unicode_escape``)."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise NotTorch(f"its pickle encodes with {_clipped(encoding)}, not as torch writes bytes: not a checkpoint")
    return obj.encode(encoding, errors)


def _clipped(value):
    return repr(value)[:40] if isinstance(value, (str, bytes, int, float)) else type(value).__name__


_GUARDED = {("builtins", "bytearray"): _bytearray, ("_codecs", "encode"): _encode}


class _Inert(pickle.Unpickler):
    def find_class(self, module, name):
        if not allowed(module, name):  # refused_global already said no; never reached for a checked pickle
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed")
        if _resolved(module, name) in _GUARDED:
            return _GUARDED[_resolved(module, name)]
        if _resolved(module, name) in _REAL:
            return super().find_class(module, name)
        return _Stub

    def persistent_load(self, pid):  # a tensor storage: a record of the zip, already checked
        return None


def _epoch_of(ckpt):
    if isinstance(ckpt, dict) and isinstance(ckpt.get("epoch"), int) and not isinstance(ckpt["epoch"], bool):
        return ckpt["epoch"] + 1
    return None


class NotTorch(Exception):
    """The file is not an archive torch's writer made, or torch would read it otherwise than this check."""


# torch's own records, under the archive's one folder: torch/serialization.py (_save) and
# caffe2/serialize/inline_container.cc (PyTorchStreamWriter, the reader's version records).
_RECORDS = re.compile(r"data\.pkl|data/[0-9]{1,20}|byteorder|version|\.data/version|\.data/serialization_id"
                      r"|\.format_version|\.storage_alignment")
_MAX_DIRECTORY = 64 << 20  # torch's central directory holds a few dozen bytes per tensor storage
MAX_RECORDS = 100_000  # a record per tensor storage: 4,445 in yolo9-t's last.pt (model, EMA, optimizer)


def _fields(extra, allowed):
    """{header id: data} of a zip extra field, each id once and on ``allowed``, with no bytes left over."""
    found, at = {}, 0
    while at < len(extra):
        if at + 4 > len(extra):
            raise NotTorch("a record's extra field is cut short")
        hid, size = struct.unpack_from("<2H", extra, at)
        if hid not in allowed or hid in found or at + 4 + size > len(extra):
            raise NotTorch(f"a record's extra field holds what torch does not write (id {hid:#06x})")
        found[hid] = extra[at + 4:at + 4 + size]
        at += 4 + size
    return found


def _zip64(body, *values):
    """``values`` with each that says 0xFFFFFFFF replaced from the zip64 extra field, in the order of the zip
    spec (APPNOTE.TXT 4.5.3: sizes, then the offset), as miniz and zipfile read it; nothing else in it."""
    out, at = [], 0
    for value in values:
        if value == 0xFFFFFFFF:
            if at + 8 > len(body):
                raise NotTorch("a record's zip64 field is cut short")
            value = struct.unpack_from("<Q", body, at)[0]
            at += 8
        out.append(value)
    if at != len(body):
        raise NotTorch("a record's zip64 field holds more than its sizes")
    return out


def torch_pickle(f, size):
    """The bytes of ``data.pkl`` that torch's reader unpickles from the open file ``f`` of ``size``
    bytes, read the way it reads them; NotTorch unless the archive is in torch's own layout."""
    if size < 22:
        raise NotTorch("too short for a zip archive: cut short while written, or not torch's")
    f.seek(size - 22)
    sig, disk, cd_disk, n_disk, n_all, cd_size, cd_at, comment = struct.unpack("<4s4H2LH", f.read(22))
    if sig != b"PK\x05\x06" or comment:
        raise NotTorch("no end record as torch writes it at the end of the file (cut short while written, "
                       "or bytes after it): not a torch checkpoint")
    dir_end = size - 22
    if dir_end >= 76:
        f.seek(dir_end - 20)
        locator = f.read(20)
        if locator[:4] == b"PK\x06\x07":  # zip64, as torch writes every archive (MZ_ZIP_FLAG_WRITE_ZIP64)
            _, loc_disk, record_at, disks = struct.unpack("<4sLQL", locator)
            # Python reads the zip64 end record just before its locator, miniz where the locator says.
            if loc_disk != 0 or disks != 1 or record_at != dir_end - 76:
                raise NotTorch("its zip64 end record is not where its locator says: two readers would read two "
                               "archives")
            f.seek(record_at)
            sig64, record_size, _, _, *wide = struct.unpack("<4sQ2H2L4Q", f.read(56))
            if sig64 != b"PK\x06\x06" or record_size != 44:
                raise NotTorch("its zip64 end record is not torch's")
            for narrow, value, mark in zip((disk, cd_disk, n_disk, n_all, cd_size, cd_at), wide,
                                           (0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)):
                if narrow not in (value, mark):
                    raise NotTorch("its two end records disagree: two readers would read two archives")
            disk, cd_disk, n_disk, n_all, cd_size, cd_at = wide
            dir_end = record_at
    if disk or cd_disk or n_disk != n_all:
        raise NotTorch("the archive says it spans several disks: not torch's")
    # miniz reads the directory at the offset the end record states, Python's zipfile just before the end
    # record (it takes any difference for bytes prepended to the archive): the two must be one place.
    if cd_at + cd_size != dir_end:
        raise NotTorch("its central directory is not where its end record says (a second directory, or bytes "
                       "before the archive): torch and a check would read two archives")
    if cd_size > _MAX_DIRECTORY or not 0 < n_all <= cd_size // 46:
        raise NotTorch("its central directory is not the size of its records: not torch's")
    if n_all > MAX_RECORDS:
        raise NotTorch(f"it holds {n_all} records, over the {MAX_RECORDS} a checkpoint of tensors has")
    f.seek(cd_at)
    directory = f.read(cd_size)
    records, at = [], 0
    for _ in range(n_all):  # miniz walks as many records as the end record counts; zipfile, as many as fit
        if directory[at:at + 4] != b"PK\x01\x02" or at + 46 > len(directory):
            raise NotTorch("its central directory is cut short or not torch's")
        (_, _, _, flags, method, _, _, crc, packed, length, name_len, extra_len, comment_len, disk_start, _, _,
         header_at) = struct.unpack_from("<4s6H3L5H2L", directory, at)
        name = directory[at + 46:at + 46 + name_len]
        extra = directory[at + 46 + name_len:at + 46 + name_len + extra_len]
        at += 46 + name_len + extra_len + comment_len
        if at > len(directory):
            raise NotTorch("its central directory is cut short")
        if method != 0 or flags & ~0x0808 or comment_len or disk_start:  # stored; data descriptor and UTF-8 flags only
            raise NotTorch(f"record {name.decode('utf-8', 'replace')[:80]!r} is compressed, encrypted or annotated: "
                           "not written by torch")
        length, packed, header_at = _zip64(_fields(extra, {1}).get(1, b""), length, packed, header_at)
        if packed != length:
            raise NotTorch(f"record {name.decode('utf-8', 'replace')[:80]!r} is compressed: not written by torch")
        records.append((header_at, name, flags, crc, length))
    if at != len(directory):
        raise NotTorch("its central directory holds more records than its end record counts: two readers "
                       "would read two archives")
    # One folder, the first record's (torch's reader takes it from there), and torch's own names in it.
    folder = records[0][1].split(b"/", 1)[0]
    if not folder or b"\\" in folder or b"\0" in folder or b"/" not in records[0][1]:
        raise NotTorch("its first record is in no folder: not torch's")
    names = {}
    for _, name, _, _, _ in records:
        other = names.setdefault(name.lower(), name)  # bytes.lower(): ASCII only, like miniz's tolower
        if other is not name:
            raise NotTorch(f"two records named alike but for case ({other.decode('utf-8', 'replace')[:80]!r} and "
                           f"{name.decode('utf-8', 'replace')[:80]!r}): torch's reader, blind to case, could read "
                           "either")
    inside = [(name, name[len(folder) + 1:].decode("ascii", "replace") if name.startswith(folder + b"/") else None)
              for name in names.values()]
    for name, rest in inside:
        if rest is not None and (rest == "constants.pkl" or rest.startswith("code/")):
            raise NotTorch(f"record {name.decode('utf-8', 'replace')[:120]!r} makes it a TorchScript archive, "
                           "which torch.load hands to torch.jit.load (it runs the archive's code): not a checkpoint")
    for name, rest in inside:
        if rest is None or not _RECORDS.fullmatch(rest):
            raise NotTorch(f"record {name.decode('utf-8', 'replace')[:120]!r} is not one torch writes in a checkpoint "
                           "(nor in its one folder)")
    held = set(names.values())
    if folder + b"/data.pkl" not in held or not {folder + b"/version", folder + b"/.data/version"} & held:
        raise NotTorch("no data.pkl and version in the archive: not a torch checkpoint")
    # The records one after the other from byte 0 up to the directory, each local header saying what the
    # directory says (zipfile and miniz both find a record's data from its local header's lengths).
    pickle_bytes, expected = None, 0
    records.sort()
    for i, (header_at, name, flags, crc, length) in enumerate(records):
        if header_at != expected:
            raise NotTorch("bytes before the first record or between two records: not torch's layout")
        f.seek(header_at)
        head = f.read(30)
        if len(head) != 30:
            raise NotTorch("a record's local header is cut short")
        (sig, _, local_flags, local_method, _, _, local_crc, local_packed, local_length, name_len,
         extra_len) = struct.unpack("<4s5H3L2H", head)
        local_name, extra = f.read(name_len), f.read(extra_len)
        fields = _fields(extra, {1, 0x4246})  # zip64 sizes, and torch's "FB" padding that aligns the data
        said = (local_crc, local_packed, local_length)
        if 1 in fields:
            said = (local_crc, *_zip64(fields[1], local_length, local_packed)[::-1])
        if sig != b"PK\x03\x04" or local_name != name or local_method != 0 or local_flags != flags or \
                said != (crc, length, length) and not (flags & 8 and said == (0, 0, 0)):
            raise NotTorch(f"the local header of {name.decode('utf-8', 'replace')[:80]!r} says other than the "
                           "central directory: two readers would read two archives")
        data_at = header_at + 30 + name_len + extra_len
        digest, left = 0, length
        f.seek(data_at)
        keep = name == folder + b"/data.pkl"
        if keep and length > MAX_PICKLE:
            raise NotTorch(f"its data.pkl is {length} bytes: not a checkpoint of tensors")
        chunks = []
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise NotTorch(f"record {name.decode('utf-8', 'replace')[:80]!r} is cut short")
            digest = zlib.crc32(chunk, digest)
            left -= len(chunk)
            if keep:
                chunks.append(chunk)
        if digest != crc:
            raise NotTorch(f"record {name.decode('utf-8', 'replace')[:80]!r} fails its CRC")
        if keep:
            pickle_bytes = b"".join(chunks)
        expected = data_at + length
        following = records[i + 1][0] if i + 1 < len(records) else cd_at
        if flags & 8:  # a data descriptor after the data: its CRC and sizes, 4 or 8 bytes each (zip64)
            tail = f.read(following - expected) if 16 <= following - expected <= 24 else b""
            if tail not in (struct.pack("<4s3L", b"PK\x07\x08", crc, length, length),
                            struct.pack("<4sL2Q", b"PK\x07\x08", crc, length, length)):
                raise NotTorch(f"the data descriptor of {name.decode('utf-8', 'replace')[:80]!r} is not torch's")
            expected = following
    if expected != cd_at:
        raise NotTorch("bytes between the last record and the central directory: not torch's layout")
    return pickle_bytes


def read_zip(path):
    """(loads, epoch, error) of a torch zip checkpoint, without torch and running nothing."""
    try:
        with open(path, "rb") as f:
            data = torch_pickle(f, os.fstat(f.fileno()).st_size)
        named = refused_global(data)
        if named is not None:
            return False, None, (f"its pickle names {named[:120]}, not only tensors and plain containers: not "
                                 "resumed from")
        ckpt = _Inert(io.BytesIO(data)).load()
    except NotTorch as e:
        return False, None, str(e)
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
    except MemoryError:
        out["error"] = "reading it needs more memory than this check may take: not a checkpoint of tensors"
    except Exception as e:  # noqa: BLE001 - whatever fails to read is not a checkpoint to resume
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def limit_memory(mb):
    """This process's address space capped at ``mb`` MB: past it an allocation fails (MemoryError)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))


if __name__ == "__main__":
    if sys.argv[1] == "--max-mb":  # python checkpoint.py --max-mb N PATH
        limit_memory(int(sys.argv[2]))
    print("ORCH_RESULT " + json.dumps(check(sys.argv[-1])))
