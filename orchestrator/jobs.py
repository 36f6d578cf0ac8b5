"""Jobs (``orch run``): one training from a dataset to weights on disk, at the lowest cost per job,
over as many machines as it takes. A job of the *command* kind (a task file's ``run:``) moves
through the same states; where it differs (what an attempt starts, what it reads, what it copies
home) the engine asks ``command_job``, and a command's own non-zero exit fails the job (no relaunch).

A job lives in the ledger (``jobs``, and one ``attempts`` row per instance that trained it), so no
terminal needs to stay open: every reaper pass (``reaper.reap``'s ``after``), every ``orch jobs
show`` and ``orch run --wait`` call ``advance``, which looks once and moves the job one step. One
process advances a job at a time (a claim on ``job:NAME``, which no instance name can take).

    planned --(attempt trains)--> running --(completed, pulled)--> completed (destroyed, or stopped: --keep)
       |                            |  \\--(loss)--> recovering --(next attempt trains)--> running
       |                            |                   \\--(retries, --max-cost, --max-hours)--> failed
       \\--(no attempt could launch)--> failed;   any active state --(orch jobs cancel)--> cancelled

**Plan.** GPU jobs rank live offers by cost per job (``offers.search``, the estimate of ``orch
offers``) and refuse a plan whose estimate is over ``--max-cost``. CPU jobs (and ``--offer``) have
nothing to rank: the provider named (or the default) is used, its price known once rented.

**Attempts.** Attempt K runs on an instance named ``NAME-aK``, with the job's policy: idle minutes
at least three reaper intervals (IDLE_PASSES; 15 min with the default 5 min schedule), so neither
the watchdog nor the reaper's idle rule ends an instance whose training just finished before a
pass has pulled it (and the watchdog destroys only what was pulled), and a deadline where the job
has one (``--max-hours``, and the hours ``--max-cost`` still pays for at the instance's price), so
the cap holds with the laptop closed. ``$ORCH_HOME/runs/NAME-aK`` is a link to ``runs/NAME``: every
pull of an attempt (the job's, the reaper's, ``orch status``'s) lands in the job's one folder.

**Checkpoints.** LibreYOLO rewrites ``last.pt`` every epoch with a plain ``torch.save``: a file
caught mid-write is torn. While an attempt trains, each look whose epoch moved copies ``last.pt``
and ``metrics.jsonl`` aside on the instance, loads the copy there (``checkpoint.py``) and pulls
it, verified, into ``$ORCH_HOME/jobs/NAME/ckpt-E`` (E its epoch): the job's resume copy, intact by
construction. A copy whose metrics lag its epoch is not kept (the rows would be missing).
(``resume_copy`` takes and stages it; ``job_record`` holds the folders and history lines;
``job_views`` what ``orch jobs`` shows.)

**Loss** (the instance preempted, lost, broken, destroyed by someone else, stopped mid-training,
unreachable past ``job_unreachable_minutes``, or the training crashed): the reason is recorded;
the old instance's ``last.pt`` is taken when it can still be read and loads there (same copy and
check), else the resume copy stands; the old instance is destroyed; the offers are ranked again
live (another provider if it ranks first) and the next attempt stages the data, uploads the resume
copy and its metrics (trimmed to its epoch) into the new run and resumes (``training.launch``
checks it loads again there, and that it is below ``--epochs``). No intact copy: it starts over.
At most ``--retries`` relaunches (a launch that fails counts; an interrupted one does not), and
``--max-cost`` caps every attempt's cost together (``cost.instance_cost``): a running attempt
that would cross it before the next look is pulled and destroyed.

**Completion**: everything pulled (verified: size and SHA-256 computed on the instance), then the
instance destroyed (``--keep``: stopped, where the provider can). The job records where the
weights are, its cost, its attempts, and how long each phase took.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator import checkpoints, claims, resume_copy, states
from orchestrator import job_record as record
from orchestrator.job_record import checkpoint_dir, job_dir, note, weights_dir
from orchestrator.errors import HostKeyMismatch, NoCapacity, OrchError, SSHError, UsageError
from orchestrator.provider import Request
from orchestrator.text import clean
from orchestrator.text import why as _why

# Job states
PLANNED, RUNNING, RECOVERING = "planned", "running", "recovering"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
ACTIVE = (PLANNED, RUNNING, RECOVERING)
ENDED = (COMPLETED, FAILED, CANCELLED)
# Attempt states
LAUNCHING, TRAINING, DONE, LOST, LAUNCH_FAILED = "launching", "running", "completed", "lost", "failed"
INTERRUPTED, STOPPED_BY_JOB = "interrupted", "cancelled"

MAX_RETRIES = 20
MAX_NAME = 36  # an attempt's instance is NAME-aK: 40 characters at most
MAX_GROUP_JOB_NAME = 33  # a group attempt's nodes are NAME-aK-R: 40 characters at most (K <= 21, R <= 63)
UNREACHABLE_MINUTES = 10.0  # job_unreachable_minutes in config.toml
REAPER_EVERY_S = 300.0  # the reaper's interval when no schedule is installed (`orch reaper install`'s default)
IDLE_PASSES = 3  # a job's instance idles at least this many reaper intervals before it may be ended
ACTOR_NOTE = "job"


# -- names and folders ---------------------------------------------------------------------------
def check_job_name(name: str) -> None:
    from orchestrator.lifecycle import check_name

    check_name(name)
    if len(name) > MAX_NAME:
        raise UsageError(f"a job name has at most {MAX_NAME} characters (its instances are NAME-a1, NAME-a2, ...), "
                         f"not {len(name)}")


def attempt_name(job_name: str, number: int) -> str:
    return f"{job_name}-a{number}"


def _link_runs(home: Path, job_name: str, instance_name: str) -> None:
    """runs/NAME-aK -> runs/NAME, so whoever pulls the attempt's run pulls into the job's folder.
    A real folder already there (an unrelated instance of that name) is left alone: the job's own
    pulls name their destination anyway."""
    runs = Path(home) / "runs"
    weights_dir(home, job_name).mkdir(parents=True, exist_ok=True)
    link = runs / instance_name
    if not link.exists() and not link.is_symlink():
        link.symlink_to(job_name)


# -- the spec: everything a relaunch needs, from any orch process ------------------------------
@dataclass
class JobSpec:
    """A job of one of two kinds: ``train`` (a LibreYOLO training) or ``command`` (a task's ``run:``,
    ``orchestrator.command_job``); the engine is the same, the kind says what an attempt runs."""

    train: Any  # training.TrainSpec, prepared (its data packed or sized); None for a command
    request: Request  # as the user asked (the plan fills in gpu/offer/bid per attempt)
    providers: list[str] | None = None
    ssh_timeout: float | None = None  # seconds
    policy: str = "{}"  # the base policy (flags > config.toml > defaults), as JSON
    images: int | None = None  # training images, for the estimate
    nodes: int = 1  # machines per attempt: a group (``group_jobs``)
    command: Any = None  # task.CommandSpec (names of secrets, never their values)
    max_price: float | None = None  # $/hr: offers above it are not ranked

    def to_json(self) -> str:
        train = None
        if self.train is not None:
            train = asdict(self.train)
            train["local_tar"] = str(self.train.local_tar) if self.train.local_tar else None
        req = asdict(self.request)
        req.pop("env", None)  # never stored: nothing secret in the ledger
        extra = {"command": asdict(self.command), "max_price": self.max_price} if self.command is not None else {}
        if self.max_price is not None:
            extra["max_price"] = self.max_price
        return json.dumps({"train": train, "request": req, "providers": self.providers,
                           "ssh_timeout": self.ssh_timeout, "policy": self.policy, "images": self.images,
                           "nodes": self.nodes, **extra},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        from orchestrator.task import CommandSpec
        from orchestrator.training import TrainSpec

        d = json.loads(text)
        train = TrainSpec(**d["train"]) if d.get("train") else None
        if train is not None:
            train.local_tar = Path(train.local_tar) if train.local_tar else None
        command = CommandSpec(**d["command"]) if d.get("command") else None
        return cls(train=train, request=Request(**d["request"]), providers=d.get("providers"),
                   ssh_timeout=d.get("ssh_timeout"), policy=d.get("policy") or "{}", images=d.get("images"),
                   command=command, max_price=d.get("max_price"), nodes=d.get("nodes") or 1)


def default_save_period(epochs: int) -> int:
    """About ten epoch_N.pt milestones per job (every epoch for jobs of ten epochs or fewer): each is a
    whole checkpoint pulled home, so more would cost disk and transfer, fewer would leave long gaps.
    (Resuming never needs them: it uses the verified copy of last.pt.)"""
    return max(1, -(-epochs // 10))


# -- planning --------------------------------------------------------------------------------
@dataclass
class Choice:
    """Where one attempt runs and what it is expected to cost."""

    provider: str
    request: Request
    line: str
    key: str | None = None  # provider/offer id, to leave out after a launch there failed
    price_hr: float | None = None
    hours: float | None = None  # for the epochs left
    usd: float | None = None

    def to_dict(self) -> dict:
        return {"provider": self.provider, "offer": self.key, "line": self.line, "price_hr": self.price_hr,
                "hours": None if self.hours is None else round(self.hours, 4),
                "usd": None if self.usd is None else round(self.usd, 6), "gpu": self.request.gpu,
                "gpus": self.request.gpus, "cpu": self.request.cpu, "spot": self.request.spot}


def plan(orch, js: JobSpec, epochs_left: int | None = None, avoid: set[str] | None = None) -> Choice:
    """The attempt's offer: the cheapest per job among live offers (asked now, never cached), or the
    provider named for a CPU job or a hand-picked offer."""
    from orchestrator import config, offers, plugins
    from orchestrator.provider import bid_with_margin

    req, spec = js.request, js.train
    left = epochs_left if epochs_left is not None else (spec.epochs if spec else None)
    if req.cpu or req.offer:
        provider = (js.providers or [None])[0] or plugins.default_provider()
        what = "a CPU-only instance" if req.cpu else f"offer {req.offer}"
        if js.nodes > 1:
            what = f"a group of {js.nodes} x {what}"
        return Choice(provider, req, f"{provider}, {what} (given, nothing to rank: its $/hr is known once rented)")
    mode = "spot" if req.spot else "on-demand"
    job = offers.Job(model=spec.model, epochs=spec.epochs, data=spec.data, data_bytes=spec.data_bytes,
                     images=js.images, imgsz=spec.imgsz) if spec else None  # a command: ranked per hour
    query = offers.Query(gpu=req.gpu, gpus=req.gpus, mode=mode, disk_gb=req.disk_gb, providers=js.providers,
                         max_price=js.max_price)
    answer = offers.search(orch, query, job, fresh=True)
    for name, error in answer.errors:
        orch.say(f"      {name} not compared: {error}")
    for name, why in answer.skipped:
        orch.say(f"      {name} not asked: {why}")
    rows = [r for r in answer.rows if f"{r.offer.provider}/{r.offer.offer_id}" not in (avoid or set())]
    if js.nodes > 1:  # the group's prices (N machines) and its assumed speedup, stated in the line
        rows = offers.for_nodes(rows, js.nodes, offers.check_scaling(config.get("node_scaling",
                                                                                offers.NODE_EFFICIENCY)))
    if not rows:
        raise NoCapacity(f"no {mode} offer for {req.gpus}x {req.gpu or 'any GPU'} from "
                         f"{', '.join(answer.asked) or 'any provider'}"
                         + (" (besides those that failed for this job)" if answer.rows else "")
                         + (f"; not asked: {', '.join(n for n, _ in answer.skipped)} (`orch check` says what each "
                            "needs)" if answer.skipped else ""))
    best = rows[0]
    spot = mode == "spot"
    bid = req.bid
    if spot and bid is None and best.offer.min_bid_per_gpu:
        bid = bid_with_margin(best.offer.min_bid_per_gpu, float(config.get("spot_margin", offers.DEFAULT_SPOT_MARGIN)))
    price = best.spot_hr if spot else best.price_hr
    hours = best.hours * left / spec.epochs if best.hours is not None else None
    usd = hours * price if hours is not None and price is not None else None
    line = offers.describe(best, mode) + (f", bid {bid:.3f}" if spot and bid else "")
    if js.nodes > 1:
        line = f"{js.nodes} nodes of: {line}"
    if spec and left != spec.epochs and usd is not None:
        line += f"; the {left} epochs left ~{hours:.2f} h, ${usd:.2f}"
    chosen = replace(req, gpu=best.offer.gpu_name, gpus=best.offer.gpus, offer=best.offer.offer_id, bid=bid)
    return Choice(best.offer.provider, chosen, line, f"{best.offer.provider}/{best.offer.offer_id}", price, hours, usd)


def check_plan(choice: Choice, max_cost: float | None, spent: float = 0.0) -> None:
    """Refuse a plan whose estimate, with what was spent, is over --max-cost (exit 2: nothing rented)."""
    if max_cost is None or choice.usd is None:
        return
    if spent + choice.usd > max_cost:
        raise UsageError(f"the plan is estimated at ${choice.usd:.4f}" + (f" (after ${spent:.4f} spent)" if spent else "")
                         + f", over --max-cost ${max_cost:g}: {choice.line}")


# -- the ledger side ---------------------------------------------------------------------------
def cost(orch, job) -> float:
    """What every attempt's instance cost (running and stopped, at the price paid), until now."""
    from orchestrator import group_jobs

    total = 0.0
    for attempt in orch.ledger.attempts(job.id):
        inst = orch.ledger.get(attempt.instance_id) if attempt.instance_id else None
        if inst is not None:
            total += group_jobs.cost(orch, inst)  # every node of a group attempt
    return total


