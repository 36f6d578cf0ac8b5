"""A job's resume copy: ``last.pt`` and ``metrics.jsonl`` taken from a training instance whole and
checked (``take``), kept at home in ``jobs/NAME/ckpt-E``, and put into the next attempt's run
folder on every node (``stage``), checked again there; and what a pulled run folder says was
trained (``pulled_epoch``), read without torch.

LibreYOLO rewrites ``last.pt`` in place every epoch: a file caught mid-write is torn. So ``take``
copies it aside on the instance first, asks ``checkpoint.py`` there, pulls the copy verified, and
keeps it only if the same check says so here (``checkpoint_vet.vet``: a rented machine's answer is
its own). A copy whose metrics lag its epoch is not kept. A copy that fails the check later (at
home, before it is uploaded) is forgotten and the attempt starts over at epoch 1, saying why; so
is a copy an attempt crashed on as it resumed (``crashed_on``), which the next attempt would only
crash on again until the retries ran out.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from orchestrator.runs import checkpoint_vet
from orchestrator.ledger import claims
from orchestrator.errors import UsageError
from orchestrator.jobs.record import checkpoint_dir, note
from orchestrator.text import clean


def metrics_epochs(path: Path, limit: int = 64 << 20) -> list[int]:
    """The epochs a pulled metrics.jsonl has rows for (it came from an instance: bad lines are skipped)."""
    found = []
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        epoch = row.get("epoch") if isinstance(row, dict) else None
        if isinstance(epoch, int) and not isinstance(epoch, bool) and 0 < epoch <= 100_000:
            found.append(epoch)
    return found


def pulled_epoch(folder: Path) -> int | None:
    """The last epoch a pulled run folder says was trained, from its metrics.jsonl and status.json
    (no torch needed). ``orch up --resume`` and ``orch run --resume`` refuse up front to resume a run
    already at --epochs; the checkpoint itself is checked again on the instance."""
    folder = Path(folder)
    found = metrics_epochs(folder / "metrics.jsonl")
    try:
        st = json.loads((folder / "status.json").read_text()[:1 << 20])
    except (OSError, ValueError, RecursionError):
        st = None
    if isinstance(st, dict):
        def num(key):
            v = st.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 100_000 else None

        current, completed, start = num("current_epoch"), num("completed_epochs"), num("start_epoch")
        if current:
            found.append(current)
        elif completed:  # a finished (maybe resumed) run counts its last session from start_epoch
            found.append((start or 1) - 1 + completed if st.get("state") == "completed" else completed)
    return max(found) if found else None


def trimmed_metrics(path: Path, epoch: int) -> str:
    """metrics.jsonl rows up to ``epoch``: the resumed run appends from ``epoch + 1``."""
    try:
        lines = path.read_bytes().decode(errors="replace").splitlines()
    except OSError:
        return ""
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        e = row.get("epoch") if isinstance(row, dict) else None
        if isinstance(e, int) and not isinstance(e, bool) and 0 < e <= epoch:
            kept.append(json.dumps(row))
    return "".join(k + "\n" for k in kept)


def stage(orch, job, nodes: list, spec, ckpt_epoch: int) -> int | None:
    """Put the job's resume copy into the next run folder of every node (a group resumes from
    last.pt on EVERY node); returns the epoch it holds, or None when it does not load there (the
    attempt then starts over: a torn checkpoint is never resumed from). Refuses (UsageError) a copy
    that already reached --epochs."""
    src = checkpoint_dir(orch.home, job.name, ckpt_epoch)

    def drop(why: str) -> None:
        """A copy that cannot be resumed from is no copy: forgotten, so the next milestone
        (from epoch 1 again) makes a new one and a later loss does not try it again."""
        shutil.rmtree(src, ignore_errors=True)
        note(orch, orch.ledger.update_job(job.id, checkpoint_epoch=None), why)

    if not (src / "weights" / "last.pt").is_file():
        drop(f"the resume copy {src} is missing: attempt starts over at epoch 1")
        return None
    _, unsafe = checkpoint_vet.vet(src / "weights" / "last.pt")  # checked here again before it goes anywhere
    if unsafe:
        drop(f"the resume copy (epoch {ckpt_epoch}) is not uploaded: {unsafe}; attempt starts over at epoch 1")
        return None
    staged = None
    for node in nodes:
        staged = _stage_on(orch, node, spec, src, ckpt_epoch, drop)
        if staged is None:
            return None
    return staged


def _stage_on(orch, inst, spec, src: Path, ckpt_epoch: int, drop) -> int | None:
    from orchestrator.ssh import remote
    from playbooks import host

    q = shlex.quote
    with orch.connect(inst) as c:
        work = host.workdir(c)
        inbox = f"{work}/job-resume-in"
        remote.run(c, f"rm -rf {q(inbox)} && mkdir -p {q(inbox + '/weights')}")
        c.sftp().put(str(src / "weights" / "last.pt"), f"{inbox}/weights/last.pt")
        info = host.script(c, "checkpoint.py", f"{inbox}/weights/last.pt")
        if not info.get("loads"):
            drop(f"the resume copy (epoch {ckpt_epoch}) does not load on {inst.name} "
                 f"({clean(info.get('error'), 200)}): not resumed from; attempt starts over at epoch 1")
            return None
        epoch = info.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            epoch = ckpt_epoch
        if epoch >= spec.epochs:
            raise UsageError(f"the resume copy already reached epoch {epoch} of {spec.epochs}")
        run = orch.ledger.add_run(instance_id=inst.id, model=spec.model, data=spec.data, data_bytes=spec.data_bytes,
                                  epochs=spec.epochs, gpu_name=inst.gpu_name, state="starting")
        run_dir = f"{work}/runs/r{run.id}"
        remote.put_text(c, trimmed_metrics(src / "metrics.jsonl", epoch), f"{inbox}/metrics.jsonl", 0o644)
        remote.run(c, f"mkdir -p {q(run_dir)} && mv {q(inbox + '/weights')} {q(run_dir + '/weights')} && "
                      f"mv {q(inbox + '/metrics.jsonl')} {q(run_dir + '/metrics.jsonl')}")
    return epoch


def take(orch, job, inst, run) -> tuple[int | None, str | None]:
    """Copy last.pt and metrics.jsonl aside on the instance, load the copy there and pull it home
    verified, as the job's resume copy; (its epoch, None), or (None, why not). Not newer than the
    copy the job has: (None, None)."""
    from orchestrator.ssh import remote
    from playbooks import host
    from playbooks import pull as pulling

    q = shlex.quote
    with claims.try_hold(orch.ledger, inst.name) as mine:
        if not mine:
            return None, None  # another orch process works on the instance: the next look
        with orch.connect(inst) as c:
            snap = f"{host.workdir(c)}/job-resume"
            last, metrics = f"{run.run_dir}/weights/last.pt", f"{run.run_dir}/metrics.jsonl"
            # last.pt first, metrics.jsonl after: LibreYOLO writes the checkpoint before the epoch's row.
            # A copy during which last.pt changed (torch rewriting it) is taken again, up to three times a
            # second apart: a look that lands mid-write would otherwise wait a whole reaper interval.
            when = f"{{ stat -c '%.9Y %s' {q(last)} 2>/dev/null || stat -c '%Y %s' {q(last)}; }}"
            out = remote.run(c, f"test -f {q(last)} || {{ echo missing; exit 0; }}; mkdir -p {q(snap + '/weights')} && "
                                f"for i in 1 2 3; do a=$({when}); cp {q(last)} {q(snap + '/weights/.last.pt')} || "
                                f"exit 1; b=$({when}); [ \"$a\" = \"$b\" ] && break; sleep 1; done && "
                                f"mv -f {q(snap + '/weights/.last.pt')} {q(snap + '/weights/last.pt')} && "
                                f"{{ cp {q(metrics)} {q(snap + '/.metrics')} 2>/dev/null || : > {q(snap + '/.metrics')}; }} && "
                                f"mv -f {q(snap + '/.metrics')} {q(snap + '/metrics.jsonl')}")
            if out.strip() == "missing":
                return None, f"no last.pt on {inst.name} yet"
            info = host.script(c, "checkpoint.py", f"{snap}/weights/last.pt")
            if not info.get("loads"):
                return None, f"last.pt on {inst.name} does not load ({clean(info.get('error'), 200)}): not kept"
            epoch = info.get("epoch")
            if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 < epoch <= 100_000:
                return None, f"last.pt on {inst.name} holds no epoch"
            if epoch <= (orch.ledger.get_job(job.id).checkpoint_epoch or 0):
                return None, None
            sums = host.script(c, "checksum.py", snap, "weights/last.pt", "metrics.jsonl")
            files = []
            for rel in ("weights/last.pt", "metrics.jsonl"):
                entry = sums.get(rel)
                listed, _ = pulling.run_files([[rel, entry[0], entry[1]]] if isinstance(entry, list) and len(entry) >= 3
                                              else [])
                files += listed
            if len(files) != 2:
                return None, "the copy on the instance could not be listed"
            dest = checkpoint_dir(orch.home, job.name, epoch)
            shutil.rmtree(dest, ignore_errors=True)  # what an interrupted pull of this epoch left
            pulling.pull(c, snap, files, dest, log=lambda m: None, strict=True)
    # The instance's answer is its own: the copy is kept only if the same check says so here.
    held, why = checkpoint_vet.vet(dest / "weights" / "last.pt")
    if why is not None or held != epoch:
        shutil.rmtree(dest, ignore_errors=True)
        return None, f"the copy of last.pt from {inst.name} is not kept: " + (why or f"it holds epoch {held} here, "
                                                                                      f"not the {epoch} it claimed")
    rows = metrics_epochs(dest / "metrics.jsonl")
    if (max(rows) if rows else 0) < epoch:
        shutil.rmtree(dest, ignore_errors=True)
        return None, f"the copy's metrics stop before its epoch {epoch}: not kept, the next look copies again"
    job = orch.ledger.get_job(job.id)
    old = job.checkpoint_epoch
    # The copy may be newer than the status.json read before it: the job has trained that far at least.
    orch.ledger.update_job(job.id, checkpoint_epoch=epoch, epoch=max(job.epoch or 0, epoch))
    if old is not None and old != epoch:
        shutil.rmtree(checkpoint_dir(orch.home, job.name, old), ignore_errors=True)
    return epoch, None


def crashed_on(orch, job, attempt, why: str):
    """The job after attempt ``attempt`` was lost for ``why``. An attempt that resumed from the
    job's copy and whose run crashed before it trained a single epoch from it (LibreYOLO loads the
    checkpoint before its first status.json) may have crashed on the copy itself: a checkpoint
    LibreYOLO's own inspection refuses at its resume. The copy is forgotten, so the next attempt
    starts over at epoch 1 rather than crash on it again until the retries run out. A lost machine
    (preempted, gone, unreachable) says nothing against the copy, nor a run that trained from it."""
    job = orch.ledger.get_job(job.id)
    copy = job.checkpoint_epoch
    if not copy or attempt.start_epoch != copy + 1 or not why.startswith(("training crashed", "training failed")):
        return job
    run = orch.ledger.get_run(attempt.run_id) if attempt.run_id is not None else None
    if run is not None and run.completed_epochs:
        return job
    shutil.rmtree(checkpoint_dir(orch.home, job.name, copy), ignore_errors=True)
    job = orch.ledger.update_job(job.id, checkpoint_epoch=None)
    return note(orch, job, f"attempt {attempt.number} crashed as it resumed from the copy of epoch {copy}, before it "
                           "trained an epoch: the copy is forgotten and the next attempt starts over at epoch 1")


def adopt(orch, job, folder: Path):
    """A pulled run folder's last.pt as the job's first resume copy (``--resume``); returns the job."""
    epoch = pulled_epoch(folder) or 0
    dest = checkpoint_dir(orch.home, job.name, epoch)
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "weights").mkdir(parents=True)
    shutil.copyfile(folder / "weights" / "last.pt", dest / "weights" / "last.pt")
    if (folder / "metrics.jsonl").is_file():
        shutil.copyfile(folder / "metrics.jsonl", dest / "metrics.jsonl")
    job = orch.ledger.update_job(job.id, checkpoint_epoch=epoch)
    return note(orch, job, f"resumes from {folder / 'weights' / 'last.pt'} (epoch {epoch or '?'})", say=False)
