"""A run from the controller's side, whatever its kind: read, checked, pulled home, followed, ended.

Every job kind's run (a LibreYOLO training, a user's command) writes the same ``status.json`` and
files under its run folder (``playbooks/on_instance/run_status.py`` reads them there); this module
turns that answer (untrusted: the instance wrote it) into what a user wants to see, keeps the
ledger's ``runs`` row in step, brings the files home under the instance's claim, and ends a run on
every node of a group. What is LibreYOLO's own (its data staged, its launch) is in ``training``.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.ledger import claims
from orchestrator import parallel as par
from orchestrator.errors import OrchError, UsageError
from orchestrator.text import clean, row_json
from orchestrator.text import why as _why

# status.json is rewritten every epoch; a live process whose file has not moved for this long is
# shown as stalled (an epoch can be long, so this only informs, it never kills).
STALL_SECONDS = 30 * 60
ENDED = ("completed", "failed", "crashed")


# -- read ---------------------------------------------------------------------------------------
def pulled_dir(orch, name: str, dest: Path | None = None) -> Path:
    return Path(dest) if dest else orch.home / "runs" / name


def read(orch, inst, run) -> dict:
    """The run as the user wants to see it, from status.json and the process; updates the ledger."""
    from playbooks import runs as run_tasks

    with orch.connect(inst) as c:
        raw = run_tasks.status(c, run.run_dir, run.pid)
    return digest(orch, run, raw)


def _num(v, kind=(int, float)):
    return v if isinstance(v, kind) and not isinstance(v, bool) else None


def digest(orch, run, raw: dict) -> dict:
    """What run_status.py answered, checked field by field: a field of the wrong type is dropped
    and reported in ``problems``, never a crash (which would then block ``orch down``)."""
    problems = []
    st = raw.get("status") if isinstance(raw, dict) else None
    if st is not None and not isinstance(st, dict):
        problems.append("status.json is not an object")
        st = None
    st = st or {}

    def field_(key, kind):
        v = st.get(key)
        if v is None:
            return None
        ok = _num(v, kind) if kind in ((int, float), int) else (v if isinstance(v, kind) else None)
        if ok is None:
            problems.append(f"status.json {key} has the wrong type")
        return ok

    state = field_("state", str)
    if state not in (None, "running", "completed", "failed"):
        problems.append(f"status.json state {clean(state, 20)!r} is not one LibreYOLO writes")
        state = None
    alive = bool(raw.get("alive")) if isinstance(raw, dict) else False
    moved = _num(raw.get("moved_s")) if isinstance(raw, dict) else None
    if state == "running" or state is None:
        if not alive:
            state = "crashed"  # killed: status.json still says "running" forever
        elif state is None:
            state = "starting"
        elif moved and moved > STALL_SECONDS:
            state = "stalled"
    current, completed, start = field_("current_epoch", int), field_("completed_epochs", int), field_("start_epoch", int)
    error = st.get("error")
    if isinstance(error, dict):
        error = ": ".join(clean(error.get(k), 300) for k in ("type", "message") if error.get(k))
    elif error is not None:
        error = clean(error, 300)
    from playbooks.pull import run_files

    files, refused = run_files(raw.get("files") if isinstance(raw, dict) else None)
    view = {
        # A finished (possibly resumed) run reports epochs done in its last session, from start_epoch.
        "state": state, "epoch": current or ((start or 1) - 1 + completed if completed else None),
        "epochs": field_("total_epochs", int) or run.epochs, "completed_epochs": completed,
        "eta_seconds": field_("eta_seconds", (int, float)), "loss": field_("train_loss", (int, float)),
        "best_metric": field_("best_metric", (int, float)), "best_metric_name": clean(st.get("best_metric_name"), 40),
        "mean_epoch_seconds": field_("mean_epoch_seconds", (int, float)),
        "pid": field_("pid", int) or run.pid, "run_dir": run.run_dir,
        "updated_at": clean(st.get("updated_at"), 40), "error": error or None,
        "files": files, "problems": problems + refused, "notice": notice_of(raw),
        "preempted": st.get("preempted") is True,
    }
    total = field_("total_seconds", (int, float))
    if state == "completed" and total and completed:
        view["mean_epoch_seconds"] = view["mean_epoch_seconds"] or total / completed
    fields = {"state": state, "completed_epochs": completed, "best_metric": view["best_metric"],
              "mean_epoch_seconds": view["mean_epoch_seconds"]}
    if run.args and "orch_trial" in run.args:
        fields.pop("mean_epoch_seconds")  # a trial keeps its warm epoch time, not the mean with warm-up
    if state in ENDED and run.ended_at is None:
        # The run's own last word on when it ended, so idle waste is counted from then, not from
        # whenever orch first looked (and never from a time in the future).
        ended = parse_time(view["updated_at"]) if state != "crashed" else None
        now = datetime.now(timezone.utc)
        fields["ended_at"] = min(ended, now) if ended else now
    orch.ledger.update_run(run.id, **{k: v for k, v in fields.items() if v is not None})
    return view


def notice_of(raw) -> dict | None:
    """The spot notice the instance's watchdog wrote (``preempt.json``), its fields checked and made
    printable (the instance is untrusted); None without one."""
    got = raw.get("notice") if isinstance(raw, dict) else None
    if not isinstance(got, dict) or got.get("kind") not in ("instance-action", "rebalance"):
        return None
    return {"kind": got["kind"], "action": clean(got.get("action"), 20), "time": clean(got.get("time"), 40)}


def parse_time(value) -> datetime | None:
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


PULL_WAIT_S = 120.0  # how long a full pull waits for another process's (a milestone pull's) claim


def pull(orch, inst, run, dest: Path | None = None, view: dict | None = None, only_milestones: bool = False):
    """Bring the run home under the instance's claim (one writer per file); returns (files pulled
    now, where). A milestone pull that finds another orch process working on the instance skips it;
    a full pull waits for it a while."""
    # A group's run is its head's (rank 0 alone writes it): home under the group's name.
    target = pulled_dir(orch, inst.group_name if (inst.group_size or 1) > 1 else inst.name, dest)
    if only_milestones:
        with claims.try_hold(orch.ledger, inst.name) as mine:
            if not mine:
                return [], target
            return _pull(orch, inst, run, target, view, True)
    with claims.hold(orch.ledger, inst.name, wait=PULL_WAIT_S):
        return _pull(orch, inst, run, target, view, False)


def run_secrets(run) -> list[str]:
    """The names of the secrets the run's command got (its args say, from its launch); a training none."""
    args = row_json(run.args, {}) if run is not None else {}
    names = args.get("secrets")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _pull(orch, inst, run, target: Path, view: dict | None, only_milestones: bool):
    from orchestrator.tasks.task import held_secrets
    from playbooks import pull as pulling
    from playbooks import runs as run_tasks

    # What the run printed may show a secret its command got: hidden in every text file that comes
    # home, and where this process does not hold one (a scheduled reaper), no text file comes.
    hide, missing = held_secrets(run_secrets(run))
    stored = _schedule_secrets(orch, inst)
    if stored:  # a schedule's run got the schedule's values, stored at home: hidden even where this
        # process (a watcher) holds a variable of that name with another value, as a shell's export
        values, missing = held_secrets(run_secrets(run), {**os.environ, **stored})
        hide += [v for v in values if v not in hide]
    with orch.connect(inst) as c:
        if view is None:
            view = digest(orch, run, run_tasks.status(c, run.run_dir, run.pid))
        files = [f for f in view["files"] if not only_milestones or pulling.MILESTONE.fullmatch(f.rel)]
        left = []
        if missing and any(not f.rel.endswith(".pt") for f in files):
            left.append(f"left on the instance: {', '.join(f.rel for f in files if not f.rel.endswith('.pt'))} "
                        f"(this orch process does not hold {', '.join(missing)} to hide it)")
            files = [f for f in files if f.rel.endswith(".pt")]
        got = pulling.pull(c, run.run_dir, files, target, strict=not only_milestones, bounds=run_bounds(run),
                           log=lambda m: left.append(m) if m.startswith("left on the instance") else None, hide=hide)
    for line in left if not only_milestones else []:  # what the bounds left: said, and on the instance's record
        orch.say(f"      {line}")
        orch.ledger.note(inst.id, line[:500], orch.actor)
    if got or not only_milestones:
        orch.ledger.update_run(run.id, pulled_at=datetime.now(timezone.utc))
    return got, target