def _current(orch, job):
    attempts = orch.ledger.attempts(job.id)
    return attempts[-1] if attempts else None


def _relaunches(attempts) -> int:
    """Attempts after the first, an interrupted launch (Ctrl-C, a crash of orch) not counted."""
    counted = [a for a in attempts if a.state != INTERRUPTED]
    return max(len(counted) - 1, 0)


def _end_attempt(orch, attempt, state: str, reason: str):
    fields = {"state": state, "reason": reason[:2000], "ended_at": record.now()}
    if attempt.run_id is not None:
        run = orch.ledger.get_run(attempt.run_id)
        started = record.utc(run.started_at) if run else None
        end = record.utc(run.ended_at) if run and run.ended_at and state == DONE else record.now()
        if started:
            phases = record.add_phase(record.loads(attempt.phases, {}), "train", (end - started).total_seconds())
            fields["phases"] = json.dumps(phases)
    return orch.ledger.update_attempt(attempt.id, **fields)


def _finish_job(orch, job, state: str, reason: str, **fields):
    job = orch.ledger.update_job(job.id, expect=ACTIVE, state=state, reason=reason[:2000], ended_at=record.now(),
                                 cost_usd=cost(orch, job), **fields)
    if state in (COMPLETED, FAILED):  # what a user waits to hear about, with the laptop closed
        from orchestrator import notify

        notify.job_ended(job.name, state, reason)
    return note(orch, job, f"{state}: {reason}")


