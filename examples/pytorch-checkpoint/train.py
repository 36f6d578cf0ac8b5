"""Fit y = 3x + 1 with plain PyTorch, checkpointing every step into $ORCH_CHECKPOINT_DIR.

Resumes from the checkpoint found there (orch restores it after a lost machine). The checkpoint
is written to a temporary name and renamed, so a copy never meets half a file; steps.txt records
every step done, once, across machines.
"""
import argparse
import os
from pathlib import Path

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

ckpt_dir = Path(os.environ.get("ORCH_CHECKPOINT_DIR", "ckpt"))
ckpt_dir.mkdir(parents=True, exist_ok=True)
state_path, steps_path = ckpt_dir / "state.pt", ckpt_dir / "steps.txt"

torch.manual_seed(0)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=float(os.environ.get("LR", "0.05")))
start = 0
if state_path.exists():
    state = torch.load(state_path, weights_only=True)  # it came from another (rented) machine: tensors only
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    print(f"resumed at step {start} from {state_path}", flush=True)

x = torch.linspace(-1, 1, 64).unsqueeze(1)
y = 3 * x + 1
for step in range(start + 1, args.steps + 1):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(steps_path, "a") as f:
        f.write(f"{step}\n")
    tmp = ckpt_dir / ".state.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, state_path)
    print(f"step {step} loss {loss.item():.4f}", flush=True)

out = Path("out")
out.mkdir(exist_ok=True)
torch.save(model.state_dict(), out / "model.pt")
(out / "steps.txt").write_text(steps_path.read_text())
print(f"done: weight {model.weight.item():.3f}, bias {model.bias.item():.3f}", flush=True)
