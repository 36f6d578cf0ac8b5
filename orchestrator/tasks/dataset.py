"""Datasets: check a local YOLO dataset, pack it as one tar, unpack it on the instance, size the disk.

The rule from "Training on a rented GPU" (the brief orch was founded on): stage the dataset once, as a single tar, somewhere every provider reads fast
(a Hugging Face dataset repo), and to size the disk before renting. Everything here runs on the
controller with the standard library and PyYAML; nothing imports torch. The checks stand alone,
and ``libreyolo doctor`` adds its own where LibreYOLO happens to be installed.

Path rules follow Ultralytics/LibreYOLO: a relative ``path:`` is relative to the yaml's folder
(absent: the yaml's folder is the root); a split is a folder of images, an image, a ``.txt`` listing
images (relative lines are relative to the list), or a list of those; an image's labels sit at the
same place with its ``images`` path segments changed to ``labels`` and a ``.txt`` suffix.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.errors import UsageError

# LibreYOLO's IMG_FORMATS (libreyolo/data/utils.py).
IMG_FORMATS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pfm"})
SPLITS = ("train", "val", "test")
_COORD_SLACK = 1e-6  # LibreYOLO doctor's coord_tolerance: float noise, not a real overhang
_TAR_MTIME = 1_577_836_800  # 2020-01-01: fixed so re-packing the same files gives the same bytes
GB = 1e9  # providers bill decimal gigabytes


@dataclass(frozen=True)
class DatasetInfo:
    root: Path  # the dataset root: the yaml's ``path:``, else the yaml's folder
    yaml_path: Path
    nc: int
    names: tuple[str, ...]
    n_images: dict[str, int]  # per split: train, val and, when given, test
    n_labels: int  # label lines (objects) over all splits
    bytes: int  # total size of the files pack() puts in the tar (the rewritten yaml aside)
    files: tuple[Path, ...] = field(repr=False)  # images, label files and image lists, absolute, sorted
    splits: dict[str, list[Path]] = field(repr=False)  # each split's entries, resolved

    @property
    def name(self) -> str:
        """The tar's top folder: the root folder's name, made safe for a path and a repo file."""
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.root.name).strip("-.") or "dataset"


# -- validate -----------------------------------------------------------------------------------


def validate(path: Path, imgsz: int | None = None, doctor: bool = True, say=None) -> DatasetInfo:
    """Check a YOLO dataset (its folder or its yaml); raise UsageError with one line on the first problem.

    With ``doctor`` (the default) and LibreYOLO importable here, ``libreyolo doctor`` runs last and
    its errors are raised the same way; ``imgsz`` is its training size for the tiny-object checks.
    ``say`` (default: stderr) hears what the doctor does while it runs: it can take a minute.
    """
    yaml_path = _find_yaml(Path(path).expanduser())
    config = _load_yaml(yaml_path)
    root = _root(config, yaml_path)
    names = _names(config, yaml_path)
    nc = len(names)

    splits: dict[str, list[Path]] = {}
    images: dict[str, list[Path]] = {}
    lists: set[Path] = set()
    for split in SPLITS:
        value = config.get(split)
        if not value:
            if split != "test":
                raise UsageError(f"{yaml_path}: no '{split}' split")
            continue
        entries = value if isinstance(value, list) else [value]
        if not all(isinstance(e, str) and e for e in entries):
            raise UsageError(f"{yaml_path}: '{split}' must be a path or a list of paths")
        splits[split] = [_resolve(root, e) for e in entries]
        images[split] = sorted({img for e in splits[split] for img in _images(split, e, lists)})
        if not images[split]:
            raise UsageError(f"{split}: no images in {', '.join(str(e) for e in splits[split])}")

    all_images = sorted({img for split_images in images.values() for img in split_images})
    labels = [lbl for lbl in (label_path(img) for img in all_images) if lbl.is_file()]
    n_labels = sum(_check_labels(lbl, nc) for lbl in labels)
    files = tuple(sorted({*all_images, *labels, *lists}))
    info = DatasetInfo(
        root=root,
        yaml_path=yaml_path,
        nc=nc,
        names=tuple(names),
        n_images={split: len(imgs) for split, imgs in images.items()},
        n_labels=n_labels,
        bytes=sum(f.stat().st_size for f in files),
        files=files,
        splits=splits,
    )
    if doctor:
        _doctor(yaml_path, imgsz, len(all_images), say or (lambda m: print(m, file=sys.stderr, flush=True)))
    return info


def label_path(image: Path) -> Path:
    """Where LibreYOLO looks for an image's labels (libreyolo.data.utils.img2label_paths)."""
    s = str(image).replace(f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}")
    return Path(s).with_suffix(".txt")