def _schedule_secrets(orch, inst) -> dict[str, str]:
    """The secrets stored for the schedule whose run ``inst`` serves (none: {}): that schedule's
    alone, so another schedule's short value ("1") does not mask every digit of this run's text."""
    from sqlmodel import select

    from orchestrator.schedules import schedule_secrets
    from orchestrator.ledger.ledger import Attempt

    with orch.ledger.session(write=False) as s:
        ids = list(s.exec(select(Attempt.job_id).where(Attempt.instance_id == inst.id)))
    return (schedule_secrets.of_jobs(orch.ledger, orch.home, ids) or {}) if ids else {}


def run_bounds(run):
    """What ``run`` could have written (its epochs, its save period) and the pull caps."""
    from playbooks import pull as pulling

    return pulling.Bounds.of_run(run.epochs, row_json(run.args, {}).get("save_period"))


def progress_line(view: dict) -> str:
    parts = [view["state"]]
    if view.get("epoch"):
        parts.append(f"epoch {view['epoch']}/{view['epochs']}")
    if view.get("loss") is not None:
        parts.append(f"loss {view['loss']:.4f}")
    if view.get("best_metric") is not None:
        parts.append(f"best {view.get('best_metric_name') or 'metric'} {view['best_metric']:.4f}")
    if view.get("eta_seconds") and view["state"] == "running":
        parts.append(f"ETA {_duration(view['eta_seconds'])}")
    return "  ".join(parts)


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


