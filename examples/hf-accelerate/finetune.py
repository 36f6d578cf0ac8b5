"""Fine-tune a causal language model with Accelerate: a tiny GPT-2 made from a config (no
download), random token data, a few steps. Accelerate's state goes to $ORCH_CHECKPOINT_DIR after
every step and is loaded from there on start, so a relaunched job continues; the model ends in out/.
"""
import argparse
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()

accelerator = Accelerator()
accelerator.print(f"world {accelerator.num_processes} process(es), {accelerator.distributed_type.value}")
torch.manual_seed(0)
config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, config.vocab_size, (64, 16))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=8, shuffle=False)
model, opt, loader = accelerator.prepare(model, opt, loader)

ckpt = Path(os.environ.get("ORCH_CHECKPOINT_DIR", "ckpt"))
step_file = ckpt / "step.txt"
start = 0
if step_file.exists():
    accelerator.load_state(str(ckpt / "state"))
    start = int(step_file.read_text())
    accelerator.print(f"resumed at step {start}")

step = start
while step < args.steps:
    for (batch,) in loader:
        if step >= args.steps:
            break
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        step += 1
        accelerator.save_state(str(ckpt / "state"))
        if accelerator.is_main_process:
            tmp = ckpt / ".step.tmp"
            tmp.write_text(str(step))
            os.replace(tmp, step_file)
        accelerator.print(f"step {step} loss {loss.item():.4f}")

accelerator.wait_for_everyone()
if accelerator.is_main_process:
    accelerator.unwrap_model(model).save_pretrained("out/model", safe_serialization=True)
    Path("out/steps.txt").write_text(f"{step}\n")
    Path("out/world.txt").write_text(f"{accelerator.num_processes}\n")
accelerator.print("done")
