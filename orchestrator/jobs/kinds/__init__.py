"""What a job runs. A kind is one file here (a ``JobKind``: ``base``, with its spec's dataclass) and
one line below: its key names its part of a job's stored spec (``JobSpec.kind``). What builds a
request (``jobs.request``) takes a kind's spec from here, never from the kind's module."""

from orchestrator.jobs.kinds.base import JobKind, Launched
from orchestrator.jobs.kinds.command import CommandKind, CommandSpec
from orchestrator.jobs.kinds.training import TrainingKind, TrainSpec

KINDS: dict[str, type[JobKind]] = {kind.key: kind for kind in (TrainingKind, CommandKind)}

__all__ = ["JobKind", "Launched", "KINDS", "TrainingKind", "CommandKind", "CommandSpec", "TrainSpec"]
