"""This machine's GPUs, as the local provider rents them."""

from __future__ import annotations

import shutil
import subprocess


def local_gpus() -> list[str]:
    """GPU names on this machine, from nvidia-smi (empty where there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def local_vram_gb() -> float:
    smi = shutil.which("nvidia-smi")
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout if smi else ""
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0.0
