"""The job engine: one look at a job, and the step it calls for. Whatever the job runs (its kind,
``jobs.kinds``) and however many machines an attempt takes (``jobs.group``), the steps are these.

A job lives in the ledger (``jobs``, and one ``attempts`` row per machine or group that ran it),
so no terminal needs to stay open: every reaper pass, every ``orch jobs show`` and ``orch run
--wait`` call ``advance``. One process advances a job at a time (a claim on ``job:NAME``).

    planned --(attempt runs)--> running --(completed, pulled)--> completed (destroyed, or stopped: --keep)
       |                          |  \\--(loss)--> recovering --(next attempt runs)--> running
       |                          |                  \\--(retries, --max-cost, --max-hours)--> failed
       \\--(no attempt could launch)--> failed;   any active state --(orch jobs cancel)--> cancelled

- **Attempts.** Attempt K runs on ``NAME-aK`` (a group: ``NAME-aK-R``), rented with the job's policy
  (``caps.attempt_policy``). ``$ORCH_HOME/runs/NAME-aK`` links to ``runs/NAME``: every pull of an
  attempt lands in the job's one folder.
- **While it runs** the kind watches (milestones home, the checkpoint copy when it is due).
- **Loss** (preempted, lost, broken, destroyed by someone else, stopped mid-run, unreachable past
  ``job_unreachable_minutes``, its run crashed): the reason is recorded, the newest intact
  checkpoint is taken where the old machine still answers, the machine is destroyed, the offers are
  ranked again (another provider if it ranks first) and the next attempt restores the copy. One
  node of a group lost while the others answer: that node alone is replaced (``_replace``). At most
  ``--retries`` relaunches (a launch that fails counts; an interrupted one does not), and
  ``--max-cost`` caps every attempt together.
- **The work's own failure** (a command's non-zero exit) fails the job: no relaunch repeats it.
- **Completion**: everything home, verified, then the machine destroyed (``--keep``: stopped).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from orchestrator import states
from orchestrator.ledger import claims
from orchestrator.errors import HostKeyMismatch, OrchError, SSHError, UsageError
from orchestrator.jobs import caps, record
from orchestrator.jobs.plan import check_plan, plan
from orchestrator.jobs.record import checkpoint_dir, job_dir, note, weights_dir
from orchestrator.jobs.spec import JobSpec, attempt_name
from orchestrator.jobs.states import (ACTIVE, ATTEMPT_DONE, ATTEMPT_RUNNING, CANCELLED, COMPLETED, ENDED, FAILED,
                                      INTERRUPTED, LAUNCH_FAILED, LAUNCHING, LOST, PLANNED, RECOVERING, RUNNING,
                                      STOPPED, STOPPED_BY_JOB)
from orchestrator.provider import can_stop
from orchestrator.text import clean, row_json
from orchestrator.text import why as _why

UNREACHABLE_MINUTES = 10.0  # job_unreachable_minutes in config.toml


def claim(name: str) -> str:
    return f"job:{name}"  # a colon: no instance name can take this claim


def _config(key: str, default):
    from orchestrator import config

    return config.get(key, default)


def _link_runs(home: Path, job_name: str, instance_name: str) -> None:
    """runs/NAME-aK -> runs/NAME, so whoever pulls the attempt's run pulls into the job's folder.
    A real folder already there (an unrelated instance of that name) is left alone: the job's own
    pulls name their destination anyway."""
    runs = Path(home) / "runs"
    weights_dir(home, job_name).mkdir(parents=True, exist_ok=True)
    link = runs / instance_name
    if not link.exists() and not link.is_symlink():
        link.symlink_to(job_name)


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
        end = record.utc(run.ended_at) if run and run.ended_at and state == ATTEMPT_DONE else record.now()
        if started:
            phases = record.add_phase(row_json(attempt.phases, {}), "train", (end - started).total_seconds())
            fields["phases"] = json.dumps(phases)
    return orch.ledger.update_attempt(attempt.id, **fields)


def finish_job(orch, job, state: str, reason: str, **fields):
    reason = record.scrub(job, reason)  # a secret the work printed: hidden before it is stored or posted
    job = orch.ledger.update_job(job.id, expect=ACTIVE, state=state, reason=reason[:2000], ended_at=record.now(),
                                 cost_usd=caps.cost(orch, job), **fields)
    if state in (COMPLETED, FAILED):  # what a user waits to hear about, with the laptop closed
        from orchestrator import notify

        notify.job_ended(job.name, state, reason)
    return note(orch, job, f"{state}: {reason}")


def _kept(orch, job, sep: str) -> str:
    """Where a failed job's last intact checkpoint copy lies, for its reason ('' when it has none):
    a job stopped by a cap or out of retries still tells its user where the weights are."""
    if not job.checkpoint_epoch:
        return ""
    return (f"{sep}the last checkpoint (epoch {job.checkpoint_epoch}) in "
            f"{checkpoint_dir(orch.home, job.name, job.checkpoint_epoch)}")


# -- launching an attempt ----------------------------------------------------------------------
def launch(orch, job, js: JobSpec, choice, number: int, rent=None, name: str | None = None,
           kept: frozenset = frozenset()):
    """Rent, provision and start attempt ``number`` on ``choice`` (restoring the job's checkpoint
    copy, if any); returns the job, running. Whatever fails after the create destroys what was
    made (``groups.up``: one bring-up for 1..N machines). ``rent``: how the attempt gets its machines instead (a lost
    node replaced in its group: ``_replace``), called with the start and returning the head."""
    from orchestrator.instances import groups
    from orchestrator.jobs import group

    kind = js.kind_of()
    name = name or attempt_name(job.name, number)
    _link_runs(orch.home, job.name, name)
    attempt = orch.ledger.add_attempt(job_id=job.id, number=number, instance_name=name, provider=choice.provider,
                                      offer=json.dumps({"key": choice.key, "line": choice.line,
                                                        "place": choice.place, "gpu": choice.gpu}),
                                      price_hr=choice.price_hr, state=LAUNCHING)
    t0 = time.monotonic()
    marks: dict = {}

    def start(head) -> None:
        marks["ready"] = time.monotonic()
        nodes = group.nodes_of(orch, head)
        price = sum(n.price_hr or 0.0 for n in nodes)  # every node of a group
        marks["price"] = price
        orch.ledger.update_attempt(attempt.id, instance_id=head.id, price_hr=price)
        pol = caps.attempt_policy(orch, job, js, price)
        head.policy = pol  # the watchdog is armed from this very row right after this call
        for node in nodes:
            orch.ledger.update(node.id, policy=pol)
        marks["launched"] = kind.launch(orch, job, nodes, orch.ledger.get_job(job.id).checkpoint_epoch, kept)

    policy = caps.attempt_policy(orch, job, js, choice.price_hr)  # a group's price: every node's (``plan``)
    try:
        if rent is not None:
            inst = rent(start)
        else:  # one machine or a group: one bring-up, the kind launched once every node is ready
            inst = groups.up(orch, name, choice.provider, choice.request, js.nodes, policy=policy,
                             ssh_timeout=js.ssh_timeout, launch=lambda ready: start(ready[0]),
                             prepare=kind.provisioning())[0]
    except BaseException as e:
        made = orch.ledger.by_name(groups.names(name, js.nodes)[0], live_only=False)
        linked = made.id if made is not None and record.utc(made.created_at) >= record.utc(attempt.started_at) - \
            timedelta(seconds=5) else None
        interrupted = isinstance(e, KeyboardInterrupt)
        orch.ledger.update_attempt(attempt.id, state=INTERRUPTED if interrupted else LAUNCH_FAILED,
                                   reason=f"launch failed: {_why(e)}", ended_at=record.now(), instance_id=linked)
        raise
    launched = marks["launched"]
    now = time.monotonic()
    phases = {"provision": round(marks["ready"] - t0, 3), "stage": round(now - marks["ready"], 3)}
    job = orch.ledger.get_job(job.id)
    lost_at = row_json(job.phases, {}).pop("lost_at", None)
    if lost_at:
        phases["recover"] = round((record.now() - datetime.fromisoformat(lost_at)).total_seconds(), 3)
        job = orch.ledger.update_job(job.id, phases=json.dumps({k: v for k, v in row_json(job.phases, {}).items()
                                                                if k != "lost_at"}))
    orch.ledger.update_attempt(attempt.id, state=ATTEMPT_RUNNING, instance_id=inst.id, run_id=launched.run.id,
                               price_hr=marks.get("price", inst.price_hr), start_epoch=(launched.copy or 0) + 1,
                               resumed_from=launched.resumed, phases=json.dumps(phases))
    job = orch.ledger.update_job(job.id, expect=(PLANNED, RECOVERING), state=RUNNING, reason=None)
    return note(orch, job, f"attempt {number} {kind.doing} on {choice.provider} as {name} ({launched.resumed})")


def relaunch(orch, job, js: JobSpec | None = None, choice=None):
    """Launch attempts until one runs, the retries run out, or a cap says stop (one call may try
    several offers: a launch that fails moves on to the next best one at once). ``choice``: the
    plan already made for the first attempt (``submit``'s), rented as recorded."""
    js = js or JobSpec.from_json(job.spec)
    kind = js.kind_of()
    if job.state not in ENDED:  # (an ended job's machines are its ending's: --keep keeps one)
        _end_given_up(orch, job)
    while True:
        job = orch.ledger.get_job(job.id)
        if job.state in ENDED:
            return job
        attempts = orch.ledger.attempts(job.id)
        counted = [a for a in attempts if a.state != INTERRUPTED]
        if counted and _relaunches(attempts) >= job.retries:
            last = counted[-1].reason or "lost"
            return finish_job(orch, job, FAILED, f"{job.retries} relaunch(es) used up; the last attempt: {last}"
                              + _kept(orch, job, "; "))
        over = caps.over_cap(orch, job)
        if over:
            return finish_job(orch, job, FAILED, f"{over}: no further attempt" + _kept(orch, job, "; "))
        ended = kind.done_by_copy(orch, job)
        if ended is not None:
            state, reason, fields = ended
            return finish_job(orch, job, state, reason, **fields)
        refused = kind.refused(orch, job)
        if refused:  # nothing rented: the row asks what none may
            return finish_job(orch, job, FAILED, refused)
        blocked = kind.blocked(orch, job)
        if blocked:  # nothing rented that could not be started
            why = f"{blocked} (`orch jobs show {job.name}` where it is set relaunches it)"
            return note(orch, orch.ledger.update_job(job.id, reason=why), why) if job.reason != why else job
        if choice is None:
            avoid = {row_json(a.offer, {}).get("key") for a in attempts if a.state == LAUNCH_FAILED} - {None}
            t0 = time.monotonic()
            try:
                choice = plan(orch, js, job.checkpoint_epoch, avoid)
            except UsageError as e:
                return finish_job(orch, job, FAILED, f"cannot plan: {_why(e)}")
            except OrchError as e:  # no capacity, providers failing: the next look asks again
                job = record.job_phase(orch, job, "plan", time.monotonic() - t0)
                job = orch.ledger.update_job(job.id, reason=f"waiting for an offer: {_why(e)}")
                return record.note_once(orch, job, f"no offer to relaunch on now ({_why(e)}): the next look asks again",
                                        f"after attempt {len(attempts)}")  # said once, not at every look
            job = record.job_phase(orch, job, "plan", time.monotonic() - t0)
            try:
                check_plan(choice, job.max_cost, caps.cost(orch, job))
            except UsageError as e:
                return finish_job(orch, job, FAILED, _why(e))
            from orchestrator.jobs import budget

            over = budget.refusal(orch, choice, job)
            if over:  # nothing rented: the job ends stopped, its copy kept
                return finish_job(orch, job, STOPPED, f"budget: {over}" + _kept(orch, job, "; "))
        number = (attempts[-1].number if attempts else 0) + 1
        job = note(orch, job, f"attempt {number}: {choice.line}")
        try:
            return launch(orch, job, js, choice, number)
        except KeyboardInterrupt:
            note(orch, orch.ledger.get_job(job.id), f"attempt {number} interrupted while launching", say=False)
            raise
        except (UsageError, caps.CapReached) as e:
            return finish_job(orch, orch.ledger.get_job(job.id), FAILED, f"attempt {number}: {_why(e)}")
        except OrchError as e:
            job = orch.ledger.get_job(job.id)
            if job.state == PLANNED:
                job = orch.ledger.update_job(job.id, expect=PLANNED, state=RECOVERING)
            job = orch.ledger.update_job(job.id, reason=f"attempt {number} failed to launch: {_why(e)}")
            note(orch, job, f"attempt {number} failed to launch: {_why(e)}")
        choice = None  # a launch that failed: the next one is planned afresh, without that offer


def _end_given_up(orch, job) -> None:
    """Every attempt so far is given up once the job relaunches (the next one rents its own group):
    whatever of theirs still lives is destroyed. A replacement interrupted by Ctrl-C or a crash left
    the old group's survivors ready (the INTERRUPTED attempt K+1 names none; attempt K, lost, still
    points at its head), and the relaunch rented beside them: they billed on, and nothing looked."""
    for attempt in orch.ledger.attempts(job.id):
        inst = _attempt_live(orch, attempt)
        if inst is not None:  # (a group: every node of it)
            _destroy_attempt(orch, job, inst, f"job {job.name}: attempt {attempt.number} was given up "
                                              "(the job relaunches): destroyed")


def _attempt_live(orch, attempt):
    """A live machine of an attempt (of its head's group, or its instance, where it names one;
    else of what was made under its name since it began: a launch interrupted before it knew its
    head), or None."""
    from orchestrator.instances import groups
    from orchestrator.jobs import group

    inst = orch.ledger.get(attempt.instance_id) if attempt.instance_id else None
    if inst is None:
        since = record.utc(attempt.started_at) - timedelta(seconds=5)
        made = [orch.ledger.by_name(attempt.instance_name)] + groups.live(orch.ledger, attempt.instance_name)
        inst = next((i for i in made if i is not None and record.utc(i.created_at) >= since), None)
    if inst is None:
        return None
    return next((n for n in group.nodes_of(orch, inst) if n.state in states.LIVE), None)


def start(orch, job, choice=None):
    """Launch the first attempt of a planned job, on ``choice`` when the plan was just made."""
    with claims.hold(orch.ledger, claim(job.name)):
        return relaunch(orch, job, choice=choice)


# -- looking at a job --------------------------------------------------------------------------
def advance(orch, job):
    """One look at an active job, and the step it calls for. A job another orch process is
    advancing is returned as the ledger has it."""
    return _held(orch, job, lambda job: _advance(orch, job))


def _held(orch, job, step):
    """``step`` on the job as the ledger has it now, under its claim; the job as given where it
    has ended or another orch process holds it."""
    if job.state in ENDED:
        return job
    with claims.try_hold(orch.ledger, claim(job.name)) as mine:
        if not mine:
            return job
        job = orch.ledger.get_job(job.id)
        if job.state in ENDED:
            return job
        with record.hiding(orch, job):  # a schedule's run: its own schedule's values hidden, no other's
            return step(job)


def advance_all(orch) -> list[dict]:
    """Every active job, one look each (the reaper's ``after``, the watcher's look): one job's
    trouble never stops the others. A ``[budget]`` spent first stops them all (``jobs.budget``)."""
    from orchestrator.ledger import ledger_sql
    from orchestrator.jobs import budget

    out: list[dict] = []
    if not ledger_sql.jobs_in(ACTIVE, orch.ledger.url):  # plain SQL: no job, no ledger opened
        return out
    out.extend(budget.guard(orch, stop))
    for job in orch.ledger.jobs(ACTIVE):
        try:
            job = advance(orch, job)
            out.append({"name": job.name, "state": job.state, "reason": job.reason or ""})
        except Exception as e:  # noqa: BLE001 - reported, and the next job still gets its look
            out.append({"name": job.name, "state": job.state, "reason": f"error: {_why(e)}"})
    return out


def _advance(orch, job):
    try:
        js = JobSpec.of(job)  # a row is checked as strictly as a new job: a tampered one fails, never acts
    except UsageError as e:
        return finish_job(orch, job, FAILED, f"its ledger row is refused: {_why(e)}")
    attempt = _current(orch, job)
    if attempt is None or attempt.state in (LAUNCH_FAILED, INTERRUPTED, LOST):
        return relaunch(orch, job, js)
    if attempt.state == LAUNCHING:  # its process died mid-launch: we hold the job's claim now
        attempt = orch.ledger.update_attempt(attempt.id, state=INTERRUPTED, ended_at=record.now(),
                                             reason="the orch process launching it ended before it trained")
        inst = _attempt_live(orch, attempt)
        if inst is not None:
            _destroy_attempt(orch, job, inst, f"job {job.name}: attempt {attempt.number} was left half-launched")
        return relaunch(orch, job, js)
    inst = orch.ledger.get(attempt.instance_id) if attempt.instance_id else None
    if inst is None:
        return _lost(orch, job, js, attempt, None, None, "its instance is not in the ledger")
    run = orch.ledger.latest_run(inst.id)
    if attempt.state == ATTEMPT_DONE:  # completed and pulled; the process ending it stopped before the teardown
        return _complete(orch, job, js, attempt, inst, "its weights were pulled before")
    if attempt.state == STOPPED_BY_JOB:  # stopped by a cap or a cancel that did not get to its end
        _destroy_attempt(orch, job, inst, f"job {job.name}: {attempt.reason or 'stopped'}")
        by_budget = (attempt.reason or "").startswith("budget:")
        return finish_job(orch, job, STOPPED if by_budget else FAILED, attempt.reason or "stopped")
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
        return _finish_stopped(orch, job, js, attempt, inst, run)
    if run is not None and run.state == "completed" and _pulled_after_end(run):
        return _complete(orch, job, js, attempt, inst, "its weights were pulled before its instance ended")
    events = orch.ledger.events(inst.id)
    last = next((e for e in reversed(events) if e.from_state != e.to_state), None)
    # "recorded by": the actor that wrote the event, which the reason itself says did it or not
    why = f"instance {inst.state}" + (f" ({clean(last.reason, 200)}, recorded by {last.actor})" if last else "")
    if inst.state == states.PREEMPTED:  # its place is avoided for a while (``avoid``)
        from orchestrator.jobs import avoid

        avoid.record_loss(orch, attempt, inst, why)
    return _lost(orch, job, js, attempt, inst, run, why)


def _pulled_after_end(run) -> bool:
    from orchestrator.reaper import rules

    return run.ended_at is not None and rules.weights_safe(run, None, record.now())


def _look(orch, job, js: JobSpec, attempt, inst, run):
    from orchestrator.jobs import group

    kind = js.kind_of()
    try:
        view = kind.read(orch, inst, run)
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
    notice = view.get("notice")
    if notice:  # the provider will take the machine: the checkpoint copy now, not at checkpoint_minutes
        job = _on_notice(orch, job, js, attempt, inst, run, notice)
    state = view["state"]
    if state == "completed":
        return _finish(orch, job, js, attempt, inst, run, view)
    # Any node of a group lost ends the attempt (the head alone would wait for it for hours, or
    # crash for want of it: the lost node is the cause worth recording, before any exit code).
    gone = group.lost_node(orch, inst, float(_config("job_unreachable_minutes", UNREACHABLE_MINUTES)), kind)
    if gone:
        return _lost(orch, job, js, attempt, inst, run, gone[0], node=gone[1])
    own = kind.final(view)
    if notice and notice["kind"] == "instance-action" and (view.get("preempted") or (state in ("failed", "crashed")
                                                                                     and not own)):
        from orchestrator.jobs import avoid  # it ended on the notice's signal: a loss, relaunched

        why = f"{_noticed(notice)}; " + (f"the command ended ({own})" if own else f"the training {state}")
        avoid.record_loss(orch, attempt, inst, why)  # its place is avoided for a while
        return _lost(orch, job, js, attempt, inst, run, why)
    if own:  # the work's own failure: no relaunch repeats it
        return _failed(orch, job, js, attempt, inst, run, view, own)
    if state in ("failed", "crashed"):
        return _lost(orch, job, js, attempt, inst, run, f"training {state}" + (f": {view['error']}" if view.get("error")
                                                                               else ""))
    kind.watch(orch, job, inst, run, view)
    job = orch.ledger.get_job(job.id)
    over = caps.over_cap(orch, job, inst)
    if over:
        return _stop_over_cap(orch, job, js, attempt, inst, run, over)
    return orch.ledger.update_job(job.id, reason=None) if job.reason else job


def _noticed(notice: dict) -> str:
    if notice["kind"] == "rebalance":
        return f"a spot rebalance recommendation ({notice['time']})"
    return f"a spot interruption notice ({notice['action']} at {notice['time']})"


def _on_notice(orch, job, js: JobSpec, attempt, inst, run, notice: dict):
    """A spot notice seen (once per attempt and notice): the checkpoint copy taken at once."""
    key = f"{attempt.id}:{notice['kind']}:{notice['time']}"
    phases = row_json(job.phases, {})
    if phases.get("notice") == key:
        return job
    phases["notice"] = key
    job = note(orch, orch.ledger.update_job(job.id, phases=json.dumps(phases)),
               f"{_noticed(notice)} on {inst.name}: taking the checkpoint copy now")
    try:
        kept, problem = js.kind_of().take_checkpoint(orch, job, inst, run)
        if kept or problem:
            note(orch, job, kept or f"no checkpoint copy on the notice: {problem}")
    except OrchError as e:
        note(orch, job, f"no checkpoint copy on the notice: {_why(e)}")
    return orch.ledger.get_job(job.id)


# -- endings ---------------------------------------------------------------------------------
def _machines(inst) -> str:
    """What an attempt's teardown ended, as the job's reason names it: every node of a group (rank 0's
    name alone read as if the other nodes were left), or the one instance."""
    from orchestrator.instances import groups

    return f"the group {inst.group_name} ({inst.group_size} nodes)" if groups.is_group(inst) else f"instance {inst.name}"


def _destroy_attempt(orch, job, inst, reason: str) -> str | None:
    """Destroy an attempt's instance (every node of its group) if it still exists; why not, if it
    could not be."""
    from orchestrator.jobs import group

    inst = orch.ledger.get(inst.id)
    if inst is None:
        return None
    try:
        group.destroy(orch, inst, reason)  # every node, at once: none is left alone (nor billing)
        return None
    except OrchError as e:
        note(orch, job, f"could not destroy {_machines(inst)} ({_why(e)}): the reaper keeps at it, and its cost counts")
        return _why(e)


def _bring_home(orch, job, js: JobSpec, inst, run, what: str) -> None:
    """What can come home before the machine is given back, whatever stops it; a failure is noted."""
    try:
        js.kind_of().bring_home(orch, job, inst, run, weights_dir(orch.home, job.name), strict=False)
    except OrchError as e:
        note(orch, job, f"not everything was pulled {what} ({_why(e)})")


def _lost(orch, job, js: JobSpec, attempt, inst, run, why: str, node=None):
    """Record the loss, keep the newest intact checkpoint, give the instance back, relaunch. One
    node of a group lost (``node``, or the head itself) while the others answer: that node alone is
    replaced (``_replace``), the survivors kept with their setup, data and caches."""
    from orchestrator.instances import groups

    why = record.scrub(job, why)  # it may quote the instance: the job's secrets hidden
    attempt = _end_attempt(orch, attempt, LOST, why)
    job = orch.ledger.update_job(job.id, expect=(RUNNING, RECOVERING, PLANNED), state=RECOVERING,
                                 reason=f"attempt {attempt.number} lost: {why}")
    phases = row_json(job.phases, {})
    phases["lost_at"] = record.now().isoformat()
    job = orch.ledger.update_job(job.id, phases=json.dumps(phases))
    job = note(orch, job, f"attempt {attempt.number} lost: {why}")
    kept: list = []

    def keep() -> None:  # once: a replacement keeps it beside its rental
        if not kept:
            kept.append(True)
            _keep(orch, job, js, attempt, inst, run, why)

    if groups.is_group(inst):
        if node is None and orch.ledger.get(inst.id).state != states.READY:
            node = inst  # the head itself is the node lost
        replaced = _replace(orch, job, js, attempt, inst, node, keep)
        if replaced is not None:
            return replaced
    keep()
    if inst is not None:
        _destroy_attempt(orch, job, inst, f"job {job.name}: attempt {attempt.number} lost ({why[:200]}): destroyed, "
                                          "the job relaunches elsewhere")
    return relaunch(orch, orch.ledger.get_job(job.id), js)


def _keep(orch, job, js: JobSpec, attempt, inst, run, why: str) -> None:
    """What a lost attempt leaves: a group's work ended on every node that answers (the survivors
    would wait on their lost peer for hours), the old instance's own newest intact checkpoint where
    it still answers, and a copy the attempt crashed on as it resumed forgotten."""
    from orchestrator.instances import groups
    from orchestrator.jobs import group, resume_copy

    if groups.is_group(inst):
        problems = group.end_runs(orch, inst)
        note(orch, orch.ledger.get_job(job.id), "ended the training on every node that answers"
             + (f" (not: {'; '.join(problems)})" if problems else ""), say=False)
    if inst is not None and run is not None and run.run_dir and orch.ledger.get(inst.id).state == states.READY:
        try:  # the old instance still answers: its own newest checkpoint, when it is intact
            kept, problem = js.kind_of().take_checkpoint(orch, orch.ledger.get_job(job.id), inst, run)
            if kept:
                note(orch, orch.ledger.get_job(job.id), kept)
            elif problem:
                copy = orch.ledger.get_job(job.id).checkpoint_epoch
                note(orch, orch.ledger.get_job(job.id), f"{problem}; resuming from the job's copy"
                     + (f" (epoch {copy})" if copy else " (none: starting over)"))
        except OrchError as e:
            note(orch, orch.ledger.get_job(job.id), f"could not read {inst.name} any more ({_why(e)}): resuming from "
                                                    "the job's copy")
    resume_copy.crashed_on(orch, job, attempt, why)  # a copy the attempt crashed on as it resumed is not tried again


def _replace(orch, job, js: JobSpec, attempt, head, node, keep):
    """Attempt K+1 on attempt K's group with ``node`` replaced alone: one node rented in its place
    (same offer, rank and name) while ``keep`` ends the survivors' work and pulls the checkpoint
    (``group.replace``), the checkpoint copy restored on every node, the work started again on the
    whole group with the same ranks. None (and the job says why, after ``keep``) where the
    survivors cannot be reused: the caller relaunches the whole group."""
    from orchestrator.jobs import group

    def whole(why: str):
        keep()
        note(orch, orch.ledger.get_job(job.id), f"the whole group is relaunched: {why}")
        return None

    if node is None:
        return whole("no single node was lost (the run itself ended)")
    if not _config("replace_lost_node", True):
        return whole("replace_lost_node = false in config.toml")
    cannot = getattr(orch.provider(attempt.provider), "no_lone_replacement", None)
    if cannot:  # the provider makes a group whole or not at all (RunPod's Instant Clusters)
        return whole(cannot)
    attempts = orch.ledger.attempts(job.id)
    if _relaunches(attempts) >= job.retries or caps.over_cap(orch, job):
        return None  # relaunch says why it stops
    nodes = group.nodes_of(orch, head)
    survivors = [n for n in nodes if n.id != node.id]
    problem = group.unusable(orch, survivors)  # before anything is rented
    if problem:
        return whole(problem)
    key = row_json(attempt.offer, {}).get("key")
    request = js.request
    if key and not (request.cpu or request.offer):  # the same offer: the same region (and placement group)
        request = replace(request, offer=key.split("/", 1)[1])
    from orchestrator.jobs.plan import Choice

    choice = Choice(attempt.provider, request, f"{attempt.provider}: node {node.node_rank} of {head.group_name} "
                                                f"replaced alone", key, attempt.price_hr)
    saved_s = row_json(attempt.phases, {}).get("provision")
    per_node = (attempt.price_hr or 0.0) / max(len(nodes), 1)
    saved = (f"; the {len(survivors)} survivor(s) kept their setup, data and caches (saved ~{saved_s:.0f} s of "
             f"bring-up each, ~${per_node * len(survivors) * saved_s / 3600:.4f})") if saved_s else ""
    number = attempts[-1].number + 1
    policy = caps.attempt_policy(orch, job, js, attempt.price_hr)

    def beside() -> None:  # the job's history as before: what was kept, then the replacement
        keep()
        note(orch, orch.ledger.get_job(job.id), f"attempt {number}: node {node.node_rank} ({node.name}) replaced "
                                                f"alone{saved}")

    def rent(start):
        fresh = group.replace(orch, orch.ledger.get(node.id), request, beside, policy=policy,
                              ssh_timeout=js.ssh_timeout, prepare=js.kind_of().provisioning())
        ready = group.nodes_of(orch, fresh)
        start(ready[0])
        return ready[0]

    try:
        return launch(orch, job, js, choice, number, rent=rent, name=attempt.instance_name,
                      kept=frozenset(n.id for n in survivors))
    except KeyboardInterrupt:  # the next look relaunches the whole group: the survivors would bill till then
        from orchestrator import parallel as par

        with par.ctrl_c_held():  # a second Ctrl-C does not leave them half destroyed
            live = _attempt_live(orch, attempt)
            if live is not None:
                _destroy_attempt(orch, job, live, f"job {job.name}: the replacement of node {node.node_rank} was "
                                                  "interrupted (Ctrl-C): the whole group relaunches")
            note(orch, orch.ledger.get_job(job.id), f"attempt {number} interrupted while node {node.node_rank} was "
                                                    "replaced: the group destroyed, the next look relaunches it whole",
                 say=False)
        raise
    except OrchError as e:
        job = orch.ledger.get_job(job.id)
        if job.state == PLANNED:
            job = orch.ledger.update_job(job.id, expect=PLANNED, state=RECOVERING)
        whole(f"the replacement of node {node.node_rank} failed ({_why(e)})")
        live = _attempt_live(orch, attempt)
        if live is not None:
            _destroy_attempt(orch, job, live, f"job {job.name}: node {node.node_rank} could not be replaced: "
                                              "the whole group relaunches")
        return relaunch(orch, orch.ledger.get_job(job.id), js)


def _finish(orch, job, js: JobSpec, attempt, inst, run, view: dict):
    """The work completed: everything home, verified, then the instance given back."""
    t0 = time.monotonic()
    try:
        got = js.kind_of().bring_home(orch, job, inst, run, weights_dir(orch.home, job.name), view=view)
    except OrchError as e:
        job = orch.ledger.update_job(job.id, reason=f"completed, but the final pull failed ({_why(e)}): the next "
                                                   "look tries again; nothing is destroyed before")
        return note(orch, job, job.reason)
    job = record.job_phase(orch, job, "pull", time.monotonic() - t0)
    return _complete(orch, job, js, attempt, inst, f"pulled {len(got)} new file(s), verified")


def _complete(orch, job, js: JobSpec, attempt, inst, how: str):
    from orchestrator.instances import groups

    t0 = time.monotonic()
    kind = js.kind_of()
    attempt = _end_attempt(orch, attempt, ATTEMPT_DONE, f"{kind.noun} completed; {how}")
    dest = weights_dir(orch.home, job.name)
    inst = orch.ledger.get(inst.id)
    ended = "destroyed"
    if inst.state in states.LIVE:
        if job.keep and groups.is_group(inst):
            note(orch, job, "--keep: a group is not kept stopped node by node; destroying it")
        elif job.keep and can_stop(orch.provider(inst.provider), inst.spot) and inst.state == states.READY:
            try:
                orch.stop(inst, f"job {job.name} completed: kept stopped (--keep)")
                ended = "stopped (--keep)"
            except UsageError as e:  # a provider that cannot stop this one (no disk to keep)
                note(orch, job, f"--keep: {_why(e)}; destroying it instead")
        if ended == "destroyed":
            problem = _destroy_attempt(orch, job, inst, f"job {job.name} completed: weights home in {dest}")
            if problem:
                ended = f"NOT destroyed ({problem})"
    job = record.job_phase(orch, job, "teardown", time.monotonic() - t0)
    reason, fields = kind.completed(job, how, dest, f"{_machines(inst)} {ended}")
    return finish_job(orch, job, COMPLETED, reason + _keep_copies(orch, job, js), **fields)


def _keep_copies(orch, job, js: JobSpec) -> str:
    """The verified results are in runs/NAME: the job's checkpoint copies go, but the newest its
    kind keeps (``JobKind.copies_kept``: a task's ``keep_checkpoints``, default 1) stay in
    jobs/NAME, for a run that continues from them; what the completed job's reason adds (where)."""
    folder = job_dir(orch.home, job.name)
    keep = js.kind_of().copies_kept()
    kept = record.copies(orch.home, job.name)[-keep:] if keep else []
    if not kept:
        shutil.rmtree(folder, ignore_errors=True)
        return ""
    for entry in folder.iterdir():
        if entry.name in {f"ckpt-{k}" for k in kept}:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    where = checkpoint_dir(orch.home, job.name, kept[-1])
    return (f"; the newest checkpoint copy kept in {where}" if len(kept) == 1 else
            f"; the newest {len(kept)} checkpoint copies kept in {folder} (newest: {where.name})")


def _finish_stopped(orch, job, js: JobSpec, attempt, inst, run):
    """Completed, then stopped before its results came home (its watchdog, or someone): start it,
    pull, give it back."""
    try:
        inst = orch.start(inst, f"job {job.name}: started again to pull the finished run")
        view = js.kind_of().read(orch, inst, run)
    except OrchError as e:
        return orch.ledger.update_job(job.id, reason=f"completed on a stopped instance that did not start "
                                                     f"({_why(e)}): the next look tries again")
    return _finish(orch, job, js, attempt, inst, run, view)


def _failed(orch, job, js: JobSpec, attempt, inst, run, view: dict, why: str):
    """The work failed on its own (a command's non-zero exit): what it left comes home, the
    instance is given back, the job failed with why and what came home says (the log's last lines)."""
    from orchestrator.instances import groups
    from orchestrator.jobs import group

    why = record.scrub(job, why)  # it may quote a node's log: the job's secrets hidden
    dest = weights_dir(orch.home, job.name)
    if groups.is_group(inst):  # one node failed: the others' commands end now (they would wait on it)
        group.end_runs(orch, inst)
    try:
        js.kind_of().bring_home(orch, job, inst, run, dest, view=view, strict=False)
    except OrchError as e:
        note(orch, job, f"not everything was pulled ({_why(e)})")
    _end_attempt(orch, attempt, "failed", why)
    problem = _destroy_attempt(orch, job, inst, f"job {job.name}: {why}")
    detail = js.kind_of().failure_detail(dest)
    return finish_job(orch, orch.ledger.get_job(job.id), FAILED,
                      f"{why}; {_machines(inst)} " + (f"NOT destroyed ({problem})" if problem else "destroyed")
                      + (f"; {detail}" if detail else ""))


def _stop_over_cap(orch, job, js: JobSpec, attempt, inst, run, why: str):
    """A cap says stop: what can be pulled comes home, then the instance is destroyed all the same."""
    _bring_home(orch, job, js, inst, run, "before stopping")
    attempt = _end_attempt(orch, attempt, STOPPED_BY_JOB, why)
    _destroy_attempt(orch, job, inst, f"job {job.name}: {why}")
    return finish_job(orch, orch.ledger.get_job(job.id), FAILED,
                      f"{why}: {js.kind_of().stopped_at(job)}; what was pulled is in "
                      f"{weights_dir(orch.home, job.name)}" + _kept(orch, job, ", "))


def cancel(orch, job, wait: float = 120.0):
    """Stop the job: what can be pulled comes home, its instance is destroyed, it is cancelled."""
    with claims.hold(orch.ledger, claim(job.name), wait=wait):
        job = orch.ledger.get_job(job.id)
        if job.state in ENDED:
            raise UsageError(f"job {job.name} is already {job.state}")
        return _end_now(orch, job, CANCELLED, "cancelled by the user", "cancelled",
                        f"`orch jobs cancel {job.name}` again")


def stop(orch, job, why: str):
    """The job ended ``stopped`` now (the budget is spent: ``jobs.budget``), as a cancel ends it;
    a job another process is advancing is left to the next look."""
    return _held(orch, job, lambda job: _end_now(orch, job, STOPPED, why, "stopped", "the next look tries again"))


def _end_now(orch, job, state: str, why: str, done: str, again: str):
    """What can be pulled comes home, the attempt's instance is destroyed, the job ends ``state``."""
    attempt = _current(orch, job)
    inst = orch.ledger.get(attempt.instance_id) if attempt and attempt.instance_id else None
    if inst is not None and inst.state in states.LIVE:
        run = orch.ledger.latest_run(inst.id)
        if inst.state == states.READY and run is not None and run.run_dir:
            _bring_home(orch, job, JobSpec.of(job), inst, run, f"before it was {done}")
        if attempt.state in (LAUNCHING, ATTEMPT_RUNNING):
            _end_attempt(orch, attempt, STOPPED_BY_JOB, why)
        problem = _destroy_attempt(orch, job, inst, f"job {job.name} {done}: {why[:200]}")
        if problem:
            raise OrchError(f"job {job.name}: could not destroy {inst.name} ({problem}); the job stays "
                            f"{job.state}: {again}")
    elif attempt is not None and attempt.state in (LAUNCHING, ATTEMPT_RUNNING):
        _end_attempt(orch, attempt, STOPPED_BY_JOB, why)
    if state == STOPPED:
        why += f"; what came home is in {weights_dir(orch.home, job.name)}" + _kept(orch, job, ", ")
    return finish_job(orch, orch.ledger.get_job(job.id), state, why)
