"""Hugging Face Hub: stage a dataset as one tar in a dataset repo, fetch it on the instance, push weights.

The advice of "Training on a rented GPU": a single tar in a HF dataset repo serves every provider fast and needs nothing
but HF_TOKEN in the job's environment. huggingface_hub is optional here (``pip install 'orch-gpu[hf]'``)
and imported only when used. HF_ENDPOINT and HF_TOKEN are read from the environment, on the
controller and on the instance alike; the token never goes into a script, an argv or a log.
"""

from __future__ import annotations

import os
from urllib.parse import quote
import re
import tempfile
from pathlib import Path

from orchestrator.tasks import dataset
from orchestrator.errors import OrchError, UsageError

_REPO = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
_URI = re.compile(rf"hf://({_REPO})/([A-Za-z0-9._-][A-Za-z0-9._/-]*)")


def _hf():
    try:
        import huggingface_hub
    except ImportError:
        raise OrchError("Hugging Face support needs huggingface_hub: pip install 'orch-gpu[hf]'") from None
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


def check_repo_id(repo_id: str) -> str:
    if not re.fullmatch(_REPO, repo_id or ""):
        raise UsageError(f"expected a Hugging Face repo as ORG/REPO, got {repo_id!r}")
    return repo_id


def push_dataset(
    folder: Path, repo_id: str, token: str | None = None, work_dir: Path | None = None, doctor: bool = True
) -> str:
    """Validate ``folder``, pack it as one tar and upload it to the (private) dataset repo; return its hf:// URI.

    ``work_dir`` holds the tar while it uploads (default: the system temp folder); it needs room for
    one more copy of the dataset. ``doctor``: ``libreyolo doctor`` checks the packed bytes first, once
    per content, as ``orch run`` does (a dataset trained on, or pushed, before is not checked again).
    """
    import sys

    from orchestrator import config

    check_repo_id(repo_id)
    hf = _hf()  # before validating, which can take a while on a big dataset
    info = dataset.validate(Path(folder), doctor=False)
    api = _api(token)
    filename = f"{info.name}.tar"
    with tempfile.TemporaryDirectory(prefix="orch-pack-", dir=work_dir) as tmp:
        tar = dataset.pack(info, Path(tmp) / filename)
        if doctor:
            dataset.doctor(info, None, dataset.sha256(tar), config.cache_home() / "doctor",
                           lambda m: print(m, file=sys.stderr, flush=True))
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


def dataset_size(uri: str) -> int:
    """The size in bytes of ``hf://ORG/REPO/FILE.tar``, from the hub's file metadata: the disk is
    sized from it before anything is rented, and the instance refuses a tar that unpacks to more."""
    repo_id, filename = parse_hf(uri)
    hf = _hf()
    # The same HEAD request a download starts with (hf_hub_download asks it first), so any hub that
    # serves the file answers it.
    # Built here: hf_hub_url rebases only URLs that start with the endpoint huggingface_hub read at
    # import, so an HF_ENDPOINT set later would be ignored.
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/datasets/{repo_id}/resolve/main/{quote(filename)}"
    try:
        meta = hf.get_hf_file_metadata(url, token=os.environ.get("HF_TOKEN") or None)
    except hf.errors.EntryNotFoundError:
        raise UsageError(f"{uri}: no such file in the dataset repo {repo_id}") from None
    except hf.errors.RepositoryNotFoundError:
        raise UsageError(f"{uri}: no dataset repo {repo_id} (or no access to it: HF_TOKEN)") from None
    except hf.errors.HfHubHTTPError as e:
        raise OrchError(f"Hugging Face could not say how big {uri} is: {_first_line(e)}") from None
    except OSError as e:
        raise OrchError(f"cannot reach the Hugging Face Hub to size {uri}: {_first_line(e)}") from None
    if not isinstance(meta.size, int) or meta.size <= 0:
        raise OrchError(f"Hugging Face gave no size for {uri}")
    return meta.size
