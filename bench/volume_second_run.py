"""A LibreYOLO job's second run on a volume against its first: the staging a volume saves.

Three LibreYOLO runs of the same dataset on the local provider, one after the other (``orch up NAME
--cpu --data DS``: a real instance, the data staged, the training started; then ``orch down``: the
training itself is not what is measured), each timed as the instance's own record says (the event
``dataset ... in N s``, from the start of the staging to the dataset ready):

1. no volume: the dataset uploaded over SFTP and unpacked, as every new machine does today;
2. the first run on a volume: uploaded and unpacked onto it, its checksums recorded in the ledger;
3. the second run on the same volume: every file as recorded, nothing uploaded, nothing unpacked.

The ratio is the first run on the volume over the second (what a second run saves), with the run
without a volume beside them (what the first run's checksums cost). The dataset is noise PNGs
(incompressible, as photos are): ``--images`` of ``--size`` px, about 3 bytes a pixel. On the local
provider the upload crosses loopback, the fastest a network ever is: on a rented host the first
figures grow with the dataset over the real network; the second stays what hashing it costs there.

    .venv/bin/python bench/volume_second_run.py [--images 64] [--size 1024] [--quick]

``--quick`` (the tests): 8 images of 64 px, and the two runs on the volume alone (each run is a real
instance provisioned and a LibreYOLO training started: the one without a volume added a third).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def orch(*args: str, home: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "ORCH_HOME": str(home)})
    if done.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def noise_dataset(dest: Path, images: int, size: int) -> int:
    """A YOLO dataset of ``images`` noise PNGs (a box each); returns its bytes."""
    from orchestrator.tasks.dataset import _png

    rng = random.Random(0)
    total = 0
    for split, count in (("train", images - max(images // 4, 1)), ("val", max(images // 4, 1))):
        (dest / "images" / split).mkdir(parents=True, exist_ok=True)
        (dest / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            png = _png(size, size, os.urandom(size * size * 3))
            (dest / "images" / split / f"{i:04d}.png").write_bytes(png)
            total += len(png)
            w, h = rng.uniform(0.1, 0.5), rng.uniform(0.1, 0.5)
            (dest / "labels" / split / f"{i:04d}.txt").write_text(f"0 0.5 0.5 {w:.4f} {h:.4f}\n")
    (dest / "data.yaml").write_text("train: images/train\nval: images/val\nnc: 1\nnames: [thing]\n")
    return total


def run(name: str, data: Path, home: Path, volume: str | None) -> tuple[float, str]:
    """One LibreYOLO run brought up and ended; (seconds its staging took, what the instance recorded)."""
    args = ["up", name, "--cpu", "--data", str(data), "--epochs", "1", "--imgsz", "64", "--batch", "4",
            "--train-arg", "workers=0"]
    if volume:
        args += ["--volume", f"{volume}:~/vol"]
    orch(*args, home=home)
    inst = json.loads(orch("status", name, "--json", home=home))
    orch("down", name, "--no-pull", "--yes", home=home)
    said = next(e["reason"] for e in inst["events"] if e["reason"].startswith("dataset "))
    return float(said.rsplit(" in ", 1)[1].split()[0]), said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", type=int, default=1024, help="each image's side, px")
    parser.add_argument("--quick", action="store_true", help="a tiny dataset (the tests)")
    args = parser.parse_args()
    images, size = (8, 64) if args.quick else (args.images, args.size)
    with tempfile.TemporaryDirectory(prefix="orch-volume-bench-") as tmp:
        home = Path(os.environ.get("ORCH_HOME") or Path(tmp) / "orch")
        data = Path(tmp) / "noise"
        mb = noise_dataset(data, images, size) / 1e6
        orch("volume", "create", "bench", "--provider", "local", "--size", "10", home=home)
        t0 = time.monotonic()
        plain = None if args.quick else run("plain", data, home, None)[0]
        first, first_said = run("first", data, home, "bench")
        second, second_said = run("second", data, home, "bench")
        orch("volume", "rm", "bench", "--yes", home=home)
    print(f"{images} noise PNGs of {size}x{size} px ({mb:.1f} MB), {2 if plain is None else 3} LibreYOLO runs on the local "
          f"provider ({time.monotonic() - t0:.0f} s in all); the dataset's staging, as each instance recorded it:")
    if plain is not None:
        print(f"  no volume                    {plain:7.2f} s")
    print(f"  first run on the volume      {first:7.2f} s   ({first_said.split(' ', 2)[2]})")
    print(f"  second run on the volume     {second:7.2f} s   ({second_said.split(' ', 2)[2]})")
    print(f"  saved by the second run      {first - second:7.2f} s")
    beside = "" if plain is None else f" (no volume: {plain / max(second, 0.05):.1f}x)"
    print(f"ratio: the first run's staging is {first / max(second, 0.05):.1f}x the second's{beside}")


if __name__ == "__main__":
    main()
