"""``JobKind``: what a job runs, as the engine asks it. The engine (``jobs.engine``) rents, watches,
relaunches, caps and ends; a kind says what an attempt starts, how its progress is read, what is
kept between attempts and put back on the next machine, and what comes home at the end. Whether
the attempt is one machine or a group of N is the job's (``nodes``), never a kind of its own."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar


@dataclass
class Launched:
    """What an attempt's launch started: the head's run row, and what it resumed from."""

    run: Any
    copy: int | None  # the checkpoint copy it restored (None: it started afresh)
    resumed: str  # one line for the attempt's record


class JobKind(ABC):
    key: ClassVar[str]  # its key in a job's stored spec, and its registration in ``KINDS``
    spec_type: ClassVar[type]  # the dataclass of its spec
    noun: ClassVar[str]  # what its work is called in a job's lines ("training", "command")
    doing: ClassVar[str]  # what an attempt is doing while its work runs ("training", "running")
    results: ClassVar[str] = "weights"  # what comes home, as `orch jobs show` names it

    def __init__(self, spec):
        self.spec = spec

    # -- its spec in the ledger ----------------------------------------------------------------
    @classmethod
    def dump(cls, spec) -> dict:
        return asdict(spec)

    @classmethod
    def load(cls, d: dict):
        return cls.spec_type(**{k: v for k, v in d.items() if k in cls.spec_type.__dataclass_fields__})

    @classmethod
    def check_stored(cls, spec, cache: Path):
        """Its spec as a job row gives it back (``load``), held to what making it checked: a shared
        ledger is input too, and whatever it says is sent, written and deleted by the reaper of
        whoever reads it. A file it names is taken from ``cache`` (orch's) alone. UsageError says
        what is wrong. A kind that says nothing here is refused: no stored spec goes unchecked."""
        from orchestrator.errors import UsageError

        raise UsageError(f"the job's stored spec is refused: orch checks no stored {cls.key} spec")

    def secrets(self) -> list[str]:
        """The names of the secrets its work gets (read from the environment at launch, never
        stored). A kind's stored part keeps them under ``secrets``, where ``record.secret_names``
        reads them for any kind without loading the spec (a refused one's lines are hidden too)."""
        from orchestrator.jobs.record import names_in

        return names_in(self.dump(self.spec))

    def copies_kept(self) -> int:
        """How many of the job's newest checkpoint copies stay at home once it completed (0: none)."""
        return 0

    # -- before anything is rented -------------------------------------------------------------
    def provisioning(self):
        """What its machines are made ready with once SSH answers, before ``launch`` (and again
        after every start): an ``orchestrator.provisioning.Provisioning`` (torch for the device,
        then its packages, the matmul proof), or None: SSH answering is all, its setup is its own
        (a command's ``setup:``). The lifecycle runs it and remembers it on each node's row."""
        return None

    @abstractmethod
    def prepare(self, orch, js, disk_given: bool):
        """What travels to the machine made ready at home (packed into orch's cache, again when the
        cache was cleaned); returns the spec, its disk sized where the user gave none."""

    def workload(self, js):
        """What a plan ranks offers by: an ``offers.Workload`` (cost per job), or None (per hour)."""
        return None

    def left(self, done: int | None) -> int | None:
        """Epochs left after the job's copy of epoch ``done`` (None: the kind counts none)."""
        return None

    def refused(self, orch, job) -> str | None:
        """Why no attempt of ``job`` may ever launch (its stored spec asks what no row may): the
        job fails with it before anything is rented."""
        return None

    def blocked(self, orch=None, job=None) -> str | None:
        """Why no attempt of ``job`` can launch from this process now (a secret missing from its
        environment): nothing is rented, and an orch process that has it relaunches."""
        return None

    def done_by_copy(self, orch, job) -> tuple[str, str, dict] | None:
        """Where the job's checkpoint copy already holds all of its work: the job's end from the
        copy (its state, reason and fields); else None."""
        return None

    # -- an attempt ----------------------------------------------------------------------------
    @abstractmethod
    def launch(self, orch, job, nodes: list, copy: int | None, kept: frozenset = frozenset()) -> Launched:
        """Start the work on ready machines (rank order, the head first), restoring the job's
        checkpoint copy ``copy`` on every one of them first where there is one (a copy that proves
        unusable there is dropped, and the attempt starts afresh). ``kept``: ids of the nodes that
        ran this job's work before (the survivors of a lost node): their setup and data stand."""

    @abstractmethod
    def read(self, orch, inst, run) -> dict:
        """The run now, from the machine (``runs.digest``'s view: state, epoch, files...)."""

    @abstractmethod
    def watch(self, orch, job, inst, run, view: dict) -> None:
        """While it runs: what comes home as it goes, and the checkpoint copy when it is due."""

    def due_in(self, job) -> float | None:
        """Seconds until its next timed checkpoint copy (``watcher`` looks then); None: none is timed."""
        return None

    @abstractmethod
    def take_checkpoint(self, orch, job, inst, run) -> tuple[str | None, str | None]:
        """The newest intact checkpoint home as the job's copy: (what was kept, None), (None, why
        not), or (None, None) when there was nothing newer."""

    @abstractmethod
    def bring_home(self, orch, job, inst, run, dest: Path, view: dict | None = None, strict: bool = True) -> list[str]:
        """Everything the work made, home into ``dest``, verified; the files pulled now.
        ``strict``: raise when something could not come (before a destroy)."""

    def final(self, view: dict) -> str | None:
        """Why a failure seen in ``view`` is the work's own, which no relaunch would mend (its
        non-zero exit); None: a failure is a loss, and the job relaunches."""
        return None

    def node_failed(self, tail: str) -> str | None:
        """Why a group is lost through another node whose work ended, from that node's log's last
        lines (``jobs.group.lost_node``); None: its end says nothing on its own (a kind whose
        ``read`` judges every node's end, a command's exit code, leaves it there)."""
        return None

    def stopped_at(self, job) -> str:
        """Where its work was when a cap stopped it, for the job's reason ("its command stopped")."""
        return f"its {self.noun} stopped"

    def failure_detail(self, dest: Path) -> str:
        """What a failed job's reason adds from what came home (the log's last lines)."""
        return ""

    @abstractmethod
    def completed(self, job, how: str, dest: Path, ended: str) -> tuple[str, dict]:
        """The completed job's reason and the fields it records."""

    # -- what `orch jobs` shows of it ------------------------------------------------------------
    def view(self, orch, job, run) -> dict:
        """The keys it adds to the job's ``--json`` dict (``run``: the current attempt's run row)."""
        return {}

    @staticmethod
    def show(d: dict) -> list[str]:
        """Its lines in `orch jobs show`, from the job's dict."""
        return []

    @staticmethod
    def progress(d: dict) -> str:
        """Its cell in `orch jobs`'s progress column."""
        return "-"

    @staticmethod
    def wait_parts(d: dict) -> list[str]:
        """What the one line of `--wait` (and `orch jobs logs -f`) says of its work, from the job's dict."""
        return [f"epoch {d['epoch']}/{d['epochs']}"] if d.get("epoch") else []

    def node_view(self, job, run) -> dict:
        """A group's node's work in `orch jobs show` (``run``: that node's latest run row): its exit
        code as recorded, its epoch (None where the kind has none)."""
        return {"exit_code": None, "epoch": None}

    @staticmethod
    def start_note(attempt: dict) -> str:
        """What an attempt's line says of where it started."""
        return ""

    def plan_lines(self, name: str) -> list[str]:
        """What a dry run says the job would run (``name``: the job's)."""
        return []
