"""The on-instance checkpoint check: a torn last.pt is never taken for one to resume from.

``checkpoint.py`` reads torch's zip format with the standard library (a look at a training
instance must not cost a torch import); torch itself writes the files here and is the reference
for what a whole one holds.
"""

import os
import random
from collections import OrderedDict

import pytest

from tests.conftest import needs_torch, on_instance

pytestmark = needs_torch
checkpoint = on_instance("checkpoint")  # the script as the instance runs it


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint shaped like LibreYOLO's: model and optimizer state, the three RNG states, and
    the 0-based index of the last epoch done."""
    import numpy as np
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3, 10, 10)).sum().backward()
    opt.step()
    path = tmp_path_factory.mktemp("ckpt") / "last.pt"
    torch.save({"epoch": 6, "model": model.state_dict(), "optimizer": opt.state_dict(), "best_metric": 0.25,
                "config": OrderedDict(imgsz=64, names=["bird"]),
                "rng_state": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                              "python": random.getstate()}}, path)
    return path


def test_a_whole_checkpoint_loads_with_its_epoch(saved):
    import torch

    assert torch.load(saved, weights_only=False)["epoch"] == 6
    got = checkpoint.check(str(saved))
    assert (got["exists"], got["loads"], got["epoch"], got["size"]) == (True, True, 7, saved.stat().st_size), got


@pytest.mark.parametrize("keep", [0.0, 0.01, 0.33, 0.5, 0.9, 0.999])
def test_a_torn_checkpoint_does_not_load(saved, tmp_path, keep):
    torn = tmp_path / "last.pt"
    data = saved.read_bytes()
    torn.write_bytes(data[:int(len(data) * keep)])
    got = checkpoint.check(str(torn))
    assert got["exists"] and not got["loads"] and got["epoch"] is None and got["error"], got


def test_a_flipped_byte_in_a_tensor_does_not_load(saved, tmp_path):
    bad = tmp_path / "last.pt"
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the largest storage record
    bad.write_bytes(bytes(data))
    got = checkpoint.check(str(bad))
    assert not got["loads"] and "CRC" in got["error"], got


def test_no_file_and_the_legacy_format(saved, tmp_path):
    import torch

    assert checkpoint.check(str(tmp_path / "nope.pt"))["exists"] is False
    os.symlink(saved, tmp_path / "link.pt")
    assert checkpoint.check(str(tmp_path / "link.pt"))["exists"] is False, "a link is not the run's file"
    legacy = tmp_path / "legacy.pt"
    torch.save({"epoch": 2, "w": torch.ones(3)}, legacy, _use_new_zipfile_serialization=False)
    assert checkpoint.check(str(legacy))["epoch"] == 3


def test_nothing_in_the_pickle_runs(tmp_path):
    import pickle
    import zipfile

    path = tmp_path / "last.pt"  # a zip whose pickle would run a command if anything ran it
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("last/data.pkl", pickle.dumps({"epoch": 1, "x": _Boom(tmp_path / "ran")}))
    got = checkpoint.check(str(path))
    assert got["loads"] and got["epoch"] == 2 and not (tmp_path / "ran").exists()


class _Boom:
    def __init__(self, mark):
        self.mark = mark

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))
