"""What the red team of issue 27 did, as a hostile rented host and a careless team member would, each
tried for real and refused: a checkpoint that runs code on the next machine, a ledger that writes
ssh_config, pulls without bounds, and the low findings."""

from __future__ import annotations

import os
import shutil
import sys
from collections import OrderedDict

import pytest

from orchestrator import dataset
from tests.clouds import open_orch
from tests.conftest import needs_torch, run_orch
from tests.test_untrusted import one_line_refusal


class _Boom:
    """Whatever unpickles it runs ``how`` (os.system, eval) to write a marker file."""

    def __init__(self, mark, how="system"):
        self.mark, self.how = mark, how

    def __reduce__(self):
        if self.how == "eval":
            return (eval, (f"open({str(self.mark)!r}, 'w').close()",))
        return (os.system, (f"touch {self.mark}",))


def hostile_checkpoint(path, mark, legacy: bool) -> None:
    """A last.pt shaped like LibreYOLO's whose pickle writes ``mark`` when anything unpickles it:
    torch's legacy format calling os.system, or the zip format calling eval."""
    import torch

    obj = {"epoch": 0, "model": OrderedDict(w=torch.ones(2)), "x": _Boom(mark, "system" if legacy else "eval")}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)


# The instance vouches for any checkpoint: it answers its own checkpoint.py as it likes.
VOUCHES = r'''#!/bin/sh
case "$1" in
  *checkpoint.py) printf '%s\n' 'ORCH_RESULT {"exists": true, "loads": true, "epoch": 1, "size": 1, "error": null}';;
  *) exec "$REAL_PYTHON" "$@";;
esac
'''


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return dataset.synth(tmp_path_factory.mktemp("redteam") / "birds", n_train=4, n_val=2, imgsz=64)


# -- 1. a checkpoint that would run code on the next instance --------------------------------------
@needs_torch
@pytest.mark.training
def test_a_job_whose_instance_serves_a_hostile_last_pt_keeps_no_copy_uploads_nothing_and_starts_over(
        orch_home, ds, tmp_path):
    from tests.test_jobs import TRAIN, _advance_until, _freeze, _run_root, live_instances

    mark = tmp_path / "ran"
    run_orch("run", "jz", "--data", ds, "--epochs", "40", "--save-period", "5", *TRAIN, check=0)
    thaw = _freeze("jz-a1")
    # The instance turns: its last.pt is a legacy pickle with a payload, and its Python vouches for it.
    root = _run_root("jz-a1")
    last = root / "weights" / "last.pt"
    real = last.read_bytes()
    hostile_checkpoint(last, mark, legacy=True)
    work = next((orch_home / "local").glob("orch-*-jz-a1")) / "home" / "orch"
    liar = work / "bin" / "vouching-python"
    liar.parent.mkdir(parents=True, exist_ok=True)
    liar.write_text(VOUCHES.replace("$REAL_PYTHON", sys.executable))
    liar.chmod(0o755)
    python = (work / "python").read_text()
    (work / "python").write_text(f"{liar}\n")
    job = _advance_until("jz", lambda j: any("not kept" in h["text"] for h in j["history"]), every=0.5)
    assert job["checkpoint_epoch"] is None and not list((orch_home / "jobs" / "jz").glob("ckpt-*")), job
    assert any("legacy" in h["text"] for h in job["history"]), job["history"][-5:]
    # It turns back; the job keeps a copy of a real checkpoint...
    last.write_bytes(real)
    (work / "python").write_text(python)
    thaw()
    job = _advance_until("jz", lambda j: (j["checkpoint_epoch"] or 0) >= 1, every=0.5)
    _freeze("jz-a1", at_least=job["checkpoint_epoch"])  # not ahead of its copy: it ends here
    kept = job["checkpoint_epoch"]
    copy = orch_home / "jobs" / "jz" / f"ckpt-{kept}" / "weights" / "last.pt"
    # ...which is swapped at home for a zip whose pickle calls eval (a careless teammate, a shared disk),
    hostile_checkpoint(copy, mark, legacy=False)
    run_orch("down", "jz-a1", "--no-pull", check=0)  # and the machine goes.
    job = _advance_until("jz", lambda j: len(j["attempts"]) == 2 and j["attempts"][1]["state"] == "running")
    second = job["attempts"][1]
    assert second["start_epoch"] == 1 and "started at epoch 1" in second["resumed_from"], second
    assert not any("verified copy" in str(a["resumed_from"]) for a in job["attempts"]), job["attempts"]
    assert any(f"resume copy (epoch {kept}) is not uploaded" in h["text"] and "eval" in h["text"]
               for h in job["history"]), job["history"][-5:]
    assert not copy.exists(), "a copy that cannot be resumed from is forgotten"
    run_orch("jobs", "cancel", "jz", check=0)
    assert live_instances() == []
    assert not mark.exists(), "the payload ran somewhere"


@needs_torch
@pytest.mark.parametrize("legacy", [True, False])
def test_a_resume_from_a_hostile_pulled_last_pt_is_refused_before_anything(orch_home, ds, tmp_path, legacy):
    """`orch run --resume` and `orch up --resume` upload the pulled last.pt: refused up front, one
    line, exit 2, nothing rented, no job, no ledger."""
    mark = tmp_path / "ran"
    weights = orch_home / "runs" / "box" / "weights"
    weights.mkdir(parents=True)
    hostile_checkpoint(weights / "last.pt", mark, legacy=legacy)
    before = sorted(p.relative_to(orch_home) for p in orch_home.rglob("*"))
    for args in (("run", "box", "--resume"), ("up", "box", "--resume")):
        proc = run_orch(*args, "--data", ds, "--epochs", "3", "--cpu")
        one_line_refusal(proc, 2, "not resumable")
        assert ("legacy" if legacy else "eval") in proc.stderr, proc.stderr
    assert sorted(p.relative_to(orch_home) for p in orch_home.rglob("*")) == before, "something was created"
    assert not mark.exists()
    shutil.rmtree(orch_home / "runs")
