"""The training kind: a LibreYOLO training from a dataset to weights (``orch run NAME --data``,
a task file's ``train:``). The run itself is ``training`` (one machine) and ``group_training``
(torchrun on a group); what a job adds is its resume copy (``jobs.resume_copy``): ``last.pt``
taken whole whenever the epoch moved, checked on both sides, and put on every node of the next
attempt. Offers are ranked by the cost of the epochs left."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

from orchestrator.runs import checkpoint_vet
from orchestrator.errors import OrchError, UsageError
from orchestrator.jobs import record, resume_copy
from orchestrator.jobs.kinds.base import JobKind, Launched
from orchestrator.jobs.states import COMPLETED, FAILED
from orchestrator.text import clean
from orchestrator.text import why as _why
from orchestrator.runs.training import TrainSpec

_TAR = re.compile(r"[0-9a-f]{16}\.tar")  # training.prepare's name for a packed dataset: its hash
_DATASET = re.compile(r"ds-[0-9a-f]{16}")  # the name training.prepare gives a dataset
# What a torchrun launcher leaves in its log when a worker failed (torch.distributed.elastic).
FAILED_MARKS = ("ChildFailedError", "Traceback (most recent call last)")


class TrainingKind(JobKind):
    key = "train"
    spec_type = TrainSpec
    noun = doing = "training"

    def provisioning(self):
        """Torch for the device, then LibreYOLO: what orch's plain machine (``orch up``) has too."""
        from orchestrator.provisioning import MACHINE

        return MACHINE

    @classmethod
    def dump(cls, spec) -> dict:
        d = super().dump(spec)
        d["local_tar"] = str(spec.local_tar) if spec.local_tar else None
        return d

    @classmethod
    def load(cls, d: dict):
        spec = super().load(d)
        spec.local_tar = Path(spec.local_tar) if spec.local_tar else None
        return spec

    @classmethod
    def check_stored(cls, spec, cache: Path):
        """Its packed data taken from orch's cache alone, under a name orch gives, as its dataset's."""
        if spec.local_tar is not None:
            if not _TAR.fullmatch(spec.local_tar.name):
                raise UsageError("the job's stored spec is refused: its packed dataset is not one orch made "
                                 "(HASH.tar in its cache)")
            spec.local_tar = cache / spec.local_tar.name
        if spec.dataset_name is not None and (not isinstance(spec.dataset_name, str) or
                                              not _DATASET.fullmatch(spec.dataset_name)):
            raise UsageError("the job's stored spec is refused: its dataset name is not one orch gives")

    # -- before anything is rented -------------------------------------------------------------
    def prepare(self, orch, js, disk_given: bool):
        from orchestrator.money import offers
        from orchestrator.runs import training

        spec = self.spec
        chose_period = spec.save_period is None
        if chose_period:
            spec.save_period = training.default_save_period(spec.epochs)
        training.prepare(spec, orch.home, orch.say)
        if chose_period:  # said once the data is known good: a refusal stays one line
            orch.say(f"      save_period: every {spec.save_period} epoch(s), {spec.epochs // spec.save_period} "
                     f"epoch_N.pt milestones for {spec.epochs} epochs (--save-period to choose)")
        if not disk_given:
            disk, why = training.disk_for(spec)
            js = replace(js, request=replace(js.request, disk_gb=disk))
            orch.say(f"      disk: {why}")
        if not js.request.cpu and not spec.data.startswith("hf://"):
            js = replace(js, images=offers.workload_for(spec.model, spec.epochs, data=spec.data,
                                                        imgsz=spec.imgsz).images)
        return replace(js, work=spec)

    def workload(self, js):
        from orchestrator.money import offers

        s = self.spec
        return offers.Workload(model=s.model, epochs=s.epochs, data=s.data, data_bytes=s.data_bytes,
                               images=js.images, imgsz=s.imgsz)

    def node_failed(self, tail: str) -> str | None:
        """A worker's failure in another node's log (torchrun's marks): the group's training is lost."""
        if not any(mark in tail for mark in FAILED_MARKS):
            return None
        last = next((line for line in reversed(tail.splitlines()) if "Error" in line), "")
        return f"its training failed ({clean(last, 200)})"

    def stopped_at(self, job) -> str:
        return f"stopped at epoch {job.epoch or '?'}"

    def left(self, done: int | None) -> int | None:
        return self.spec.epochs - (done or 0)

    def done_by_copy(self, orch, job):
        """The resume copy already holds the last epoch (the instance went after its last epoch and
        before its final pull): its last.pt and the milestones pulled before are the job's weights."""
        if (job.checkpoint_epoch or 0) < self.spec.epochs:
            return None
        src = record.checkpoint_dir(orch.home, job.name, job.checkpoint_epoch)
        _, unsafe = checkpoint_vet.vet(src / "weights" / "last.pt")
        if unsafe:  # changed at home since it was kept: never handed to the user as the job's weights
            return FAILED, f"the copy of epoch {job.checkpoint_epoch} is no checkpoint to keep: {unsafe}", {}
        dest = record.weights_dir(orch.home, job.name)
        (dest / "weights").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / "weights" / "last.pt", dest / "weights" / "last.pt")
        return (COMPLETED, f"the instance went after epoch {job.checkpoint_epoch} of {self.spec.epochs}: weights from "
                           f"the copies pulled before, in {dest}", {"weights": str(dest)})

    # -- an attempt ----------------------------------------------------------------------------
    def launch(self, orch, job, nodes: list, copy: int | None, kept: frozenset = frozenset()) -> Launched:
        # (a survivor's staged data stands without ``kept``: the upload resumes, a whole one is skipped)
        from orchestrator.runs import group_training, training

        spec = self._prepared(orch)
        start = resume_copy.stage(orch, job, nodes, spec, copy) if copy is not None else None
        if start is not None:
            spec = replace(spec, resume=True)
        notes: list[str] = []  # a dataset staged again on a volume, and why
        run = group_training.launch(orch, nodes, spec, notes) if len(nodes) > 1 else \
            training.launch(orch, nodes[0], spec, notes)
        resumed = f"resumed from the job's verified copy of last.pt (epoch {start})" if start is not None else \
            "started at epoch 1"
        return Launched(run, start, "; ".join([resumed, *dict.fromkeys(notes)]))

    def _prepared(self, orch):
        """The spec with its data ready to stage: the packed tar is in orch's cache unless it was
        cleaned, when the folder is packed again (the same content gives the same tar)."""
        from orchestrator.runs import training

        spec = replace(self.spec, resume=False)
        if spec.data.startswith("hf://") or (spec.local_tar and spec.local_tar.is_file()):
            return spec
        return training.prepare(spec, orch.home, orch.say)

    def read(self, orch, inst, run) -> dict:
        from orchestrator.runs import runs

        return runs.read(orch, inst, run)

    def watch(self, orch, job, inst, run, view: dict) -> None:
        """The milestones home, and a verified resume copy whenever the epoch moved."""
        from orchestrator.runs import runs

        try:
            runs.pull(orch, inst, run, dest=record.weights_dir(orch.home, job.name), view=view,
                          only_milestones=True)
        except OrchError as e:
            record.note_once(orch, job, f"milestones not pulled this time: {_why(e)}", inst.name, say=False)
        epoch = view.get("epoch") or 0
        if epoch > (job.checkpoint_epoch or 0):
            try:
                _, problem = resume_copy.take(orch, job, inst, run)
            except OrchError as e:
                problem = _why(e)
            if problem:
                record.note_once(orch, job, f"no resume copy this time: {problem}", inst.name, say=False)  # once

    def take_checkpoint(self, orch, job, inst, run) -> tuple[str | None, str | None]:
        from orchestrator.runs import runs

        runs.pull(orch, inst, run, dest=record.weights_dir(orch.home, job.name), only_milestones=True)
        epoch, problem = resume_copy.take(orch, job, inst, run)
        return (f"took last.pt (epoch {epoch}) from {inst.name}: it loads there" if epoch else None), problem

    def bring_home(self, orch, job, inst, run, dest: Path, view: dict | None = None, strict: bool = True) -> list[str]:
        from orchestrator.runs import runs

        got, _ = runs.pull(orch, inst, run, dest=dest, view=view)
        return got

    def completed(self, job, how: str, dest: Path, ended: str) -> tuple[str, dict]:
        epochs = self.spec.epochs
        return (f"{epochs} epochs; {how}; weights in {dest}; {ended}",
                {"weights": str(dest), "epoch": max(job.epoch or 0, epochs)})

    # -- what `orch jobs` shows of it ------------------------------------------------------------
    def view(self, orch, job, run) -> dict:
        return {"model": self.spec.model, "data": self.spec.data, "epochs": self.spec.epochs}

    @staticmethod
    def show(d: dict) -> list[str]:
        copy = d["checkpoint_epoch"] if d["checkpoint_epoch"] and d["state"] != COMPLETED else None  # a completed
        return [f"  model    {clean(d['model'])} on {clean(d['data'], 200)}, epoch {d['epoch'] or '-'}/{d['epochs']}"
                + (f", resume copy at epoch {copy}" if copy else "")]  # job's copies are gone: its weights are home

    def node_view(self, job, run) -> dict:
        return {"exit_code": None, "epoch": job.epoch}  # rank 0 reports it for the group: its ranks move in step

    @staticmethod
    def progress(d: dict) -> str:
        return f"{d['epoch'] or '-'}/{d['epochs']}"

    @staticmethod
    def start_note(attempt: dict) -> str:
        return f" from epoch {attempt['start_epoch']}" if attempt["start_epoch"] else ""

    def plan_lines(self, name: str) -> list[str]:
        s = self.spec
        return [f"  train    {clean(s.model)} for {s.epochs} epochs on {clean(s.data, 200)}",
                f"  weights  -> $ORCH_HOME/runs/{name}/ (milestones as they are saved, then everything)"]