# -- caps --------------------------------------------------------------------------------------
def _reaper_every(ledger) -> float:
    info = ledger.get_json_meta("reaper:schedule")
    every = info.get("every") if isinstance(info, dict) else None
    return float(every) if isinstance(every, (int, float)) and every > 0 else REAPER_EVERY_S


def idle_floor_minutes(ledger) -> float:
    return IDLE_PASSES * _reaper_every(ledger) / 60


def deadline_hours(orch, job, price_hr: float | None) -> float | None:
    """Hours an attempt may still run: to --max-hours after the job began, and what --max-cost still
    pays for at ``price_hr``. None: no cap. At or below zero: the job must stop."""
    left = []
    if job.max_hours:
        left.append((record.utc(job.created_at) + timedelta(hours=job.max_hours) - record.now()).total_seconds() / 3600)
    if job.max_cost is not None and price_hr:
        left.append((job.max_cost - cost(orch, job)) / price_hr)
    return min(left) if left else None


class _CapReached(OrchError):
    """--max-cost or --max-hours leaves nothing for another attempt."""


def _over_cap(orch, job, inst=None) -> str | None:
    """Why the job must stop now: its cost (looking one reaper interval ahead on a running
    instance, so the cap is not crossed before the next look) or its deadline."""
    spent = cost(orch, job)
    if job.max_cost is not None:
        from orchestrator import group_jobs

        ahead = (group_jobs.hourly(orch, inst) if inst is not None else 0.0) * _reaper_every(orch.ledger) / 3600
        if spent + ahead >= job.max_cost:
            return (f"--max-cost ${job.max_cost:g} reached (${spent:.4f} spent"
                    + (f", ${ahead:.4f} more before the next look" if ahead else "") + ")")
    if job.max_hours and record.now() >= record.utc(job.created_at) + timedelta(hours=job.max_hours):
        return f"--max-hours {job.max_hours:g} reached"
    return None


def attempt_policy(orch, job, js: JobSpec, price_hr: float | None) -> str:
    """The base policy, with the idle floor (see the module's docstring) and the job's deadline."""
    from orchestrator import policy as policies

    base = policies.Policy(**record.loads(js.policy, {}))
    hours = deadline_hours(orch, job, price_hr)
    if hours is not None and hours <= 0:
        raise _CapReached(_over_cap(orch, job) or "no money or time left for another attempt")
    pol = replace(base, idle_minutes=max(base.idle_minutes, idle_floor_minutes(orch.ledger)),
                  max_hours=min(h for h in (hours, base.max_hours or None) if h) if (hours or base.max_hours) else 0.0)
    return pol.to_json()


