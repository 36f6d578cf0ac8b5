"""Hugging Face Hub: stage a dataset as one tar in a dataset repo, fetch it on the instance, push weights.

The seed's advice: a single tar in a HF dataset repo serves every provider fast and needs nothing
but HF_TOKEN in the job's environment. huggingface_hub is optional here (``pip install 'orch[hf]'``)
and imported only when used. HF_ENDPOINT and HF_TOKEN are read from the environment, on the
controller and on the instance alike; the token never goes into a script, an argv or a log.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from orchestrator import dataset
from orchestrator.errors import OrchError, UsageError

_REPO = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
_URI = re.compile(rf"hf://({_REPO})/([A-Za-z0-9._-][A-Za-z0-9._/-]*)")


def _hf():
    try:
        import huggingface_hub
    except ImportError:
        raise OrchError("Hugging Face support needs huggingface_hub: pip install 'orch[hf]'") from None
    return huggingface_hub


def _api(token: str | None):
    hf = _hf()
    # HF_ENDPOINT is read here, not only when huggingface_hub is first imported (it caches it then).
    return hf.HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token or os.environ.get("HF_TOKEN") or None)


def parse_hf(uri: str) -> tuple[str, str]:
    """``hf://ORG/REPO/FILE.tar`` -> ("ORG/REPO", "FILE.tar")."""
    m = _URI.fullmatch(uri or "")
    if not m or ".." in m.group(2).split("/") or m.group(2).endswith("/"):
        raise UsageError(f"expected hf://ORG/REPO/FILE.tar, got {uri!r}")
    return m.group(1), m.group(2)


def _check_repo_id(repo_id: str) -> str:
    if not re.fullmatch(_REPO, repo_id or ""):
        raise UsageError(f"expected a Hugging Face repo as ORG/REPO, got {repo_id!r}")
    return repo_id


def push_dataset(
    folder: Path, repo_id: str, token: str | None = None, work_dir: Path | None = None, doctor: bool = True
) -> str:
    """Validate ``folder``, pack it as one tar and upload it to the (private) dataset repo; return its hf:// URI.

    ``work_dir`` holds the tar while it uploads (default: the system temp folder); it needs room for
    one more copy of the dataset. ``doctor`` as in dataset.validate.
    """
    _check_repo_id(repo_id)
    hf = _hf()  # before validating, which can take a while on a big dataset
    info = dataset.validate(Path(folder), doctor=doctor)
    api = _api(token)
    filename = f"{info.name}.tar"
    with tempfile.TemporaryDirectory(prefix="orch-pack-", dir=work_dir) as tmp:
        tar = dataset.pack(info, Path(tmp) / filename)
        try:
            api.create_repo(repo_id, repo_type="dataset", private=True, exist_ok=True)
            api.upload_file(
                path_or_fileobj=str(tar),
                path_in_repo=filename,
                repo_id=repo_id,
                repo_type="dataset",
                commit_message=f"orch: {filename} ({sum(info.n_images.values())} images)",
            )
        except hf.errors.HfHubHTTPError as e:
            raise OrchError(f"Hugging Face refused the dataset upload to {repo_id}: {_first_line(e)}") from None
    return f"hf://{repo_id}/{filename}"


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def remote_download_script(repo_id: str, filename: str, dest: str) -> str:
    """Python source for the instance: download the tar (HF_TOKEN, HF_ENDPOINT, HF_HOME from its
    environment), extract it under ``dest`` as dataset.remote_extract_script does, print {"data_yaml": ...}."""
    _check_repo_id(repo_id)
    return (
        dataset.extract_source()
        + """
try:
    from huggingface_hub import hf_hub_download
except ImportError:
    raise SystemExit("huggingface_hub is not installed on this machine: pip install huggingface_hub")
"""
        + f"tar_path = hf_hub_download({repo_id!r}, {filename!r}, repo_type='dataset')\n"
        + f"print(json.dumps({{'data_yaml': orch_extract(tar_path, {dest!r})}}))\n"
    )


_UPLOAD_CALLBACK = r'''
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
'''


def upload_callback_source(repo_id: str) -> str:
    """Python source of a module defining ``orch_hub_push``, a LibreYOLO 1.6 training callback object.

    LibreYOLO calls ``callback.on_train_epoch_end(event)`` with a ``TrainEpochEvent`` (fields used:
    ``save_dir``; ``epoch`` is 1-based) after the epoch's checkpoints are written, on rank 0 only, and
    ``on_train_end(event)`` with a ``TrainEndEvent``. Pass it as
    ``model.train(..., callbacks=[orch_hub_push])``; the CLI takes no callbacks.

    Save it as a module (``orch_push.py`` beside the entry script) and import it: for a device list
    LibreYOLO pickles the callbacks to its workers, and a class exec'd into a dict cannot be pickled.
    """
    _check_repo_id(repo_id)
    return _UPLOAD_CALLBACK + f"\norch_hub_push = OrchHubPush({repo_id!r})\n"
