"""A job's names, what it runs (``JobSpec``: everything a relaunch needs, from any orch process) and
what a user submits (``Submission``)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.jobs.record import MAX_NAME, check_job_name  # noqa: F401  (the rule: where names make folders)
from orchestrator.provider import Request

MAX_RETRIES = 20
MAX_GROUP_JOB_NAME = 33  # a group attempt's nodes are NAME-aK-R: 40 characters at most (K <= 21, R <= 63)


_PROVIDER = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _refused(spec: JobSpec) -> None:
    """What ``from_json`` holds a stored spec to beyond its types: its kind's own check
    (``JobKind.check_stored``: a kind that has none is refused), and the rest of the row as a
    submission makes it."""
    from orchestrator import config
    from orchestrator.jobs.kinds import KINDS

    def number(value, key, low, high, kind=(int, float), none=True) -> None:
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            raise UsageError(f"the job's stored spec is refused: {key} {value!r} is not from {low} to {high}")

    KINDS[spec.kind].check_stored(spec.work, config.home() / "cache")
    providers = spec.providers
    if providers is not None and (not isinstance(providers, list)
                                  or not all(isinstance(p, str) and _PROVIDER.fullmatch(p) for p in providers)):
        raise UsageError("the job's stored spec is refused: its providers are not provider names")
    if not isinstance(spec.policy, str):
        raise UsageError("the job's stored spec is refused: its policy is not text")
    number(spec.nodes, "nodes", 1, 64, int, none=False)
    number(spec.ssh_timeout, "ssh_timeout", 1, 1e6)
    number(spec.images, "images", 0, 1 << 40, int)
    number(spec.max_price, "max_price", 1e-9, 10_000)
    number(spec.min_vram, "min_vram", 1e-9, 4096)
    number(spec.max_vram, "max_vram", 1e-9, 4096)
    if spec.volumes is not None:  # names and paths as `orch run` checks them
        from orchestrator.volumes import volume_uses

        if not isinstance(spec.volumes, list) or not all(isinstance(u, dict) for u in spec.volumes):
            raise UsageError("the job's stored spec is refused: its volumes are not a list of mappings")
        try:
            uses = [volume_uses.Use.from_dict(u) for u in spec.volumes]
        except KeyError as e:
            raise UsageError(f"the job's stored spec is refused: a volume without its {e}") from None
        for u in uses:
            volume_uses.check_volume_name(u.name, u.per_node, "the job's stored spec")
            if volume_uses.check_path(u.path, "the job's stored spec") != u.path:
                raise UsageError("the job's stored spec is refused: a volume path is not as orch writes it")
        volume_uses.check_uses(uses, "the job's stored spec")


def attempt_name(job_name: str, number: int) -> str:
    return f"{job_name}-a{number}"


@dataclass
class JobSpec:
    """What a job runs (``work``, the spec of its kind: ``jobs.kinds``) and how it rents.

    Stored as JSON with the work under its kind's key ("train", "command"), the layout every
    orch so far has written: a job begun by an older orch is advanced by this one."""

    kind: str  # a key of ``jobs.kinds.KINDS``
    work: Any  # the kind's spec (a ``KINDS[kind].spec_type``): names of secrets, never values
    request: Request  # as the user asked (the plan fills in gpu/offer/bid per attempt)
    providers: list[str] | None = None
    ssh_timeout: float | None = None  # seconds
    policy: str = "{}"  # the base policy (flags > config.toml > defaults), as JSON
    images: int | None = None  # training images, for the estimate
    nodes: int = 1  # machines per attempt: a group (``jobs.group``)
    max_price: float | None = None  # $/hr: offers above it are not ranked
    min_vram: float | None = None  # GB per GPU: offers with less are not ranked
    max_vram: float | None = None  # GB per GPU: offers with more are not ranked (dstack's memory range)
    # What it mounts (``volume_uses.Use`` as dicts: names and paths): placed again at each plan, so a
    # relaunch goes where the volumes are (``volume_mounts.narrow``).
    volumes: list[dict] | None = None
    avoid_preempted: bool = False  # offers where a spot market just took a machine: left out (else last)

    def to_json(self) -> str:
        from orchestrator.jobs.kinds import KINDS

        req = asdict(self.request)
        req.pop("env", None)  # never stored: nothing secret in the ledger
        req.pop("quote", None)  # a plan's live offer belongs to one launch
        req.pop("mounts", None), req.pop("node_mounts", None)  # placed at each plan from ``volumes``
        work = KINDS[self.kind].dump(self.work)
        # "train" is always there (null for another kind's job): the layout every orch so far has written
        return json.dumps({"train": None, self.kind: work, "request": req, "providers": self.providers,
                           "ssh_timeout": self.ssh_timeout, "policy": self.policy, "images": self.images,
                           "nodes": self.nodes, "max_price": self.max_price, "volumes": self.volumes,
                           "min_vram": self.min_vram, "max_vram": self.max_vram,
                           "avoid_preempted": self.avoid_preempted},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec a job row holds, checked as strictly as when it was made (``_refused``): a shared
        ledger is input too, and whatever it says is sent, written and deleted by the reaper of
        whoever reads it. UsageError says what is wrong; nothing is acted on."""
        from orchestrator.jobs.kinds import KINDS

        try:
            d = json.loads(text)
        except (TypeError, ValueError, RecursionError):
            raise UsageError("the job's stored spec is not JSON") from None
        if not isinstance(d, dict):
            raise UsageError("the job's stored spec is not a mapping")
        kind = next((key for key in KINDS if d.get(key)), None)
        if kind is None:
            raise UsageError("the job's stored spec names no kind this orch knows")
        if not isinstance(d[kind], dict) or not isinstance(d.get("request"), dict):
            raise UsageError("the job's stored spec is not a mapping")
        request = {k: v for k, v in d["request"].items() if k in Request.__dataclass_fields__
                   and k not in ("quote", "mounts", "node_mounts")}  # mounts: placed at each plan
        try:
            spec = cls(kind=kind, work=KINDS[kind].load(d[kind]), request=Request(**request),
                       providers=d.get("providers"), ssh_timeout=d.get("ssh_timeout"),
                       policy=d.get("policy") or "{}", images=d.get("images"), nodes=d.get("nodes") or 1,
                       max_price=d.get("max_price"), volumes=d.get("volumes"), min_vram=d.get("min_vram"),
                       max_vram=d.get("max_vram"), avoid_preempted=d.get("avoid_preempted") is True)
        except (TypeError, ValueError, AttributeError) as e:
            raise UsageError(f"the job's stored spec is refused: {e}") from None
        _refused(spec)
        return spec

    @classmethod
    def of(cls, job) -> JobSpec:
        """A job row's spec, its name checked first with the rule every new name meets (it names the
        job's folders at home: ``../../victim`` is refused, never joined to a path)."""
        check_job_name(job.name)
        return cls.from_json(job.spec)

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
    # orch's own credentials handed to the command on purpose (``--allow-secret``, a schedule's
    # stored at `add`): kept at home for its relaunches (``record.allow_secrets``), never in the ledger
    allowed_secrets: frozenset = frozenset()
    replace: bool = False  # an ended job of that name (its row, its files) is removed once the plan holds
    # The values of its secrets where they are not this process's environment (a schedule's run: those
    # stored for that schedule): handed to its first launch (``submit``), never stored, never shown.
    secrets: dict = field(default_factory=dict, repr=False, compare=False)
    # $: a plan whose estimate for the whole job (``estimate``) is above it is refused before anything
    # is rented (a schedule's --max-cost), with the plan (``submit.OverEstimate``).
    max_estimate: float | None = None

    def estimate(self, choice) -> float | None:
        """The plan's estimate for the whole job: the plan's own (a training's epochs), else its $/hr
        for the job's --max-hours (a command's deadline); None where neither is known."""
        from orchestrator.money import budget

        return budget.estimate(choice.usd, choice.price_hr, self.max_hours)