FIRST_LOOK_S = 0.5  # --wait looks again this soon at first: a job or run of seconds returns in seconds


def pause(looks: int, interval: float) -> float:
    """--wait's pause after its ``looks``-th look at a run or job still going: doubling from
    ``FIRST_LOOK_S`` up to ``interval`` (a short one is seen ending soon; a long wait still costs
    the ledger and the instance one look per ``interval``), on the project's one backoff schedule."""
    from orchestrator.provider import http

    return http.backoff(looks, min(FIRST_LOOK_S, interval), interval)


def follow(orch, inst, run, interval: float = 3.0, out=None) -> dict:
    """--wait: a live progress line until the run ends, pulling milestones as they appear; looked at
    often at first, then up to every ``interval`` seconds (``pause``)."""
    import sys

    out = out or sys.stderr
    last = ""
    looks = 0
    while True:
        view = read(orch, inst, run)
        pull(orch, inst, run, view=view, only_milestones=True)
        line = progress_line(view)
        if line != last:
            print(f"      {line}", file=out, flush=True)
            last = line
        if view["state"] in ENDED:
            return view
        looks += 1
        par.nap(pause(looks, interval))


# -- end ------------------------------------------------------------------------------------------
def stop(orch, nodes: list) -> list[str]:
    """End the training on every node that still answers (a lost node leaves the others waiting on
    the process group for hours: nobody but orch ends them); returns why for those it could not."""
    from orchestrator import states
    from playbooks import runs as run_tasks

    def end(node) -> None:
        node = orch.ledger.get(node.id)
        run = orch.ledger.latest_run(node.id)
        if node.state != states.READY or run is None or not run.pid:
            return
        with orch.connect(node) as c:
            run_tasks.stop(c, run.pid)

    return [f"{node.name}: {_why(e)}" for node, (_, e) in zip(nodes, par.each(end, nodes, len(nodes)))
            if e is not None]


def raise_first(nodes: list, outcomes: list, what: str) -> None:
    """The lowest rank's failure among ``parallel.each``'s outcomes, raised as the group's."""
    errors = [(rank, e) for rank, (_, e) in enumerate(outcomes) if e is not None]
    if not errors:
        return
    rank, error = min(errors, key=lambda x: x[0])
    if isinstance(error, KeyboardInterrupt):
        raise error
    raise (UsageError if isinstance(error, UsageError) else OrchError)(f"{what} on node {rank} ({nodes[rank].name}) failed: {_why(error)}") from error
