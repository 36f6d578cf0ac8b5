"""Download a dataset tar from a Hugging Face dataset repo, here on the instance, and unpack it.

    python hf_download.py REPO_ID FILENAME DEST [MAX_BYTES MAX_MEMBERS]   ->   ORCH_RESULT {"data_yaml": ...}

Needs ``huggingface_hub``; HF_TOKEN, HF_ENDPOINT and HF_HOME come from the environment. The tar
is unpacked by ``extract.py`` (beside this file) under the same limits.
"""
import json
import sys

from extract import limits, orch_extract

try:
    from huggingface_hub import hf_hub_download
except ImportError:
    raise SystemExit("huggingface_hub is not installed on this machine: pip install huggingface_hub")

if __name__ == "__main__":
    repo_id, filename, dest = sys.argv[1:4]
    max_bytes, max_members = limits(sys.argv[4:])
    tar_path = hf_hub_download(repo_id, filename, repo_type="dataset")
    print("ORCH_RESULT " + json.dumps({"data_yaml": orch_extract(tar_path, dest, max_bytes, max_members)}))
