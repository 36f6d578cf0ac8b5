"""Proof that the device works: a real 2000x2000 matmul, not just is_available() (which a wheel built
for another GPU architecture passes before failing with "no kernel image is available").

    python verify_device.py gpu|cpu   ->   ORCH_RESULT {"ok", "device", "result", "error", "kind"}

``probe.py`` imports ``prove`` and answers with its proof as well: one torch import per provisioning
instead of two (an import of torch is seconds of CPU on a small instance).

A proof holds for the boot it was made in (``remembered``/``remember``): a provisioning again in
the same boot, with the same Python, the same torch and LibreYOLO files and the same GPUs, within
``PROOF_TTL_S``, answers with that proof and imports no torch. That is an ``orch up`` again on an
instance already up, a retry on the same machine, and every ``local`` instance (they are all this
one machine). A reboot, a new container (its /tmp is new), a reinstalled torch or a GPU that left
``nvidia-smi``'s list is a new key, so a new proof. ``ORCH_FRESH_PROOF=1`` always proves anew.
"""
from __future__ import annotations

import json
import os
import sys
import time

PROOF_TTL_S = 3600


def prove(want_gpu: bool) -> dict:
    out = {"ok": False, "device": None, "result": None, "error": None, "kind": None}
    try:
        import torch

        if want_gpu:
            if not torch.cuda.is_available():
                raise RuntimeError(f"no CUDA device is available to torch {torch.__version__}")
            dev = "cuda"
            out["device"] = torch.cuda.get_device_name(0)
            out["count"] = torch.cuda.device_count()
        else:
            dev = "cpu"
            import platform

            out["device"] = f"cpu ({platform.processor() or platform.machine()})"
        x = torch.rand(2000, 2000, device=dev)
        out["result"] = float((x @ x).sum())
        out["ok"] = out["result"] > 0
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
        out["error"] = msg[:500]
        if "no kernel image is available" in msg:
            out["kind"] = "no-kernel-image"
    return out


def proof_key(want_gpu: bool, gpus: list, driver_cuda) -> str | None:
    """What a proof stands on, hashed; None where it cannot be told without importing torch (no
    boot id: not Linux; torch or LibreYOLO not found), or when asked to prove anew."""
    import hashlib
    import importlib.util

    if os.environ.get("ORCH_FRESH_PROOF", "") not in ("", "0"):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        parts = {"boot": boot, "uid": os.getuid(), "python": os.path.realpath(sys.executable),
                 "prefix": sys.prefix, "path": sys.path[1:],  # [0]: the script's own folder
                 "gpu": want_gpu, "gpus": gpus, "driver": driver_cuda,
                 "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
        for name in ("torch", "libreyolo"):
            spec = importlib.util.find_spec(name)
            st = os.stat(spec.origin)
            parts[name] = [spec.origin, st.st_mtime_ns, st.st_size, st.st_ino]
    except (OSError, ValueError, AttributeError, TypeError, ImportError):
        return None
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _folder() -> str | None:
    """This user's folder of proofs in the temporary directory: made private, and refused unless it
    is a real folder of this user's that no one else can write (nobody may plant a proof)."""
    import stat
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"orch-proof-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path


def remembered(key: str | None) -> dict | None:
    """The proof made under ``key`` in this boot, within ``PROOF_TTL_S``: {"at", "torch": {...}, "proof": {...}}."""
    folder = _folder() if key else None
    if not folder:
        return None
    try:
        fd = os.open(os.path.join(folder, key + ".json"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            got = json.load(f)
        at, proof, torch_facts = got["at"], got["proof"], got["torch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fresh = isinstance(at, (int, float)) and 0 <= time.time() - at <= PROOF_TTL_S
    if not (fresh and isinstance(proof, dict) and proof.get("ok") is True and isinstance(torch_facts, dict)):
        return None
    return got


def remember(key: str | None, torch_facts: dict, proof: dict) -> None:
    """Keep a passed proof under ``key`` (written whole, then renamed into place)."""
    folder = _folder() if key else None
    if not folder or proof.get("ok") is not True:
        return
    tmp = os.path.join(folder, f".{key}.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump({"at": time.time(), "torch": torch_facts, "proof": proof}, f)
        os.replace(tmp, os.path.join(folder, key + ".json"))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


if __name__ == "__main__":
    print("ORCH_RESULT " + json.dumps(prove(sys.argv[1] == "gpu")))