# -- creating a job --------------------------------------------------------------------------
def create(orch, name: str, js: JobSpec, choice: Choice, max_cost: float | None, max_hours: float | None,
           retries: int, keep: bool, plan_seconds: float, resume_from: Path | None = None):
    """The job's row (planned) and, with ``resume_from`` (a pulled run folder), its first resume copy."""
    job = orch.ledger.create_job(ACTIVE, name=name, state=PLANNED, spec=js.to_json(),
                                 plan=json.dumps(choice.to_dict()), max_cost=max_cost, max_hours=max_hours,
                                 retries=retries, keep=keep, phases=json.dumps({"plan": round(plan_seconds, 3)}),
                                 nodes=js.nodes)
    if resume_from is not None:
        epoch = resume_copy.pulled_epoch(resume_from) or 0
        dest = checkpoint_dir(orch.home, name, epoch)
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "weights").mkdir(parents=True)
        shutil.copyfile(resume_from / "weights" / "last.pt", dest / "weights" / "last.pt")
        if (resume_from / "metrics.jsonl").is_file():
            shutil.copyfile(resume_from / "metrics.jsonl", dest / "metrics.jsonl")
        job = orch.ledger.update_job(job.id, checkpoint_epoch=epoch)
        job = note(orch, job, f"resumes from {resume_from / 'weights' / 'last.pt'} (epoch {epoch or '?'})", say=False)
    return note(orch, job, f"planned: {choice.line}", say=False)


# -- launching an attempt ----------------------------------------------------------------------
def launch(orch, job, js: JobSpec, choice: Choice, number: int):
    """Rent, provision, stage and start attempt ``number`` (resuming from the job's copy, if any);
    returns the job, running. Whatever fails after the create destroys the instance (``Orch.up``)."""
    from orchestrator import training

    name = attempt_name(job.name, number)
    _link_runs(orch.home, job.name, name)
    attempt = orch.ledger.add_attempt(job_id=job.id, number=number, instance_name=name, provider=choice.provider,
                                      offer=json.dumps({"key": choice.key, "line": choice.line}),
                                      price_hr=choice.price_hr, state=LAUNCHING)
    t0 = time.monotonic()
    marks: dict[str, Any] = {}

    def start_training(inst):
        from orchestrator import group_jobs

        marks["ready"] = time.monotonic()
        nodes = group_jobs.nodes_of(orch, inst)
        price = sum(n.price_hr or 0.0 for n in nodes)  # every node of a group
        marks["price"] = price
        orch.ledger.update_attempt(attempt.id, instance_id=inst.id, price_hr=price)
        pol = attempt_policy(orch, job, js, price)
        inst.policy = pol  # the watchdog is armed from this very row right after this call
        for node in nodes:
            orch.ledger.update(node.id, policy=pol)
        if js.command is not None:  # the command kind: its workdir and checkpoint folder, then its run
            from orchestrator import command_job

            copy = orch.ledger.get_job(job.id).checkpoint_epoch
            src = checkpoint_dir(orch.home, job.name, copy) if copy else None
            marks["start"] = copy if src is not None and src.is_dir() else None
            marks["run"] = command_job.launch(orch, inst, js.command, src if marks["start"] else None)
            return
        spec = _prepared(orch, js)
        ckpt = orch.ledger.get_job(job.id).checkpoint_epoch
        marks["start"] = resume_copy.stage(orch, job, inst, spec, ckpt) if ckpt is not None else None
        if marks["start"] is not None:
            spec = replace(spec, resume=True)
        if js.nodes > 1:
            from orchestrator import group_training

            marks["run"] = group_training.launch(orch, nodes, spec)
        else:
            marks["run"] = training.launch(orch, inst, spec)

    policy = attempt_policy(orch, job, js, choice.price_hr)  # a group's price: every node's (``plan``)
    try:
        if js.nodes > 1:
            from orchestrator import groups

            inst = groups.up(orch, name, choice.provider, choice.request, js.nodes, policy=policy,
                             ssh_timeout=js.ssh_timeout, launch=lambda ready: start_training(ready[0]))[0]
        else:
            inst = orch.up(name, choice.provider, choice.request, ssh_timeout=js.ssh_timeout, policy=policy,
                           after_verify=start_training, prepare=js.command is None)  # a command's setup: its own
    except BaseException as e:
        from orchestrator import groups

        made = orch.ledger.by_name(groups.node_name(name, 0) if js.nodes > 1 else name, live_only=False)
        linked = made.id if made is not None and record.utc(made.created_at) >= record.utc(attempt.started_at) - \
            timedelta(seconds=5) else None
        interrupted = isinstance(e, KeyboardInterrupt)
        orch.ledger.update_attempt(attempt.id, state=INTERRUPTED if interrupted else LAUNCH_FAILED,
                                   reason=f"launch failed: {_why(e)}", ended_at=record.now(), instance_id=linked)
        raise
    run = marks["run"]
    start = marks.get("start")
    now = time.monotonic()
    phases = {"provision": round(marks["ready"] - t0, 3), "stage": round(now - marks["ready"], 3)}
    job = orch.ledger.get_job(job.id)
    lost_at = record.loads(job.phases, {}).pop("lost_at", None)
    if lost_at:
        phases["recover"] = round((record.now() - datetime.fromisoformat(lost_at)).total_seconds(), 3)
        job = orch.ledger.update_job(job.id, phases=json.dumps({k: v for k, v in record.loads(job.phases, {}).items()
                                                                if k != "lost_at"}))
    resumed = f"resumed from the job's verified copy of last.pt (epoch {start})" if start is not None else \
        "started at epoch 1"
    if js.command is not None:
        resumed = f"checkpoint folder restored from copy {start}" if start is not None else "started"
    orch.ledger.update_attempt(attempt.id, state=TRAINING, instance_id=inst.id, run_id=run.id,
                               price_hr=marks.get("price", inst.price_hr),
                               start_epoch=(start or 0) + 1, resumed_from=resumed, phases=json.dumps(phases))
    job = orch.ledger.update_job(job.id, expect=(PLANNED, RECOVERING), state=RUNNING, reason=None)
    return note(orch, job, f"attempt {number} {'running' if js.command else 'training'} on {choice.provider} as "
                           f"{name} ({resumed})")


def _prepared(orch, js: JobSpec):
    """The training spec with its data ready to stage: the packed tar is in orch's cache unless it
    was cleaned, when the folder is packed again (the same content gives the same tar)."""
    from orchestrator import training

    spec = replace(js.train, resume=False)
    if spec.data.startswith("hf://") or (spec.local_tar and spec.local_tar.is_file()):
        return spec
    return training.prepare(spec, orch.home, orch.say)


