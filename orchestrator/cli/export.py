"""``orch export modal|beam NAME``: the job of ``orch run`` as one Modal or Beam app file (see ``orchestrator.export``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from orchestrator.cli.app import app, out, say

export_app = typer.Typer(help="Write the job as a serverless app (Modal or Beam) to run with its own CLI.",
                         no_args_is_help=True)
app.add_typer(export_app, name="export")


def _export(platform: str, name: str, data: Optional[str], model: str, epochs: int, imgsz: Optional[int],
            batch: Optional[int], save_period: Optional[int], train_arg: Optional[List[str]], push_to: Optional[str],
            gpu: Optional[str], gpus: int, max_hours: Optional[float], retries: int, volume: str,
            output: Optional[str], force: bool) -> None:
    from orchestrator import export, jobs
    from orchestrator.runs import training
    from orchestrator.errors import UsageError

    # Every check before anything is written.
    jobs.check_job_name(name)
    max_hours = export.check_max_hours(max_hours)
    export.check_data(data)
    spec = training.TrainSpec(data=data, model=model, epochs=epochs, imgsz=imgsz, batch=batch, save_period=save_period,
                              train_args=training.parse_train_args(train_arg or []), push_to=push_to)
    training.check_spec(spec)
    if spec.save_period is None:
        spec.save_period = training.default_save_period(epochs)  # milestones on the volume, as `orch run` keeps them
    gpu_name = export.gpu_name(platform, gpu, gpus)
    if not 0 <= retries <= jobs.MAX_RETRIES:
        raise UsageError(f"--retries must be between 0 and {jobs.MAX_RETRIES}, not {retries}")
    export.check_volume(volume)
    keys = training.train_keys(spec, data_yaml="", project="", name=name, gpus=gpus, cpu=False)
    for runtime in ("data", "project", "name", "exist_ok"):
        keys.pop(runtime)
    export.check_train(keys)
    target = Path(output or f"{name}_{platform}.py").expanduser()
    job = export.ExportSpec(platform=platform, name=name, data=data, gpu=gpu_name, gpus=gpus, max_hours=max_hours,
                            retries=retries, volume=volume, train=keys, epochs=epochs, model=model, push_to=push_to)
    path = export.write(job, target, force)
    plat = export.platform(platform)
    say(f"wrote {path}: {gpus} x {gpu_name}, timeout {job.timeout_s} s per attempt"
        + (f" ({job.calls} calls cover --max-hours {max_hours:g})" if job.calls > 1 else "")
        + f", {retries} retries, volume {volume!r}")
    if export.sdk_installed(platform):
        got = export.verify(job, path)
        say(f"      checked offline with {platform}'s SDK: gpu {got['gpu']}, timeout {got['timeout']} s, "
            f"volumes {got['volumes']}")
    else:
        say(f"      {platform}'s SDK is not installed here, so the file was not checked: {plat.install}")
    out(plat.run.format(file=path))


def _command(platform: str):
    def command(
        name: str = typer.Argument(..., help="The job's name: the app is orch-NAME, the run runs/NAME on the volume."),
        data: Optional[str] = typer.Option(None, help="The dataset: hf://ORG/REPO/FILE.tar (`orch data push` makes one)."),
        model: str = typer.Option("yolo9-t", help="LibreYOLO model to train."),
        epochs: int = typer.Option(10, help="Epochs to train."),
        imgsz: Optional[int] = typer.Option(None, help="Training image size."),
        batch: Optional[int] = typer.Option(None, help="Batch size (default -1: LibreYOLO's autobatch)."),
        save_period: Optional[int] = typer.Option(None, help="Save weights/epoch_N.pt every N epochs "
                                                             "(default: about ten per job)."),
        train_arg: Optional[List[str]] = typer.Option(None, "--train-arg", help="Extra LibreYOLO train key=value "
                                                                                "(repeatable)."),
        push_to: Optional[str] = typer.Option(None, help="Also upload milestones to hf://ORG/REPO as they are saved."),
        gpu: Optional[str] = typer.Option(None, help=f"GPU type, as {platform} or orch names it (required)."),
        gpus: int = typer.Option(1, help="Number of GPUs in the container."),
        max_hours: Optional[float] = typer.Option(None, help="Required: the timeout, and the deadline over every "
                                                             "attempt."),
        retries: int = typer.Option(3, help="Retries of a failed or preempted attempt (each resumes from last.pt)."),
        volume: str = typer.Option("orch", help="The volume for runs/NAME and HF_HOME (created if missing)."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help=f"The file to write (default NAME_{platform}.py)."),
        force: bool = typer.Option(False, "--force", help="Replace the file if it exists."),
    ):
        _export(platform, name, data, model, epochs, imgsz, batch, save_period, train_arg, push_to, gpu, gpus,
                max_hours, retries, volume, output, force)

    command.__doc__ = (f"Write the training job as a {platform.capitalize()} app file (timeout, volume, resume from "
                       f"last.pt) and print the command that runs it.")
    return command


export_app.command("modal")(_command("modal"))
export_app.command("beam")(_command("beam"))