def _find_yaml(path: Path) -> Path:
    try:
        found = path.exists()
    except OSError:  # a name too long for the file system
        found = False
    if not found:
        raise UsageError(f"dataset not found: {str(path)[:200]}")
    if path.is_dir():
        for name in ("data.yaml", "data.yml"):
            if (path / name).is_file():
                return (path / name).resolve()
        raise UsageError(f"no data.yaml in {path}")
    return path.resolve()


def _load_yaml(yaml_path: Path) -> dict:
    try:
        config = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {yaml_path}: {e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise UsageError(f"{yaml_path} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{yaml_path} is not a YAML mapping (expected keys train, val, names)")
    return config


def _root(config: dict, yaml_path: Path) -> Path:
    value = config.get("path")
    if value in (None, ""):
        return yaml_path.parent
    if not isinstance(value, str):
        raise UsageError(f"{yaml_path}: 'path' must be a string")
    root = Path(value).expanduser()
    root = root if root.is_absolute() else (yaml_path.parent / root).resolve()
    if not root.is_dir():
        raise UsageError(f"{yaml_path}: path {root} is not a folder")
    return root


def _names(config: dict, yaml_path: Path) -> list[str]:
    raw = config.get("names")
    if isinstance(raw, dict):
        try:
            by_id = {int(k): str(v) for k, v in raw.items()}
        except (TypeError, ValueError):
            raise UsageError(f"{yaml_path}: 'names' keys must be class ids 0, 1, ...") from None
        if sorted(by_id) != list(range(len(by_id))):
            raise UsageError(f"{yaml_path}: 'names' ids must be 0..{len(by_id) - 1} with no gaps")
        names = [by_id[i] for i in range(len(by_id))]
    elif isinstance(raw, list):
        names = [str(n) for n in raw]
    else:
        raise UsageError(f"{yaml_path}: 'names' is missing (a list, or a mapping of class id to name)")
    if not names:
        raise UsageError(f"{yaml_path}: 'names' is empty")
    nc = config.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, (int, float)) or nc != len(names)):
        raise UsageError(f"{yaml_path}: nc={nc} but 'names' has {len(names)} classes")
    return names


def _resolve(root: Path, entry: str) -> Path:
    p = Path(entry).expanduser()
    return Path(os.path.normpath(p if p.is_absolute() else root / p))


def _images(split: str, entry: Path, lists: set[Path]) -> list[Path]:
    if not entry.exists():
        raise UsageError(f"{split}: {entry} does not exist")
    if entry.is_dir():
        return [p for p in entry.rglob("*") if p.suffix.lower() in IMG_FORMATS and p.is_file()]
    if entry.suffix.lower() in IMG_FORMATS:
        return [entry]
    if entry.suffix.lower() != ".txt":
        raise UsageError(f"{split}: {entry} is neither a folder, an image nor a .txt list of images")
    lists.add(entry)
    out = []
    for line in entry.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        img = Path(line)
        img = img if img.is_absolute() else entry.parent / img
        if not img.is_file():
            raise UsageError(f"{split}: {img} (listed in {entry}) does not exist")
        if img.suffix.lower() in IMG_FORMATS:
            out.append(Path(os.path.normpath(img)))
    return out


def _check_labels(label: Path, nc: int) -> int:
    """Raise on the first bad line of a label file; return its number of objects."""
    count = 0
    text = label.read_text(encoding="utf-8", errors="replace")
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        where = f"{label}:{n}"
        try:
            cls = int(parts[0])
            coords = [float(v) for v in parts[1:]]
        except ValueError:
            raise UsageError(f"{where}: expected numbers 'class cx cy w h', got {line.strip()!r}") from None
        if len(coords) != 4 and (len(coords) < 6 or len(coords) % 2):
            raise UsageError(
                f"{where}: expected 'class cx cy w h' or a segment 'class x1 y1 x2 y2 x3 y3 ...', "
                f"got {len(parts)} fields"
            )
        if not 0 <= cls < nc:
            raise UsageError(f"{where}: class {cls} out of range [0, {nc})")
        bad = next((v for v in coords if not -_COORD_SLACK <= v <= 1 + _COORD_SLACK), None)
        if bad is not None:
            raise UsageError(f"{where}: coordinate {bad} outside [0, 1] (labels are normalised)")
        count += 1
    return count