def relaunch(orch, job, js: JobSpec | None = None):
    """Launch attempts until one trains, the retries run out, or a cap says stop (one call may try
    several offers: a launch that fails moves on to the next best one at once)."""
    js = js or JobSpec.from_json(job.spec)
    while True:
        job = orch.ledger.get_job(job.id)
        if job.state in ENDED:
            return job
        attempts = orch.ledger.attempts(job.id)
        counted = [a for a in attempts if a.state != INTERRUPTED]
        if counted and _relaunches(attempts) >= job.retries:
            last = counted[-1].reason or "lost"
            return _finish_job(orch, job, FAILED, f"{job.retries} relaunch(es) used up; the last attempt: {last}"
                               + _kept(orch, job, "; "))
        over = _over_cap(orch, job)
        if over:
            return _finish_job(orch, job, FAILED, f"{over}: no further attempt" + _kept(orch, job, "; "))
        done = job.checkpoint_epoch or 0
        if js.train is not None and done >= js.train.epochs:
            return _complete_from_copies(orch, job, js)
        missing = _missing_secrets(js) if js.command is not None else []
        if missing:  # nothing rented that could not be started
            why = (f"waiting for an orch process with {', '.join(missing)} in its environment "
                   f"(`orch jobs show {job.name}` where it is set relaunches it)")
            return note(orch, orch.ledger.update_job(job.id, reason=why), why) if job.reason != why else job
        avoid = {(record.loads(a.offer, {}) or {}).get("key") for a in attempts if a.state == LAUNCH_FAILED} - {None}
        t0 = time.monotonic()
        try:
            choice = plan(orch, js, js.train.epochs - done if js.train else None, avoid)
        except UsageError as e:
            return _finish_job(orch, job, FAILED, f"cannot plan: {_why(e)}")
        except OrchError as e:  # no capacity, providers failing: the next look asks again
            job = record.job_phase(orch, job, "plan", time.monotonic() - t0)
            job = orch.ledger.update_job(job.id, reason=f"waiting for an offer: {_why(e)}")
            return note(orch, job, f"no offer to relaunch on now ({_why(e)}): the next look asks again")
        job = record.job_phase(orch, job, "plan", time.monotonic() - t0)
        try:
            check_plan(choice, job.max_cost, cost(orch, job))
        except UsageError as e:
            return _finish_job(orch, job, FAILED, _why(e))
        number = (attempts[-1].number if attempts else 0) + 1
        job = note(orch, job, f"attempt {number}: {choice.line}")
        try:
            return launch(orch, job, js, choice, number)
        except KeyboardInterrupt:
            note(orch, orch.ledger.get_job(job.id), f"attempt {number} interrupted while launching", say=False)
            raise
        except (UsageError, _CapReached) as e:
            return _finish_job(orch, orch.ledger.get_job(job.id), FAILED, f"attempt {number}: {_why(e)}")
        except OrchError as e:
            job = orch.ledger.get_job(job.id)
            if job.state == PLANNED:
                job = orch.ledger.update_job(job.id, expect=PLANNED, state=RECOVERING)
            job = orch.ledger.update_job(job.id, reason=f"attempt {number} failed to launch: {_why(e)}")
            note(orch, job, f"attempt {number} failed to launch: {_why(e)}")


def start(orch, job):
    """Launch the first attempt of a planned job (``orch run``)."""
    with claims.hold(orch.ledger, _claim(job.name)):
        return relaunch(orch, job)


def _claim(name: str) -> str:
    return f"job:{name}"  # a colon: no instance name can take this claim


def _complete_from_copies(orch, job, js: JobSpec):
    """The resume copy already holds the last epoch (the instance went after its last epoch and
    before its final pull): its last.pt and the milestones pulled before are the job's weights."""
    src = checkpoint_dir(orch.home, job.name, job.checkpoint_epoch)
    _, unsafe = checkpoints.vet(src / "weights" / "last.pt")
    if unsafe:  # changed at home since it was kept: never handed to the user as the job's weights
        return _finish_job(orch, job, FAILED, f"the copy of epoch {job.checkpoint_epoch} is no checkpoint to keep: "
                                              f"{unsafe}")
    dest = weights_dir(orch.home, job.name)
    (dest / "weights").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "weights" / "last.pt", dest / "weights" / "last.pt")
    return _finish_job(orch, job, COMPLETED, f"the instance went after epoch {job.checkpoint_epoch} of "
                                             f"{js.train.epochs}: weights from the copies pulled before, in {dest}",
                       weights=str(dest))


# -- looking at a job --------------------------------------------------------------------------
def advance(orch, job):
    """One look at an active job, and the step it calls for (see the module's docstring). A job
    another orch process is advancing is returned as the ledger has it."""
    if job.state in ENDED:
        return job
    with claims.try_hold(orch.ledger, _claim(job.name)) as mine:
        if not mine:
            return job
        job = orch.ledger.get_job(job.id)
        if job.state in ENDED:
            return job
        return _advance(orch, job)


def advance_all(orch) -> list[dict]:
    """Every active job, one look each (the reaper's ``after``): one job's trouble never stops the others."""
    from orchestrator import ledger_rows

    out: list[dict] = []
    if not ledger_rows.jobs_in(ACTIVE, orch.ledger.url):  # plain SQL: no job, no ledger opened
        return out
    for job in orch.ledger.jobs(ACTIVE):
        try:
            job = advance(orch, job)
            out.append({"name": job.name, "state": job.state, "reason": job.reason or ""})
        except Exception as e:  # noqa: BLE001 - reported, and the next job still gets its look
            out.append({"name": job.name, "state": job.state, "reason": f"error: {_why(e)}"})
    return out


