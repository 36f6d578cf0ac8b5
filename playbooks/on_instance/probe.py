"""Run on the instance by the instance's Python: ``probe.py gpu|cpu [PACKAGE ...]``, what torch and
each package it has, and whether they work.

Standard library only at the top: torch may be missing or broken here. Where torch and every package
import, it proves the device too (``verify_device.prove``, its sibling): ``proof`` in the answer.
A proof made earlier in this boot on the same footing (``verify_device.remembered``) is answered
instead, without importing torch; its ``proved_at`` says when it was made.
"""
import json
import re
import shutil
import subprocess
import sys
from importlib.metadata import version

want_gpu = sys.argv[1] == "gpu"
packages = sys.argv[2:]  # what the provisioning installs over torch, each imported by its name
facts = {"python": sys.executable, "torch": None, "torchvision": None, "torch_cuda": None,
         "cuda_ok": False, "packages": {}, "package_errors": {}, "driver_cuda": None, "gpus": [], "error": None}

smi = shutil.which("nvidia-smi")
if smi:
    try:
        out = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"CUDA Version:\s*([0-9.]+)", out)
        facts["driver_cuda"] = m.group(1) if m else None
        names = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout
        facts["gpus"] = [n.strip() for n in names.splitlines() if n.strip()]
    except (OSError, subprocess.TimeoutExpired):
        pass

from verify_device import proof_key, remember, remembered, prove  # noqa: E402 (standard library only)

TORCH_FACTS = ("torch", "torch_cuda", "cuda_ok")  # what a proof kept for the boot holds of torch
key = proof_key(want_gpu, facts["gpus"], facts["driver_cuda"])
earlier = remembered(key)
if earlier:
    facts.update({k: earlier["torch"].get(k) for k in TORCH_FACTS})
else:
    try:
        import gc

        gc.set_threshold(10_000, 10, 10)  # importing torch makes millions of objects: fewer passes (train_entry.py)
        import torch

        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        if want_gpu and torch.cuda.is_available():
            # is_available() is True for a wheel built for another architecture: run a real kernel.
            facts["cuda_ok"] = float((torch.ones(8, device="cuda") * 2).sum()) == 16.0
    except Exception as e:  # noqa: BLE001 - anything here means "this torch does not work"
        facts["error"] = f"{type(e).__name__}: {e}"
try:
    # Its version only (what pip holds it at when a package is installed over torch), read from what pip
    # recorded: importing torchvision imports torch._dynamo, a second of CPU per provisioning.
    facts["torchvision"] = version("torchvision")
except Exception:  # noqa: BLE001
    pass
for name in packages:
    try:
        __import__(name)  # an import that fails means it must be (re)installed

        facts["packages"][name] = version(name)
    except Exception as e:  # noqa: BLE001
        facts["packages"][name] = None
        facts["package_errors"][name] = f"{type(e).__name__}: {e}"[:300]
if facts["torch"] and not facts["error"] and all(facts["packages"].values()):
    if earlier:
        facts["proof"] = {**earlier["proof"], "proved_at": earlier["at"]}
    else:
        facts["proof"] = prove(want_gpu)
        if facts["cuda_ok"] or not want_gpu:
            remember(key, {k: facts[k] for k in TORCH_FACTS}, facts["proof"])
print("ORCH_RESULT " + json.dumps(facts))
