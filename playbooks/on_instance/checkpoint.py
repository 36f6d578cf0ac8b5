"""Whether a LibreYOLO checkpoint can be resumed from: it exists, it loads, and the epochs it holds.

    python checkpoint.py PATH   ->   ORCH_RESULT {"exists", "loads", "epoch", "size", "error"}

LibreYOLO writes last.pt with a plain ``torch.save`` (not atomic): a process killed mid-write (a
preemption, a SIGKILL) leaves a torn file that ``--resume`` would crash on. Loading it is the only
honest check. ``epoch`` is the number of epochs completed (LibreYOLO stores the 0-based index of
the last one; its resume continues at that + 1). Needs torch, like the training itself.
"""
import json
import os
import sys

path = sys.argv[1]
out = {"exists": os.path.isfile(path) and not os.path.islink(path), "loads": False, "epoch": None, "size": None,
       "error": None}
if out["exists"]:
    out["size"] = os.path.getsize(path)
    try:
        import torch

        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        out["loads"] = True
        if isinstance(ckpt, dict) and isinstance(ckpt.get("epoch"), int):
            out["epoch"] = ckpt["epoch"] + 1
    except Exception as e:  # noqa: BLE001 - whatever fails to load is not a checkpoint to resume
        out["error"] = f"{type(e).__name__}: {e}"[:300]
print("ORCH_RESULT " + json.dumps(out))