def sha256(path: Path) -> str:
    """The hex SHA-256 of a file (a packed tar), read in 1 MiB pieces."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


DOCTOR_NOTE_SECONDS = 10.0  # how often a running doctor says it still runs
DOCTOR_TIMEOUT = 900.0


def doctor(info: DatasetInfo, imgsz: int | None, digest: str, verdicts: Path, say) -> None:
    """``libreyolo doctor`` on a dataset that packed to ``digest``, once per content: a pass is
    remembered in ``verdicts`` under the digest, the training size and LibreYOLO's version, and the
    same bytes are not checked again (it loads torch and decodes every image: seconds to minutes,
    on every ``orch run`` of an unchanged dataset). A failure is never remembered.

    One doctor per content at a time: an orch that finds another checking the same bytes (the jobs
    of a sweep, started together) waits for that one's verdict instead of loading torch beside it."""
    if importlib.util.find_spec("libreyolo") is None:
        return
    import fcntl
    from importlib.metadata import version

    mark = verdicts / f"{digest}-imgsz{imgsz or 0}-libreyolo{version('libreyolo')}.passed"
    if mark.is_file():
        say(f"      data: libreyolo doctor passed these same bytes before ({digest[:16]}): not run again")
        return
    verdicts.mkdir(parents=True, exist_ok=True)
    with open(mark.with_name(f".{mark.name}.lock"), "w") as lock:  # the lock goes when the file closes
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"      data: another orch is running libreyolo doctor on these same bytes ({digest[:16]}): "
                "waiting for its verdict")
            fcntl.flock(lock, fcntl.LOCK_EX)
            if mark.is_file():
                say(f"      data: libreyolo doctor passed these same bytes ({digest[:16]}): not run again")
                return
        _doctor(info.yaml_path, imgsz, sum(info.n_images.values()), say)
        tmp = mark.with_name(f".{mark.name}.{os.getpid()}")
        tmp.write_text(f"{info.yaml_path}\n")
        os.replace(tmp, mark)


# ``libreyolo ARGS`` with this interpreter, the collector tuned as train_entry.py tunes it (fewer
# young passes; torch's and torchvision's objects frozen once imported): 3.5 -> 2.5 CPU-s for the
# doctor of a 12-image dataset.
LIBREYOLO_CLI = (sys.executable, "-c", "import gc, sys; gc.set_threshold(10_000, 10, 10); import torch, "
                 "torchvision; gc.freeze(); from libreyolo.cli import entrypoint; sys.exit(entrypoint())")


def _doctor(yaml_path: Path, imgsz: int | None, n_images: int, say) -> None:
    """Run ``libreyolo doctor`` with this interpreter when LibreYOLO is installed; raise on its errors.
    It loads torch, then decodes every image: on a busy machine that is a minute or more, so it
    says what runs, then how long it has run, every ``DOCTOR_NOTE_SECONDS``."""
    if importlib.util.find_spec("libreyolo") is None:
        return
    import time

    cmd = [*LIBREYOLO_CLI, "doctor", str(yaml_path), "--json", "--quiet"]
    if imgsz:
        cmd += ["--imgsz", str(imgsz)]
    say(f"      data: libreyolo doctor checks {n_images} images (it loads torch first: this can take a minute)")
    started = time.monotonic()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while True:
        try:
            stdout, stderr = child.communicate(timeout=DOCTOR_NOTE_SECONDS)  # retried: no output is lost
            break
        except subprocess.TimeoutExpired:
            took = time.monotonic() - started
            if took >= DOCTOR_TIMEOUT:
                child.kill()
                child.communicate()
                raise UsageError(f"libreyolo doctor {yaml_path} did not finish in {DOCTOR_TIMEOUT / 60:.0f} "
                                 "minutes") from None
            say(f"      data: libreyolo doctor still checking ({took:.0f} s)")
        except BaseException:  # Ctrl-C: the doctor goes too
            child.kill()
            child.communicate()
            raise
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
    say(f"      data: libreyolo doctor done in {time.monotonic() - started:.0f} s")
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        if proc.returncode:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"libreyolo doctor {yaml_path} failed (exit {proc.returncode}): {tail}")
        return
    if report.get("error"):
        message = str(report.get("message") or report["error"]).splitlines()[0]
        raise UsageError(f"libreyolo doctor: {message}")
    errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
    if errors:
        first = errors[0]
        split = f" [{first['split']}]" if first.get("split") else ""
        example = f" e.g. {first['paths'][0]}" if first.get("paths") else ""
        more = f" (+{len(errors) - 1} more error(s))" if len(errors) > 1 else ""
        raise UsageError(f"libreyolo doctor: {first.get('check_id')}{split}: {first.get('message')}{example}{more}")


# -- pack and extract ---------------------------------------------------------------------------