def _advance(orch, job):
    js = JobSpec.from_json(job.spec)
    attempt = _current(orch, job)
    if attempt is None or attempt.state in (LAUNCH_FAILED, INTERRUPTED, LOST):
        return relaunch(orch, job, js)
    if attempt.state == LAUNCHING:  # its process died mid-launch: we hold the job's claim now
        attempt = orch.ledger.update_attempt(attempt.id, state=INTERRUPTED, ended_at=record.now(),
                                             reason="the orch process launching it ended before it trained")
        from orchestrator import groups

        inst = orch.ledger.by_name(attempt.instance_name) or next(iter(groups.live(orch.ledger, attempt.instance_name)),
                                                                  None)
        if inst is not None:
            _give_back(orch, job, inst, f"job {job.name}: attempt {attempt.number} was left half-launched")
        return relaunch(orch, job, js)
    inst = orch.ledger.get(attempt.instance_id) if attempt.instance_id else None
    if inst is None:
        return _lost(orch, job, js, attempt, None, None, "its instance is not in the ledger")
    run = orch.ledger.latest_run(inst.id)
    if attempt.state == DONE:  # completed and pulled; the process ending it stopped before the teardown
        return _complete(orch, job, attempt, inst, run, "its weights were pulled before")
    if attempt.state == STOPPED_BY_JOB:  # stopped by a cap or a cancel that did not get to its end
        _give_back(orch, job, inst, f"job {job.name}: {attempt.reason or 'stopped'}")
        return _finish_job(orch, job, FAILED, attempt.reason or "stopped")
    try:
        inst = orch.refresh(inst)
    except OrchError as e:  # the provider did not answer: nothing is known, look again later
        return orch.ledger.update_job(job.id, reason=f"{inst.provider} did not answer: {_why(e)}")
    if inst.state == states.READY:
        if run is None or not run.run_dir:
            return _lost(orch, job, js, attempt, inst, run, "no training run on its instance")
        return _look(orch, job, js, attempt, inst, run)
    if inst.state in states.IN_PROGRESS:
        return job  # another orch command moves it (or reconcile settles it): the next look sees where it lands
    if run is not None and run.state == "completed" and inst.state == states.STOPPED:
        return _finish_stopped(orch, job, attempt, inst, run)
    if run is not None and run.state == "completed" and _pulled_after_end(run):
        return _complete(orch, job, attempt, inst, run, "its weights were pulled before its instance ended")
    events = orch.ledger.events(inst.id)
    last = next((e for e in reversed(events) if e.from_state != e.to_state), None)
    why = f"instance {inst.state}" + (f" ({clean(last.reason, 200)}, by {last.actor})" if last else "")
    return _lost(orch, job, js, attempt, inst, run, why)


def _pulled_after_end(run) -> bool:
    from orchestrator import rules

    return run.ended_at is not None and rules.weights_safe(run, None, record.now())


def _look(orch, job, js: JobSpec, attempt, inst, run):
    from orchestrator import training

    try:
        if js.command is not None:
            from orchestrator import command_job

            view = command_job.read(orch, inst, run)
        else:
            view = training.read(orch, inst, run)
    except HostKeyMismatch as e:
        return _lost(orch, job, js, attempt, inst, run, f"its host key changed ({_why(e)}): not trusted")
    except SSHError as e:
        since = record.utc(attempt.unreachable_since) or record.now()
        if attempt.unreachable_since is None:
            orch.ledger.update_attempt(attempt.id, unreachable_since=since)
        bound = float(_config("job_unreachable_minutes", UNREACHABLE_MINUTES))
        away = (record.now() - since).total_seconds() / 60
        if away >= bound:
            return _lost(orch, job, js, attempt, inst, run, f"unreachable for {away:.1f} min ({_why(e)})")
        return orch.ledger.update_job(job.id, reason=f"unreachable for {away:.1f} of {bound:g} min: {_why(e)}")
    if attempt.unreachable_since is not None:
        orch.ledger.update_attempt(attempt.id, unreachable_since=None)
    if view.get("epoch") is not None and view["epoch"] != job.epoch:
        job = orch.ledger.update_job(job.id, epoch=view["epoch"])
    state = view["state"]
    if state == "completed":
        return _finish(orch, job, attempt, inst, run, view)
    if state == "failed" and js.command is not None:  # the command's own exit: no relaunch repeats it
        return _command_failed(orch, job, attempt, inst, run, view)
    from orchestrator import group_jobs

    # Any node of a group lost ends the attempt (the head alone would wait for it for hours, or
    # crash for want of it: the lost node is the cause worth recording).
    gone = group_jobs.lost_node(orch, inst, float(_config("job_unreachable_minutes", UNREACHABLE_MINUTES)))
    if gone:
        return _lost(orch, job, js, attempt, inst, run, gone)
    if state in ("failed", "crashed"):
        return _lost(orch, job, js, attempt, inst, run, f"training {state}" + (f": {view['error']}" if view.get("error")
                                                                               else ""))
    (_command_progress if js.command is not None else _progress)(orch, job, inst, run, view)
    job = orch.ledger.get_job(job.id)
    over = _over_cap(orch, job, inst)
    if over:
        return _stop_over_cap(orch, job, attempt, inst, run, over)
    return orch.ledger.update_job(job.id, reason=None) if job.reason else job


def _config(key: str, default):
    from orchestrator import config

    return config.get(key, default)


def _progress(orch, job, inst, run, view: dict) -> None:
    """While it trains: the milestones home, and a verified resume copy whenever the epoch moved."""
    from orchestrator import training

    try:
        training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), view=view, only_milestones=True)
    except OrchError as e:
        note(orch, job, f"milestones not pulled this time: {_why(e)}", say=False)
    epoch = view.get("epoch") or 0
    if epoch > (job.checkpoint_epoch or 0):
        try:
            _, problem = resume_copy.take(orch, job, inst, run)
        except OrchError as e:
            problem = _why(e)
        if problem:
            note(orch, orch.ledger.get_job(job.id), f"no resume copy this time: {problem}", say=False)


# -- the command kind's steps (what they do on the instance: orchestrator.command_job) -------------
def _missing_secrets(js: JobSpec) -> list[str]:
    import os

    return [n for n in js.command.secrets if not os.environ.get(n)]


def _command_checkpoint(orch, job, inst, run) -> tuple[int | None, str | None]:
    """The checkpoint folder home as copy K+1 (jobs/NAME/ckpt-K+1, the older copy dropped once it is
    in); (K+1, None), or (None, why not)."""
    from orchestrator import command_job

    cmd = JobSpec.from_json(job.spec).command
    if not cmd.checkpoint:
        return None, None
    old = orch.ledger.get_job(job.id).checkpoint_epoch
    number = (old or 0) + 1
    ok, problem = command_job.snapshot(orch, inst, cmd, checkpoint_dir(orch.home, job.name, number))
    if not ok:  # the next look tries again (a folder being written, or none yet)
        return None, problem
    phases = record.loads(orch.ledger.get_job(job.id).phases, {})
    phases["checkpoint_at"] = record.now().isoformat()  # a string: phases() sums numbers only
    orch.ledger.update_job(job.id, phases=json.dumps(phases), checkpoint_epoch=number)
    if old:
        shutil.rmtree(checkpoint_dir(orch.home, job.name, old), ignore_errors=True)
    return number, None


