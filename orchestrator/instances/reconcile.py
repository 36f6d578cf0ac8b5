"""``orch reconcile``: the ledger against every provider's own list of the instances carrying orch's tag.

What reconcile does with each instance it is not told about by a live orch process (one that
holds the instance's claim is left alone, see ``claims``):

- listed at the provider, unknown to the ledger (or recorded as ended there): **adopted**, a
  row written with actor ``reconcile``, from then on subject to the reaper's policies;
- in the ledger, gone at the provider (asked by id, not just missing from the list): **lost**
  with the time, or **destroyed** when orch was destroying it;
- ``requested`` (the create call may have been in flight when orch died): looked up by its label,
  **found** (recorded, then treated as below) or **failed** with the reason;
- left half-made by an interrupted ``orch up``: **abandoned** — ``orch up NAME`` resumes it;
  after the instance's idle minutes (the reaper's own clock) it is destroyed, never left billing;
- an interrupted stop, start or destroy: settled to what the provider shows, a destroy finished;
- adopted but not reachable over SSH (a pod whose container never starts): given the SSH deadline a
  fresh ``orch up`` gets (``ssh_timeout_minutes``), then **destroyed**, the event saying why;
- what a provider keeps for a group (a security group, a placement group) whose nodes are all
  gone, however they ended: **swept** (``RentsGroups.sweep_groups``);
- a provider whose listing fails: **reported and left alone**, never read as an empty fleet.

``reconcile(orch)`` is what the reaper calls at the start of each pass.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Iterable

from orchestrator import states
from orchestrator.ledger import claims
from orchestrator.ssh import reach
from orchestrator.errors import OrchError, UsageError
from orchestrator.provider import Provider, Remote, RentsGroups, Status, parse_label
from orchestrator.instances.sync import sync
from orchestrator.text import why as _why

ACTOR = "reconcile"
LAST_RUN = "reconcile:last_run"
LAST_REPORT = "reconcile:last_report"
# In an adopted instance's memory while it has not answered SSH: when reconcile adopted it.
UNREACHED = "unreached_since"


@dataclass
class ProviderReport:
    provider: str
    listed: int | None = None  # instances carrying orch's tag; None: not listed
    error: str | None = None  # why the listing failed (everything of this provider left alone)
    adopted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)  # "name: from -> to" for any other change
    busy: list[str] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)  # left alone because the listing failed
    problems: list[str] = field(default_factory=list)  # one instance's trouble, the others still done
    ended: list[str] = field(default_factory=list)  # ids of the rows this reconcile ended (a reaper pass reports them)
    swept: list[str] = field(default_factory=list)  # what the provider kept for groups with no live node, removed

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems


@dataclass
class Report:
    at: str
    providers: list[ProviderReport]
    volumes: object = None  # what reconciling the volumes did (``volumes.reconcile``: changed, problems)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.providers) and not (self.volumes and self.volumes.problems)

    def to_dict(self) -> dict:
        return {"at": self.at, "ok": self.ok, "providers": [dict(asdict(p), ok=p.ok) for p in self.providers],
                "volumes": asdict(self.volumes) if self.volumes else None}

    def summary(self) -> dict:
        return {"at": self.at, "ok": self.ok,
                "errors": {p.provider: p.error or "; ".join(p.problems) for p in self.providers if not p.ok}}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def configured(orch, rows: list) -> list[str]:
    """Providers to ask: every one whose credentials are there, and every one the ledger has live
    instances on (``rows``; a missing key is then reported, not taken as "nothing there")."""
    from orchestrator.provider import plugins

    names = {i.provider for i in rows}
    for name in plugins.providers():
        try:
            if orch.provider(name).configured():
                names.add(name)
        except OrchError:
            pass  # a provider that cannot even be set up has nothing orch could have rented
    return sorted(names)


def reconcile(orch, providers: Iterable[str] | None = None, unsettled_only: bool = False,
              listings: dict[str, dict[str, Remote]] | None = None) -> Report:
    """One reconcile pass over ``providers`` (default: ``configured``); records when it ran.

    ``unsettled_only`` (the reaper's call): settle only rows the reaper's own pass cannot, a
    ``requested`` row and one without a provider id, and adopt what is listed but not held; every
    other row is synced by the pass that follows, so taking its claim here too would only double
    the pass's work (16 s of a 20 s pass over 10,000 instances, bench/fleet.py). ``listings``: each
    provider's listing, by provider id, is left there for that pass (one listing per provider a pass,
    not two; a local fleet's listing reads a file per instance)."""
    rec = replace(orch, actor=ACTOR)
    started = _now()
    rows = _live(rec)  # read once, before any listing: a fleet of 10,000 is 10,000 rows a read
    report = Report(_iso(started), [_provider(rec, name, [r for r in rows if r.provider == name],
                                              unsettled_only, listings)
                                    for name in (providers or configured(rec, rows))])
    from orchestrator.volumes import volumes

    report.volumes = volumes.reconcile(rec, providers)  # volumes carry orch's tag too: adopted, settled
    rec.ledger.set_meta(LAST_RUN, report.at)
    rec.ledger.set_meta(LAST_REPORT, json.dumps(report.summary()))
    return report


_COLUMNS = ("id", "name", "state", "provider", "provider_id", "label")


def _live(orch, provider: str | None = None) -> list:
    """The live rows (of one provider), only what reconcile decides by, read plainly: a fleet of
    10,000 rows as ORM objects cost seconds a pass; a row to settle is read again under its claim."""
    from types import SimpleNamespace

    from orchestrator.ledger import ledger_sql

    return [SimpleNamespace(**r) for r in ledger_sql.live(_COLUMNS, orch.ledger.url)
            if provider in (None, r["provider"])]


def _needs_reconcile(row) -> bool:
    """A row only reconcile settles: the reaper skips a ``requested`` row, and sync needs an id."""
    return row.state == states.REQUESTED or row.provider_id is None


def _provider(orch, name: str, rows: list, unsettled_only: bool = False,
              listings: dict[str, dict[str, Remote]] | None = None) -> ProviderReport:
    """One provider: ``rows`` (its live rows, read before its listing) settled, what it lists adopted."""
    pr = ProviderReport(name)
    try:
        provider = orch.provider(name)
    except OrchError as e:
        pr.error = _why(e)
        return pr
    try:
        remotes = provider.list()
    except Exception as e:  # noqa: BLE001 - whatever broke, a failed listing is never an empty fleet
        pr.error = f"listing failed: {_why(e)}"
        pr.untouched = [r.name for r in rows]
        return pr
    pr.listed = len(remotes)
    listed = {r.provider_id: r for r in remotes}
    if listings is not None:
        listings[name] = listed
    for row in rows:
        if unsettled_only and not _needs_reconcile(row):
            continue
        try:
            _settle(orch, provider, row, listed, pr)
        except Exception as e:  # noqa: BLE001 - one instance's trouble must not stop the others
            pr.problems.append(f"{row.name}: {_why(e)}")
    if any(r.state == states.READY for r in rows):  # an adopted instance is ready: else nothing to ask
        unreached_deadline(orch, provider, pr)
    sweep_groups(orch, provider, pr)
    held = {r.provider_id for r in rows if r.provider_id}
    if all(r.provider_id in held for r in remotes):
        return pr  # every instance listed was a row already: nothing to adopt, nothing more to read
    live = _live(orch, name)
    # Rows live when the listing was taken were settled above, whatever they are now.
    known_ids = {i.provider_id for i in [*rows, *live] if i.provider_id}
    # A live row without a provider id yet is a create in flight (its orch holds the claim).
    in_flight = {i.label for i in live if not i.provider_id}
    for remote in remotes:
        if remote.provider_id in known_ids or remote.label in in_flight:
            continue
        try:
            _adopt(orch, provider, remote, pr)
        except Exception as e:  # noqa: BLE001
            pr.problems.append(f"{remote.label}: could not adopt {remote.provider_id}: {_why(e)}")
    return pr


def _settle(orch, provider: Provider, row, listed: dict[str, Remote], pr: ProviderReport) -> None:
    with claims.try_hold(orch.ledger, row.name) as mine:
        if not mine:
            pr.busy.append(row.name)
            return
        inst = _settle_row(orch, provider, orch.ledger.get(row.id), listed, pr)
        if inst is not None and inst.state not in states.LIVE:
            pr.ended.append(inst.id)


def _settle_row(orch, provider: Provider, inst, listed: dict[str, Remote], pr: ProviderReport):
    """One row, under its claim; the row as this left it (None: already ended, not touched)."""
    if inst.state not in states.LIVE:
        return None
    if inst.state == states.REQUESTED:
        inst = settle_requested(orch, provider, inst, pr)
        if inst.state != states.PROVISIONING:
            return inst
    if inst.provider_id is None:  # a destroy begun before the create was known: it looks by label
        inst = orch.down(inst, "finishing a destroy that an interrupted orch had begun")
        pr.destroyed.append(inst.name)
        return inst
    remote = listed.get(inst.provider_id) or provider.get(inst.provider_id)
    before = inst.state
    inst = sync(orch, inst, remote)
    if inst.state == states.DESTROYED:
        pr.destroyed.append(inst.name)
    elif inst.state == states.LOST:
        pr.lost.append(inst.name)
    elif inst.state == states.PROVISIONING:
        pr.abandoned.append(inst.name)
    elif inst.state != before:
        pr.settled.append(f"{inst.name}: {before} -> {inst.state}")
    return inst


def settle_requested(orch, provider: Provider, inst, pr: ProviderReport):
    """A row still ``requested`` whose orch is gone: did its create reach the provider?"""
    found = provider.find(inst.label)  # raises when the provider cannot say: then nothing is decided
    if found is None:
        pr.failed.append(inst.name)
        return orch.move(inst, states.FAILED, f"never created at {provider.name}: the orch that asked "
                                              "stopped before its create reached the provider")
    price, stopped = provider.prices(found)
    pr.found.append(inst.name)
    return orch.move(inst, states.PROVISIONING, f"found at {provider.name} as {found.provider_id}: its create "
                                                "went through after the orch that asked stopped",
                     provider_id=found.provider_id, price_hr=price, stopped_price_hr=stopped,
                     gpu_name=found.gpu_name)


def _adopt(orch, provider: Provider, remote: Remote, pr: ProviderReport) -> None:
    from orchestrator.ledger.ledger import Instance, new_id

    parsed = parse_label(remote.label)
    if parsed is None:
        return
    label_id, label_name = parsed
    with claims.try_hold(orch.ledger, f"adopt {provider.name} {remote.provider_id}") as mine:
        if not mine:
            pr.busy.append(remote.label)
            return
        ledger = orch.ledger
        remote = provider.get(remote.provider_id)  # the listing may be minutes old by now
        if remote.status == Status.GONE:
            return
        answering = reach.reachable(remote)  # the route that answers (Vast.ai's proxy, say)
        remote = answering or remote
        earlier = ledger.get(label_id)
        iid = label_id if earlier is None else new_id()
        name = label_name
        if ledger.by_name(name) is not None:
            name = f"{label_name[:33]}-{iid[:6]}"
        state = {Status.RUNNING: states.READY, Status.PENDING: states.READY,
                 Status.SCHEDULING: states.SCHEDULING, Status.BROKEN: states.BROKEN,
                 Status.STOPPED: states.PREEMPTED if remote.spot else states.STOPPED}[remote.status]
        price, stopped = provider.prices(remote)
        ep = remote.endpoint
        inst = Instance(
            id=iid, name=name, provider=provider.name, provider_id=remote.provider_id, label=remote.label[:128],
            state=state, gpu=remote.gpu_name and remote.gpu_name[:64], gpus=remote.gpus, cpu_only=remote.gpus == 0,
            spot=remote.spot, gpu_name=remote.gpu_name and remote.gpu_name[:128], price_hr=price,
            stopped_price_hr=stopped, ssh_host=ep.host if ep else None, ssh_port=ep.port if ep else None,
            ssh_user=ep.user if ep else None,
            host_key=provider.vouched_host_key(remote.provider_id) if ep else None)
        how = f"though the ledger recorded it {earlier.state}" if earlier else "unknown to this ledger"
        reason = (f"adopted: {provider.name} shows {remote.provider_id} ({remote.label}, {remote.status.value}) "
                  f"carrying orch's tag, {how}")
        with claims.try_hold(ledger, name) as free:
            if not free:
                pr.busy.append(name)
                return
            if ledger.adopt(inst, reason, ACTOR) is None:
                return  # adopted meanwhile by a concurrent reconcile, or the name was taken
            if state == states.READY and answering is None:  # its SSH deadline runs from now
                ledger.remember(iid, **{UNREACHED: _iso(_now())})
    pr.adopted.append(name)


def unreached_deadline(orch, provider: Provider, pr: ProviderReport) -> None:
    """Every instance adopted from ``provider`` that has not answered SSH yet: once it answers, an
    ordinary ready instance; past the deadline a fresh ``orch up`` gets (``ssh_timeout_minutes``,
    or sooner where the provider says it never will: ``never_answers``), destroyed, the event
    saying why. Without this the reaper keeps it for ever: unreachable, its idleness unknown."""
    from sqlmodel import select

    from orchestrator.ledger.ledger import Instance

    with orch.ledger.session(write=False) as s:
        rows = list(s.exec(select(Instance.id, Instance.name).where(
            Instance.provider == provider.name, Instance.state == states.READY,
            Instance.memory.contains(f'"{UNREACHED}"'))))
    for iid, name in rows:
        try:
            with claims.try_hold(orch.ledger, name) as mine:
                if not mine:
                    pr.busy.append(name)
                    continue
                inst = orch.ledger.get(iid)
                if inst.state == states.READY and _unreached(orch, provider, inst):
                    pr.destroyed.append(inst.name)
                    pr.ended.append(inst.id)
        except Exception as e:  # noqa: BLE001 - one instance's trouble must not stop the others
            pr.problems.append(f"{name}: {_why(e)}")


def _unreached(orch, provider: Provider, inst) -> bool:
    """One adopted instance not reached yet, under its claim: True when it was destroyed."""
    from orchestrator import config
    from orchestrator.ledger.ledger_sql import memory

    mark = memory(inst).get(UNREACHED)
    if not isinstance(mark, str):
        return False
    try:
        since = datetime.fromisoformat(mark.replace("Z", "+00:00"))
    except ValueError:
        since = _now()
    remote = provider.get(inst.provider_id)
    if remote.status == Status.GONE:
        return False  # ``sync`` records that
    answering = reach.reachable(remote)
    if answering is not None:
        ep = answering.endpoint
        orch.ledger.update(inst.id, ssh_host=ep.host, ssh_port=ep.port, ssh_user=ep.user,
                           host_key=inst.host_key or provider.vouched_host_key(inst.provider_id))
        orch.ledger.remember(inst.id, **{UNREACHED: None})
        orch.ledger.note(inst.id, f"answers SSH at {ep.host}:{ep.port} since its adoption at {_iso(since)}", ACTOR)
        return False
    waited = (_now() - since).total_seconds()
    limit = float(config.get("ssh_timeout_minutes", 20)) * 60
    never = provider.never_answers(remote, waited)
    if never is None and waited < limit:
        return False
    shown = remote.detail or remote.status.value
    why = never or (f"SSH did not answer within {limit / 60:g} min of its adoption at {_iso(since)} "
                    f"(ssh_timeout_minutes, the deadline a fresh `orch up` gets; {provider.name} shows it {shown})")
    orch.down(inst, f"adopted, never reachable: {why}; destroyed so it does not bill for ever")
    return True


def sweep_groups(orch, provider: Provider, pr: ProviderReport) -> None:
    """What ``provider`` keeps for groups none of whose nodes is live any more, given back
    (``RentsGroups.sweep_groups``): nodes end one by one (the reaper, the watchdog, a
    preemption) and a group's own ``close_group`` may have failed. A failure is this pass's
    problem; the next one tries again."""
    if not isinstance(provider, RentsGroups):
        return
    found: list[set[str]] = []

    def live() -> set[str]:
        """The groups the ledger holds a live node of at this provider; read once, and only when the
        provider holds something for a group (a quiet pass imports no models)."""
        if not found:
            from sqlmodel import select

            from orchestrator.ledger.ledger import Instance

            with orch.ledger.session(write=False) as s:
                found.append({g for g in s.exec(select(Instance.group_id).where(
                    Instance.provider == provider.name, Instance.state.in_(states.LIVE),
                    Instance.group_id.is_not(None)).distinct()) if g})
        return found[0]

    try:
        pr.swept += provider.sweep_groups(live)
    except Exception as e:  # noqa: BLE001 - a failed sweep stops nothing else; the next pass tries again
        pr.problems.append(f"groups: {_why(e)}")


def leftover(orch, name: str, provider_name: str, request):
    """What an interrupted ``orch up NAME`` left, settled so a new ``orch up NAME`` can finish it:
    the half-made instance, or None when the name is free. ``up`` calls this holding the name's
    claim, so no live process is working on what it finds; anything else of that name is refused."""
    inst = orch.ledger.by_name(name)
    if inst is None:
        return None
    if inst.state not in (states.REQUESTED, states.PROVISIONING):
        raise UsageError(f"an instance named {name!r} already exists ({inst.state}; see `orch status {name}`)")
    if (inst.provider, inst.cpu_only) != (provider_name, bool(request.cpu)):
        raise UsageError(f"an instance named {name!r} already exists ({inst.state} on {inst.provider}"
                         f"{', CPU only' if inst.cpu_only else ''}, left by an interrupted `orch up`): repeat "
                         f"that `orch up` to finish it, or `orch down {name}`")
    provider = orch.provider(provider_name)
    if inst.state == states.REQUESTED:
        inst = settle_requested(orch, provider, inst, ProviderReport(provider_name))
        if inst.state == states.FAILED:
            return None
    if provider.get(inst.provider_id).status == Status.GONE:
        orch.move(inst, states.LOST, f"gone at {provider_name} before `orch up` could finish it")
        return None
    return inst


def forget(orch, inst):
    """``orch forget NAME``: close the live row of an instance that its provider confirms gone (asked
    by id, or by its label when the create never said one), for a row no pass could settle. Refused
    (UsageError, nothing changed) while the provider shows it, or when it cannot be asked."""
    name = inst.name
    with claims.hold(orch.ledger, inst.name):  # no orch process is working on it meanwhile
        inst = orch.ledger.get(inst.id)
        if inst.state not in states.LIVE:
            return inst
        try:
            provider = orch.provider(inst.provider)
            if inst.provider_id is not None:
                remote = provider.get(inst.provider_id)
                shown = None if remote.status == Status.GONE else remote
            else:
                shown = provider.find(inst.label)
        except OrchError as e:
            raise UsageError(f"{inst.provider} cannot be asked whether {name} is gone ({_why(e)}): nothing forgotten; "
                             f"once it answers, `orch reconcile` settles {name} by itself") from None
        if shown is not None:
            raise UsageError(f"{inst.provider} still shows {name} ({shown.provider_id}, {shown.status.value}): it may "
                             f"bill; `orch down {name}` destroys it")
        where = f"{inst.provider_id} is gone" if inst.provider_id else f"nothing carries its label {inst.label}"
        to = {states.REQUESTED: states.FAILED, states.DESTROYING: states.DESTROYED}.get(inst.state, states.LOST)
        return orch.move(inst, to, f"forgotten (`orch forget`): {inst.provider} confirms {where}")
