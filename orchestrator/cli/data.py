"""orch data: datasets staged where every provider can fetch them fast."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from orchestrator.cli.app import app, out

data_app = typer.Typer(help="Datasets: stage them where every provider can fetch them fast.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("push")
def data_push(folder: str = typer.Argument(..., help="A YOLO dataset folder with data.yaml."),
              repo: str = typer.Argument(..., help="The Hugging Face dataset repo, ORG/REPO.")):
    """Pack a dataset as one tar and upload it to a Hugging Face dataset repo (HF_TOKEN from the environment)."""
    from orchestrator.tasks import hub

    uri = hub.push_dataset(Path(folder).expanduser(), repo, token=os.environ.get("HF_TOKEN"))
    out(f"pushed: train from it with `orch up NAME --data {uri}`")
    print(uri)