def pack(info: DatasetInfo, out_tar: Path) -> Path:
    """Write one uncompressed tar: ``<name>/`` with the files and a data.yaml whose paths are relative.

    The yaml inside is JSON (which is YAML), so the instance can rewrite it without PyYAML, and it
    has no ``path:`` key: LibreYOLO resolves a relative ``path:`` against ~/datasets before the yaml's
    folder, so only "no path" (or the absolute one on_instance/extract.py writes) is safe.
    Members are sorted and their metadata fixed, so the same dataset always packs to the same bytes.
    """
    members: dict[str, Path | bytes] = {}
    root = info.root.resolve()
    for f in info.files:
        # A link to a file outside the dataset would carry that file to the instance (or the hub).
        if not f.resolve().is_relative_to(root):
            raise UsageError(f"{f} is a link to {f.resolve()}, outside the dataset folder {info.root}: "
                             "refusing to pack it (copy the file in instead)")
        members[f"{info.name}/{_inside(info, f)}"] = f
    for lst in {p for entries in info.splits.values() for p in entries if p.suffix.lower() == ".txt"}:
        members[f"{info.name}/{_inside(info, lst)}"] = _relative_list(lst)
    members[f"{info.name}/data.yaml"] = _packed_yaml(info)

    out_tar = Path(out_tar)
    out_tar.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_tar.with_name(f".{out_tar.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for arcname in sorted(members):
            src = members[arcname]
            ti = tarfile.TarInfo(arcname)
            ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = _TAR_MTIME, 0o644, 0, 0, "", ""
            if isinstance(src, bytes):
                ti.size = len(src)
                tar.addfile(ti, io.BytesIO(src))
            else:
                ti.size = src.stat().st_size
                with src.open("rb") as fh:
                    tar.addfile(ti, fh)
    os.replace(tmp, out_tar)
    return out_tar


def _inside(info: DatasetInfo, f: Path) -> str:
    try:
        return f.relative_to(info.root).as_posix()
    except ValueError:
        raise UsageError(
            f"{f} is outside the dataset folder {info.root}; the tar holds one folder, so move it in "
            f"(or point 'path:' in {info.yaml_path.name} at a folder that holds everything)"
        ) from None


def _relative_list(lst: Path) -> bytes:
    """An image list whose lines are './'-relative to the list (what both Ultralytics and LibreYOLO read)."""
    lines = []
    for img in _images("list", lst, set()):
        lines.append("./" + Path(os.path.relpath(img, lst.parent)).as_posix())
    return ("\n".join(lines) + "\n").encode()


def _packed_yaml(info: DatasetInfo) -> bytes:
    config: dict = {}
    for split, entries in info.splits.items():
        rel = [_inside(info, e) for e in entries]
        config[split] = rel if len(rel) > 1 else rel[0]
    config["nc"] = info.nc
    config["names"] = list(info.names)
    return (json.dumps(config, indent=2) + "\n").encode()


# -- synth --------------------------------------------------------------------------------------


def synth(dest: Path, n_train: int = 8, n_val: int = 4, imgsz: int = 64, nc: int = 2, seed: int = 0) -> Path:
    """Make a small YOLO dataset at ``dest`` (PNG images of coloured rectangles, their labels, data.yaml).

    Each class has its own colour, so a model can actually learn it. Returns ``dest``.
    """
    rng = random.Random(seed)
    dest = Path(dest)
    palette = [tuple(rng.randrange(40, 256) for _ in range(3)) for _ in range(nc)]
    for split, count in (("train", n_train), ("val", n_val)):
        (dest / "images" / split).mkdir(parents=True, exist_ok=True)
        (dest / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels, boxes = _synth_image(rng, imgsz, palette)
            (dest / "images" / split / f"{i:04d}.png").write_bytes(_png(imgsz, imgsz, pixels))
            lines = [f"{c} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}" for c, cx, cy, w, h in boxes]
            (dest / "labels" / split / f"{i:04d}.txt").write_text("\n".join(lines) + "\n")
    config = {"train": "images/train", "val": "images/val", "nc": nc, "names": [f"class{i}" for i in range(nc)]}
    (dest / "data.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def _synth_image(rng: random.Random, size: int, palette: list) -> tuple[bytearray, list]:
    pixels = bytearray(rng.randrange(0, 40) for _ in range(size * size * 3))  # dark noise background
    boxes = []
    for _ in range(rng.randint(1, 3)):
        cls = rng.randrange(len(palette))
        w, h = rng.randint(size // 5, size // 2), rng.randint(size // 5, size // 2)
        x0, y0 = rng.randint(0, size - w), rng.randint(0, size - h)
        for y in range(y0, y0 + h):
            row = (y * size + x0) * 3
            pixels[row : row + w * 3] = bytes(palette[cls]) * w
        boxes.append((cls, (x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size))
    return pixels, boxes


def _png(width: int, height: int, rgb: bytes) -> bytes:
    """A minimal 8-bit RGB PNG (no PIL needed)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[y * stride : (y + 1) * stride]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


# -- disk size ----------------------------------------------------------------------------------

# Parameters (millions) of the detection models people train, by family and size: published counts,
# yolo9-t counted from a real checkpoint. A LibreYOLO checkpoint holds the model, its training copy,
# the EMA and the optimizer state: 12.5 bytes a parameter with SGD (measured: yolo9-t, 2.78 M
# parameters, 34.9 MB), about 16.5 with AdamW (one more fp32 state), which the DETR families use.
_PARAMS_M = {
    "yolo9": {"t": 2.8, "s": 7.2, "m": 20.1, "c": 25.5, "e": 58.1},
    "yolox": {"n": 0.91, "t": 5.06, "s": 8.97, "m": 25.3, "l": 54.2, "x": 99.1},
    "rtmdet": {"t": 4.8, "s": 8.9, "m": 24.7, "l": 52.3, "x": 94.9},
    "picodet": {"s": 1.2, "m": 3.5, "l": 5.8},
    "dfine": {"n": 3.8, "s": 10.2, "m": 19.2, "l": 31.2, "x": 62.5},
    "rtdetr": {"r18": 20.0, "r34": 31.0, "r50": 42.0, "r101": 76.0},
    "rfdetr": {"n": 30.5, "s": 32.1, "m": 33.7, "b": 29.0, "l": 128.0},
}
_ALIASES = {"yolo9_e2e": "yolo9", "yolo9_p2": "yolo9", "deim": "dfine", "deimv2": "dfine", "rtdetrv2": "rtdetr"}
_ADAMW = {"dfine", "rtdetr", "rfdetr"}
_DEFAULT_MODEL = "yolox-s"  # libreyolo train's default model
_DEFAULT_EPOCHS, _DEFAULT_SAVE_PERIOD = 300, 10  # and its default epochs and save_period
_UNKNOWN_CHECKPOINT_MB = 500


def checkpoint_mb(model: str | None) -> tuple[float, str]:
    """(estimated MB of one training checkpoint, the model name it was read as, or why not)."""
    name = (model or _DEFAULT_MODEL).lower()
    name = re.sub(r"\.pt$", "", Path(name).name)
    name = re.sub(r"^libre", "", name)
    m = re.fullmatch(r"([a-z0-9_]+?)[-_]?(n|t|s|m|l|x|c|e|b|r18|r34|r50|r101)", name)
    family = _ALIASES.get(m.group(1), m.group(1)) if m else None
    params = _PARAMS_M.get(family, {}).get(m.group(2)) if m else None
    if params is None:
        return float(_UNKNOWN_CHECKPOINT_MB), f"{model} (size unknown, assumed)"
    return round(params * (16.5 if family in _ADAMW else 12.5), 1), f"{family}-{m.group(2)}"


def suggest_disk_gb(
    data_bytes: int,
    model: str | None,
    epochs: int | None,
    save_period: int | None,
    base_gb: float = 15,
) -> tuple[int, str]:
    """The disk rule of "Training on a rented GPU": data ×2 (tar + extracted) + checkpoints + environment,
    plus 30 %, whole GB (a disk bills for what is allocated and cannot shrink later)."""
    data_gb = 2 * data_bytes / GB
    ckpt_mb, read_as = checkpoint_mb(model)
    epochs = _DEFAULT_EPOCHS if epochs is None else epochs
    save_period = _DEFAULT_SAVE_PERIOD if save_period is None else save_period
    snapshots = epochs // save_period if save_period > 0 else 0
    n_ckpt = 2 + snapshots  # best.pt + last.pt + weights/epoch_N.pt every save_period
    ckpt_gb = n_ckpt * ckpt_mb * 1e6 / GB
    # round() first: 1.3 × 10 is 13.000000000000002 in binary, and ceil would make it 14
    total = math.ceil(round((data_gb + ckpt_gb + base_gb) * 1.3, 6))
    why = (
        f"{total} GB = 1.3 × ({data_gb:.2f} GB data [tar + extracted]"
        f" + {ckpt_gb:.2f} GB checkpoints [{n_ckpt} × {ckpt_mb:g} MB {read_as}: best, last, {snapshots} epoch_N]"
        f" + {base_gb:g} GB environment), rounded up"
    )
    return total, why
