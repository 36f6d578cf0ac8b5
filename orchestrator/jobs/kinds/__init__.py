"""What a job runs. A kind is one file here (a ``JobKind``: ``base``) and one line below: its key
names its part of a job's stored spec (``JobSpec.kind``)."""

from orchestrator.jobs.kinds.base import JobKind, Launched
from orchestrator.jobs.kinds.command import CommandKind
from orchestrator.jobs.kinds.training import TrainingKind

KINDS: dict[str, type[JobKind]] = {kind.key: kind for kind in (TrainingKind, CommandKind)}

__all__ = ["JobKind", "Launched", "KINDS", "TrainingKind", "CommandKind"]
