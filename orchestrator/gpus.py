"""GPU names as every provider spells them, made one; and how fast each GPU type trains.

``canonical("NVIDIA GeForce RTX 4090") == canonical("RTX_4090") == canonical("4090") == "RTX 4090"``.
Names the table does not know come back tidied (vendor words dropped), never invented.

The relative-throughput table is a PRIOR, used only when orch has no measurement of its own
(the ledger's runs and ``orch trial`` always win, see orchestrator/money/offers.py). Its source:
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Shown beside every estimate that used the table, so nobody mistakes it for a measurement.
THROUGHPUT_SOURCE = (
    "NVIDIA/AMD datasheet figures: dense FP16/BF16 tensor TFLOPS (FP32 accumulate, no sparsity) and "
    "memory bandwidth; relative speed = sqrt(TFLOPS ratio x bandwidth ratio) against the RTX 4090. "
    "Small detectors rarely saturate big GPUs, so this flatters datacenter parts: measure with `orch trial`"
)


@dataclass(frozen=True)
class GPU:
    name: str
    vram_gb: tuple[float, ...]  # the sizes it ships with
    tflops: float  # datasheet: dense FP16/BF16 tensor TFLOPS with FP32 accumulate
    bandwidth: float  # datasheet: memory bandwidth, GB/s
    aliases: tuple[str, ...] = ()

    @property
    def relative(self) -> float:
        """Training speed relative to the reference GPU (see THROUGHPUT_SOURCE)."""
        return math.sqrt(self.tflops / REFERENCE.tflops * self.bandwidth / REFERENCE.bandwidth)


# Datasheet numbers (whitepapers for GeForce, whose FP32-accumulate rate is half the FP16 one).
TABLE = (
    GPU("RTX 5090", (32,), 209.5, 1792),
    GPU("RTX 4090", (24,), 165.2, 1008),
    GPU("RTX 4080 SUPER", (16,), 104.4, 736, ("RTX 4080S",)),
    GPU("RTX 4080", (16,), 97.5, 717),
    GPU("RTX 3090 Ti", (24,), 80.0, 1008),
    GPU("RTX 3090", (24,), 71.0, 936),
    GPU("RTX 3080", (10, 12), 59.5, 760),
    GPU("RTX 6000 Ada", (48,), 364.2, 960, ("RTX 6000 Ada Generation", "RTX 6000Ada")),
    GPU("RTX 4000 Ada", (20,), 81.9, 360, ("RTX 4000 Ada Generation", "RTX 4000Ada")),
    GPU("RTX 2000 Ada", (16,), 48.0, 224, ("RTX 2000 Ada Generation", "RTX 2000Ada")),
    GPU("RTX A6000", (48,), 154.8, 768, ("A6000",)),  # Lambda and users write "A6000"
    GPU("RTX A5000", (24,), 111.1, 768, ("A5000",)),
    GPU("RTX A4500", (20,), 94.6, 640, ("A4500",)),
    GPU("RTX A4000", (16,), 76.7, 448, ("A4000",)),
    GPU("L40S", (48,), 362.1, 864),
    GPU("L40", (48,), 181.0, 864),
    GPU("L4", (24,), 121.0, 300),
    GPU("A40", (48,), 149.7, 696),
    GPU("A10", (24,), 125.0, 600),
    GPU("T4", (16,), 65.0, 320),
    GPU("V100 SXM", (16, 32), 125.0, 900, ("V100 SXM2", "V100")),
    GPU("V100 PCIe", (16, 32), 112.0, 900),
    GPU("A100 SXM", (40, 80), 312.0, 2039, ("A100 SXM4",)),
    GPU("A100 PCIe", (40, 80), 312.0, 1935),
    # RunPod's id for the SXM part is "NVIDIA H100 80GB HBM3"; the PCIe card has HBM2e.
    GPU("H100 SXM", (80,), 989.4, 3350, ("H100 SXM5", "H100 HBM3")),
    GPU("H100 PCIe", (80,), 756.0, 2000),
    GPU("H100 NVL", (94,), 835.5, 3900),
    GPU("H200", (141,), 989.4, 4800, ("H200 SXM",)),
    GPU("B200", (180, 192), 2250.0, 8000),
    GPU("MI300X", (192,), 1307.4, 5300),
)
REFERENCE = next(g for g in TABLE if g.name == "RTX 4090")

_VENDOR = re.compile(r"\b(nvidia|geforce|tesla|amd|instinct|oam)\b", re.I)
_MEMORY = re.compile(r"\b\d+\s*gb\b")


def _key(name: str) -> str:
    s = name.lower().replace("_", " ").replace("-", " ")
    s = _VENDOR.sub(" ", s)
    s = _MEMORY.sub(" ", s)
    s = re.sub(r"\bsuper\b", "s", s)
    s = re.sub(r"\bgeneration\b", " ", s)
    s = re.sub(r"(\d)([a-z])", r"\1 \2", s)  # "4080s" -> "4080 s", "6000ada" -> "6000 ada"
    return " ".join(s.split())


_BY_KEY: dict[str, GPU] = {}
for _gpu in TABLE:
    for _alias in (_gpu.name, *_gpu.aliases):
        _BY_KEY[_key(_alias)] = _gpu


def lookup(name: str | None) -> GPU | None:
    """The table's entry for any spelling of a GPU, or None when the table does not know it."""
    if not name:
        return None
    key = _key(name)
    if key in _BY_KEY:
        return _BY_KEY[key]
    if re.fullmatch(r"\d{4}( ti| s)?", key):  # a bare GeForce model number: "4090", "3090 ti"
        return _BY_KEY.get("rtx " + key)
    return None


def canonical(name: str | None) -> str:
    """One name per GPU type, whoever spelled it; an unknown name comes back tidied."""
    gpu = lookup(name)
    if gpu:
        return gpu.name
    tidy = " ".join(_VENDOR.sub(" ", (name or "").replace("_", " ")).split())
    return tidy or "?"


def matches(wanted: str, name: str) -> bool:
    """Whether an offer's GPU is what ``--gpu`` asked for: the exact type when the table knows
    the request ("RTX 3090" is not the 3090 Ti), else a family ("A100": PCIe and SXM)."""
    if lookup(wanted):
        return canonical(wanted) == canonical(name)
    want = _key(wanted)
    have = _key(canonical(name))
    return have == want or have.startswith(want + " ")


def vram(name: str | None, reported_gb: float) -> float:
    """VRAM per GPU in GB, snapped to the size the card ships with when the report is within 6 %
    (Vast reports MiB: 24564 MiB is a 24 GB card, 81559 MiB an 80 GB one)."""
    gpu = lookup(name)
    if gpu and reported_gb:
        nearest = min(gpu.vram_gb, key=lambda v: abs(v - reported_gb))
        if abs(nearest - reported_gb) <= 0.06 * nearest:
            return float(nearest)
    return round(float(reported_gb or 0.0), 1)


def relative(name: str | None) -> float | None:
    gpu = lookup(name)
    return gpu.relative if gpu else None
