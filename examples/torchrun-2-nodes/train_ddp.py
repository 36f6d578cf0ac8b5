"""A DistributedDataParallel step loop: torchrun sets RANK/WORLD_SIZE/LOCAL_RANK from the flags the
task passes (ORCH_NODE_RANK, ORCH_MASTER_ADDR, ...). Rank 0 writes the checkpoint and the output.
STEPS (default 100) and STEP_SLEEP (seconds, default 0) size the run."""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
world = dist.get_world_size()
steps, pause = int(os.environ.get("STEPS", "100")), float(os.environ.get("STEP_SLEEP", "0"))
print(f"rank {rank} of world {world} on node {os.environ.get('ORCH_NODE_RANK', '0')}", flush=True)
device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).to(device),
                                                  device_ids=[local] if device.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = Path(os.environ.get("ORCH_CHECKPOINT_DIR", "ckpt"))
start = 0
if (ckpt / "state.pt").exists():
    state = torch.load(ckpt / "state.pt", map_location=device, weights_only=True)
    model.module.load_state_dict(state["model"])
    start = state["step"]
    print(f"rank {rank} resumed at step {start}", flush=True)
for step in range(start + 1, steps + 1):
    loss = model(torch.randn(32, 1024, device=device)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(pause)
    if rank == 0 and step % 10 == 0:
        ckpt.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "step": step}, ckpt / ".state.tmp")
        os.replace(ckpt / ".state.tmp", ckpt / "state.pt")
if rank == 0:
    Path("out").mkdir(exist_ok=True)
    torch.save(model.module.state_dict(), "out/model.pt")
    (Path("out") / "run.txt").write_text(f"world {world}\nresumed from step {start}\nended at step {steps}\n")
dist.destroy_process_group()
