"""A job's names, what it runs (``JobSpec``: everything a relaunch needs, from any orch process) and
what a user submits (``Submission``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.provider import Request

MAX_RETRIES = 20
MAX_NAME = 36  # an attempt's instance is NAME-aK: 40 characters at most
MAX_GROUP_JOB_NAME = 33  # a group attempt's nodes are NAME-aK-R: 40 characters at most (K <= 21, R <= 63)


def check_job_name(name: str) -> None:
    from orchestrator.lifecycle import check_name

    check_name(name)
    if len(name) > MAX_NAME:
        raise UsageError(f"a job name has at most {MAX_NAME} characters (its instances are NAME-a1, NAME-a2, ...), "
                         f"not {len(name)}")


def attempt_name(job_name: str, number: int) -> str:
    return f"{job_name}-a{number}"


@dataclass
class JobSpec:
    """What a job runs (``work``, the spec of its kind: ``jobs.kinds``) and how it rents.

    Stored as JSON with the work under its kind's key ("train", "command"), the layout every
    orch so far has written: a job begun by an older orch is advanced by this one."""

    kind: str  # a key of ``jobs.kinds.KINDS``
    work: Any  # the kind's spec (training.TrainSpec, task.CommandSpec): names of secrets, never values
    request: Request  # as the user asked (the plan fills in gpu/offer/bid per attempt)
    providers: list[str] | None = None
    ssh_timeout: float | None = None  # seconds
    policy: str = "{}"  # the base policy (flags > config.toml > defaults), as JSON
    images: int | None = None  # training images, for the estimate
    nodes: int = 1  # machines per attempt: a group (``jobs.group``)
    max_price: float | None = None  # $/hr: offers above it are not ranked

    def to_json(self) -> str:
        from orchestrator.jobs.kinds import KINDS

        req = asdict(self.request)
        req.pop("env", None)  # never stored: nothing secret in the ledger
        req.pop("quote", None)  # a plan's live offer belongs to one launch
        work = KINDS[self.kind].dump(self.work)
        return json.dumps({"train": None, self.kind: work, "request": req, "providers": self.providers,
                           "ssh_timeout": self.ssh_timeout, "policy": self.policy, "images": self.images,
                           "nodes": self.nodes, "max_price": self.max_price}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        from orchestrator.jobs.kinds import KINDS

        d = json.loads(text)
        kind = next((key for key in KINDS if d.get(key)), None)
        if kind is None:
            raise UsageError("the job's stored spec names no kind this orch knows")
        request = {k: v for k, v in d["request"].items() if k in Request.__dataclass_fields__}
        return cls(kind=kind, work=KINDS[kind].load(d[kind]), request=Request(**request),
                   providers=d.get("providers"), ssh_timeout=d.get("ssh_timeout"), policy=d.get("policy") or "{}",
                   images=d.get("images"), nodes=d.get("nodes") or 1, max_price=d.get("max_price"))

    def kind_of(self):
        """The job kind that runs this spec (``jobs.kinds``)."""
        from orchestrator.jobs.kinds import KINDS

        return KINDS[self.kind](self.work)


@dataclass
class Submission:
    """What a user (or a schedule) asks of ``jobs.submit``: a job to plan, record and start."""

    name: str
    spec: JobSpec
    max_cost: float | None = None
    max_hours: float | None = None
    retries: int = 3
    keep: bool = False
    resume_from: Path | None = None  # a pulled run folder whose last.pt the job resumes from
    disk_given: bool = True  # False: the kind sizes the disk from what it will hold
