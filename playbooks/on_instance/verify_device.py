"""Proof that the device works: a real 2000x2000 matmul, not just is_available() (which a wheel built
for another GPU architecture passes before failing with "no kernel image is available").

    python verify_device.py gpu|cpu   ->   ORCH_RESULT {"ok", "device", "result", "error", "kind"}

``probe.py`` imports ``prove`` and answers with its proof as well: one torch import per provisioning
instead of two (an import of torch is seconds of CPU on a small instance).
"""
import json
import sys


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


if __name__ == "__main__":
    print("ORCH_RESULT " + json.dumps(prove(sys.argv[1] == "gpu")))
