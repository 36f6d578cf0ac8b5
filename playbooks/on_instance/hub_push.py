"""A LibreYOLO training callback, imported by train_entry.py (``--push-to``): milestones go to a Hugging
Face model repo from the instance itself, while the training runs.

LibreYOLO calls ``on_train_epoch_end(event)`` with a ``TrainEpochEvent`` (``save_dir``; ``epoch`` is
1-based) after the epoch's checkpoints are written, on rank 0 only, and ``on_train_end(event)``.
It is a class in a module, never exec'd source: for a device list LibreYOLO pickles the callbacks
to its per-GPU workers, which import this module by name (train_entry.py's folder is on their path).
"""
import os
import sys
from pathlib import Path


class OrchHubPush:
    """LibreYOLO training callback: after each epoch, upload the new weights/epoch_N.pt snapshots and a
    new best.pt to a Hugging Face model repo; at the end, last.pt, best.pt and the small run files.

    The token comes from HF_TOKEN in the environment. An upload failure is reported on stderr and
    retried at the next epoch: it never stops the training that is being paid for.
    """

    SMALL_FILES = ("summary.json", "results.csv", "metrics.jsonl", "train_config.yaml")

    def __init__(self, repo_id):
        self.repo_id = repo_id
        self.sent = {}  # path in repo -> (size, mtime_ns) of what was uploaded
        self.api = None

    def on_train_epoch_end(self, event):
        weights = Path(event.save_dir) / "weights"
        self._push([*sorted(weights.glob("epoch_*.pt")), weights / "best.pt"])

    def on_train_end(self, event):
        run = Path(event.save_dir)
        self._push([run / "weights" / "best.pt", run / "weights" / "last.pt", *(run / f for f in self.SMALL_FILES)])

    def _push(self, paths):
        for path in paths:
            if not path.is_file():
                continue
            name = f"weights/{path.name}" if path.suffix == ".pt" else path.name
            st = path.stat()
            if self.sent.get(name) == (st.st_size, st.st_mtime_ns):
                continue
            try:
                self._upload(path, name)
            except Exception as e:
                print(f"orch: upload of {name} to {self.repo_id} failed, will retry: {e}", file=sys.stderr)
                return
            self.sent[name] = (st.st_size, st.st_mtime_ns)

    def _upload(self, path, name):
        if self.api is None:
            from huggingface_hub import HfApi

            api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
            api.create_repo(self.repo_id, repo_type="model", private=True, exist_ok=True)
            self.api = api
        self.api.upload_file(
            path_or_fileobj=str(path), path_in_repo=name, repo_id=self.repo_id, repo_type="model",
            commit_message=f"orch: {name}",
        )