def _command_outputs(orch, job, inst, dest: Path, strict: bool = True) -> list[str]:
    from orchestrator import command_job

    cmd = JobSpec.from_json(job.spec).command
    if cmd is None:
        return []
    got, missing = command_job.pull_outputs(orch, inst, cmd, dest, strict=strict)
    if missing:
        note(orch, job, f"output(s) not found on {inst.name}: {', '.join(clean(m, 100) for m in missing)}")
    return got


def _command_progress(orch, job, inst, run, view: dict) -> None:
    """While the command runs: its log and status home; every checkpoint_minutes, the checkpoint
    folder and the outputs so far."""
    from orchestrator import command_job, training

    try:
        training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), view=view, only_milestones=True)
    except OrchError as e:
        note(orch, job, f"log not pulled this time: {_why(e)}", say=False)
    cmd = JobSpec.from_json(job.spec).command
    if not cmd.checkpoint or not command_job.due(record.loads(job.phases, {}).get("checkpoint_at"), cmd.checkpoint_minutes):
        return
    try:
        _, problem = _command_checkpoint(orch, job, inst, run)
        _command_outputs(orch, job, inst, weights_dir(orch.home, job.name), strict=False)
    except OrchError as e:
        problem = _why(e)
    if problem:
        note(orch, orch.ledger.get_job(job.id), f"no checkpoint copy this time: {problem}", say=False)


def _command_failed(orch, job, attempt, inst, run, view: dict):
    """The command exited non-zero (or its setup did): what it left comes home, the instance is
    given back, the job failed with the code and the log's last lines."""
    from orchestrator import command_job, training

    dest = weights_dir(orch.home, job.name)
    try:
        training.pull(orch, inst, run, dest=dest, view=view)
        _command_outputs(orch, job, inst, dest, strict=False)
    except OrchError as e:
        note(orch, job, f"not everything was pulled ({_why(e)})")
    code, phase = view.get("exit_code"), view.get("phase") or "run"
    why = f"{phase} exited {code if code is not None else '?'}"
    _end_attempt(orch, attempt, "failed", why)
    problem = _give_back(orch, job, inst, f"job {job.name}: {why}")
    tail = command_job.log_tail(dest / "train.log")
    return _finish_job(orch, orch.ledger.get_job(job.id), FAILED,
                       f"{why}; instance {inst.name} " + (f"NOT destroyed ({problem})" if problem else "destroyed")
                       + (f"; last lines: {tail}" if tail else ""))


# -- endings ---------------------------------------------------------------------------------
def _give_back(orch, job, inst, reason: str) -> str | None:
    """Destroy an attempt's instance if it still exists; why not, if it could not be."""
    from orchestrator import group_jobs, groups

    inst = orch.ledger.get(inst.id)
    if groups.is_group(inst):  # every node, at once: none is left alone (nor billing)
        try:
            group_jobs.give_back(orch, inst, reason)
            return None
        except OrchError as e:
            note(orch, job, f"could not destroy the group {inst.group_name} ({_why(e)}): the reaper keeps at it, "
                            "and its cost counts")
            return _why(e)
    if inst is None or inst.state not in states.LIVE:
        return None
    try:
        orch.down(inst, reason)
        return None
    except OrchError as e:
        note(orch, job, f"could not destroy {inst.name} ({_why(e)}): the reaper keeps at it, and its cost counts")
        return _why(e)


def _lost(orch, job, js: JobSpec, attempt, inst, run, why: str):
    """Record the loss, keep the newest intact checkpoint, give the instance back, relaunch."""
    attempt = _end_attempt(orch, attempt, LOST, why)
    job = orch.ledger.update_job(job.id, expect=(RUNNING, RECOVERING, PLANNED), state=RECOVERING,
                                 reason=f"attempt {attempt.number} lost: {why}")
    phases = record.loads(job.phases, {})
    phases["lost_at"] = record.now().isoformat()
    job = orch.ledger.update_job(job.id, phases=json.dumps(phases))
    job = note(orch, job, f"attempt {attempt.number} lost: {why}")
    from orchestrator import group_jobs, groups

    if groups.is_group(inst):  # the survivors would wait on their lost peer for hours: ended now
        problems = group_jobs.end_trainings(orch, inst)
        note(orch, job, "ended the training on every node that answers" + (f" (not: {'; '.join(problems)})"
                                                                           if problems else ""), say=False)
    if inst is not None and run is not None and run.run_dir and orch.ledger.get(inst.id).state == states.READY:
        try:  # the old instance still answers: its own last.pt, when it loads, and its milestones
            from orchestrator import training

            training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name), only_milestones=True)
            kept, problem = (_command_checkpoint if js.command is not None else resume_copy.take)(orch, job, inst, run)
            if kept:
                note(orch, job, f"took the checkpoint folder (copy {kept}) from {inst.name}" if js.command else
                     f"took last.pt (epoch {kept}) from {inst.name}: it loads there")
            elif problem:
                note(orch, job, f"{problem}; resuming from the job's copy"
                               + (f" (epoch {orch.ledger.get_job(job.id).checkpoint_epoch})"
                                  if orch.ledger.get_job(job.id).checkpoint_epoch else " (none: starting over)"))
        except OrchError as e:
            note(orch, job, f"could not read {inst.name} any more ({_why(e)}): resuming from the job's copy")
    if inst is not None:
        _give_back(orch, job, inst, f"job {job.name}: attempt {attempt.number} lost ({why[:200]}): destroyed, "
                                    "the job relaunches elsewhere")
    return relaunch(orch, orch.ledger.get_job(job.id), js)


