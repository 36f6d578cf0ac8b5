"""orch demo: the whole job on this machine."""

from __future__ import annotations

import typer

from orchestrator.cli.app import app, open_orch, out, say
from orchestrator.errors import OrchError, UsageError


@app.command()
def demo(epochs: int = typer.Option(3, help="Epochs of the tiny CPU training."),
         keep: bool = typer.Option(False, "--keep", help="Leave the instance up instead of destroying it.")):
    """The whole job on this machine: synthetic data, a local instance, a real CPU training, weights home."""
    import secrets
    import time

    from orchestrator.tasks import dataset
    from orchestrator.provider import plugins
    from orchestrator.runs import runs, training
    from orchestrator.provider import Request

    if not 1 <= epochs <= 100:
        raise UsageError(f"--epochs must be between 1 and 100 for the demo, not {epochs}")
    orch = open_orch()
    t0 = time.monotonic()
    data = dataset.synth(orch.home / "demo" / "data", n_train=16, n_val=8, imgsz=64)
    say(f"demo dataset: {data} (synthetic, 24 images, 2 classes)")
    spec = training.prepare(training.TrainSpec(data=str(data), model="yolo9-t", epochs=epochs, imgsz=64, batch=4,
                                               train_args={"workers": "0"}), orch.home, say)
    name = f"demo-{secrets.token_hex(2)}"
    holder = {}
    inst = orch.up(name, plugins.embedded(), Request(name=name, cpu=True, disk_gb=training.disk_for(spec)[0]),
                   after_verify=lambda i: holder.update(run=training.launch(orch, i, spec)))
    run = holder["run"]
    view = runs.follow(orch, inst, run)
    got, where = runs.pull(orch, inst, run, view=view)
    if not keep:
        inst = orch.down(inst, "demo finished")
    out(f"demo {view['state']} in {time.monotonic() - t0:.0f} s: {inst.name} on {inst.provider} is {inst.state}")
    out(f"  trained  yolo9-t, {view.get('completed_epochs') or view.get('epoch')}/{view['epochs']} epochs on the CPU, "
        f"final loss {view['loss']:.4f}" if view.get("loss") is not None else "  trained  -")
    out(f"  weights  {where / 'weights' / 'best.pt'}")
    out(f"  ledger   orch status {inst.name}")
    if view["state"] != "completed":
        raise OrchError(f"the demo training ended {view['state']}: see {where / 'train.log'}")