def _finish(orch, job, attempt, inst, run, view: dict):
    """The training completed: everything home, verified, then the instance given back."""
    from orchestrator import training

    t0 = time.monotonic()
    dest = weights_dir(orch.home, job.name)
    try:
        got, _ = training.pull(orch, inst, run, dest=dest, view=view)
        got += _command_outputs(orch, job, inst, dest)
    except OrchError as e:
        job = orch.ledger.update_job(job.id, reason=f"completed, but the final pull failed ({_why(e)}): the next "
                                                   "look tries again; nothing is destroyed before")
        return note(orch, job, job.reason)
    job = record.job_phase(orch, job, "pull", time.monotonic() - t0)
    return _complete(orch, job, attempt, inst, run, f"pulled {len(got)} new file(s), verified")


def _complete(orch, job, attempt, inst, run, how: str):
    t0 = time.monotonic()
    train = JobSpec.from_json(job.spec).train
    attempt = _end_attempt(orch, attempt, DONE, f"{'training' if train is not None else 'command'} completed; {how}")
    dest = weights_dir(orch.home, job.name)
    inst = orch.ledger.get(inst.id)
    ended = "destroyed"
    if inst.state in states.LIVE:
        caps = orch.provider(inst.provider).capabilities_for(inst.spot)
        from orchestrator import groups

        if job.keep and groups.is_group(inst):
            note(orch, job, "--keep: a group is not kept stopped node by node; destroying it")
        elif job.keep and caps.stop and inst.state == states.READY:
            try:
                orch.stop(inst, f"job {job.name} completed: kept stopped (--keep)")
                ended = "stopped (--keep)"
            except UsageError as e:  # a provider that cannot stop this one (no disk to keep)
                note(orch, job, f"--keep: {_why(e)}; destroying it instead")
        if ended == "destroyed":
            problem = _give_back(orch, job, inst, f"job {job.name} completed: weights home in {dest}")
            if problem:
                ended = f"NOT destroyed ({problem})"
    job = record.job_phase(orch, job, "teardown", time.monotonic() - t0)
    # The resume copies served their purpose: the verified weights are in dest (last.pt among them).
    shutil.rmtree(job_dir(orch.home, job.name), ignore_errors=True)
    if train is None:
        return _finish_job(orch, job, COMPLETED, f"exit code 0; {how}; outputs in {dest}; instance {inst.name} {ended}",
                           weights=str(dest))
    return _finish_job(orch, job, COMPLETED, f"{train.epochs} epochs; {how}; weights in {dest}; instance {inst.name} "
                                             f"{ended}", weights=str(dest), epoch=max(job.epoch or 0, train.epochs))


def _finish_stopped(orch, job, attempt, inst, run):
    """Completed, then stopped before its weights came home (its watchdog, or someone): start it,
    pull, give it back."""
    try:
        inst = orch.start(inst, f"job {job.name}: started again to pull the finished run")
        from orchestrator import training

        view = training.read(orch, inst, run)
    except OrchError as e:
        return orch.ledger.update_job(job.id, reason=f"completed on a stopped instance that did not start "
                                                     f"({_why(e)}): the next look tries again")
    return _finish(orch, job, attempt, inst, run, view)


def _stop_over_cap(orch, job, attempt, inst, run, why: str):
    """A cap says stop: what can be pulled comes home, then the instance is destroyed all the same."""
    from orchestrator import training

    try:
        training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name))
        _command_outputs(orch, job, inst, weights_dir(orch.home, job.name), strict=False)
    except OrchError as e:
        note(orch, job, f"not everything was pulled before stopping ({_why(e)})")
    attempt = _end_attempt(orch, attempt, STOPPED_BY_JOB, why)
    _give_back(orch, job, inst, f"job {job.name}: {why}")
    return _finish_job(orch, orch.ledger.get_job(job.id), FAILED,
                       f"{why}: stopped at epoch {job.epoch or '?'}; what was pulled is in "
                       f"{weights_dir(orch.home, job.name)}" + _kept(orch, job, ", "))


def _kept(orch, job, sep: str) -> str:
    """Where a failed job's last intact checkpoint copy lies, for its reason ('' when it has none):
    a job stopped by a cap or out of retries still tells its user where the weights are."""
    if not job.checkpoint_epoch:
        return ""
    return (f"{sep}the last checkpoint (epoch {job.checkpoint_epoch}) in "
            f"{checkpoint_dir(orch.home, job.name, job.checkpoint_epoch)}")


def cancel(orch, job, wait: float = 120.0):
    """Stop the job: what can be pulled comes home, its instance is destroyed, it is cancelled."""
    from orchestrator import training

    with claims.hold(orch.ledger, _claim(job.name), wait=wait):
        job = orch.ledger.get_job(job.id)
        if job.state in ENDED:
            raise UsageError(f"job {job.name} is already {job.state}")
        attempt = _current(orch, job)
        inst = orch.ledger.get(attempt.instance_id) if attempt and attempt.instance_id else None
        if inst is not None and inst.state in states.LIVE:
            run = orch.ledger.latest_run(inst.id)
            if inst.state == states.READY and run is not None and run.run_dir:
                try:
                    training.pull(orch, inst, run, dest=weights_dir(orch.home, job.name))
                    _command_outputs(orch, job, inst, weights_dir(orch.home, job.name), strict=False)
                except OrchError as e:
                    note(orch, job, f"not everything was pulled before cancelling ({_why(e)})")
            if attempt.state in (LAUNCHING, TRAINING):
                _end_attempt(orch, attempt, STOPPED_BY_JOB, "cancelled by the user")
            problem = _give_back(orch, job, inst, f"job {job.name} cancelled")
            if problem:
                raise OrchError(f"job {job.name}: could not destroy {inst.name} ({problem}); the job stays "
                                f"{job.state}: `orch jobs cancel {job.name}` again")
        elif attempt is not None and attempt.state in (LAUNCHING, TRAINING):
            _end_attempt(orch, attempt, STOPPED_BY_JOB, "cancelled by the user")
        return _finish_job(orch, orch.ledger.get_job(job.id), CANCELLED, "cancelled by the user")


__all__ = ["JobSpec", "Choice", "plan", "check_plan", "create", "start", "advance", "advance_all", "cancel",
           "default_save_period", "check_job_name", "ACTIVE", "ENDED"]
