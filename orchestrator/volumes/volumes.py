"""Volumes as money: made, listed, costed, reported when idle, found again, deleted only on request.

A volume bills from its creation to its deletion, whatever runs (RunPod: $0.07/GB-month, RunPod
docs "Network volumes"; Lambda: $0.20 per GB used per month, Lambda Cloud docs "Filesystems";
EBS gp3: $0.08/GB-month, AWS "Amazon EBS pricing"). So:

- **made** (``create``) with its row written ``creating`` before the provider is asked, under the
  name's claim; an error after which the provider may have made it anyway is looked up by name
  before the row is called failed (a refusal made nothing);
- **costed** (``cost``): size x $/GB-month x the hours since its creation (to its deletion) / 730,
  at the price recorded when it was made; the size is the one asked for, raised at each reconcile
  (every reaper pass, ``orch reconcile``) to what the provider lists when that is more (a Lambda
  filesystem bills the GB it holds, reported as ``bytes_used``: ``_grown``);
- **reported, never deleted**, by the reaper (``idle``) once unattached for ``volume_idle_days``
  (config.toml, default 7), once per idle stretch with a webhook post (``notify`` event ``volume``);
- **found again** (``reconcile``, at every ``orch reconcile`` and reaper pass): a volume a provider
  lists with orch's tag and the ledger does not hold is adopted; a row left ``creating`` or
  ``deleting`` by an interrupted orch is settled from the provider's listing;
- **deleted** only by ``orch volume rm`` (``remove``): never while an instance mounts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from orchestrator import states
from orchestrator.ledger import claims
from orchestrator.errors import AuthError, IllegalTransition, OrchError, ProviderError, UsageError
from orchestrator.kill_points import kill_point
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.model import HOURS_PER_MONTH
from orchestrator.text import clean
from orchestrator.text import why as _why
from orchestrator.volumes.volume_uses import check_name

ACTOR = "reconcile"  # what reconciling the volumes writes as
IDLE_DAYS = 7.0  # volume_idle_days in config.toml
WHERE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _claim(name: str) -> str:
    return f"volume:{name}"  # a colon: no instance name takes this claim


# -- orch volume create -------------------------------------------------------------------------
def check_create(name: str, provider, size_gb: int, region: str | None, zone: str | None) -> str | None:
    """Every argument of ``orch volume create`` against ``provider`` (built from its settings),
    before anything is opened; returns where the volume goes (None: the provider's default)."""
    check_name(name, "orch volume create")
    if not isinstance(provider, HasVolumes):
        raise UsageError(f"{provider.name} makes no volumes (orch knows volumes on the providers that have them: "
                         "`orch check` lists each provider's features)")
    if isinstance(size_gb, bool) or not provider.min_volume_gb <= size_gb <= provider.max_volume_gb:
        raise UsageError(f"--size must be between {provider.min_volume_gb} and {provider.max_volume_gb} GB on "
                         f"{provider.name}, not {size_gb}")
    if region is not None and zone is not None:
        raise UsageError("give --region or --zone, not both")
    kind = provider.volume_place
    where = region if region is not None else zone
    if where is not None:
        flag = "--zone" if zone is not None else "--region"
        if kind == "folder":
            raise UsageError(f"a {provider.name} volume is a folder of this machine: drop {flag}")
        if (flag == "--zone") != (kind == "zone"):
            right = "--zone" if kind == "zone" else "--region"
            raise UsageError(f"a {provider.name} volume lives in a {kind}: give it with {right}, not {flag}")
        if not where or len(where) > 64 or not set(where) <= WHERE_CHARS:
            raise UsageError(f"{flag} takes a {kind} name such as us-east-1a or EU-RO-1, not {where!r}")
    provider.require_credentials()
    return where


def create(orch, name: str, provider_name: str, size_gb: int, where: str | None):
    """Make the volume: its row first (``creating``), then the provider's create, then ``ready``
    with what the provider made (or ``failed``, with why). Returns the row."""
    from orchestrator.volumes import ledger_volumes

    provider = orch.provider(provider_name)
    with claims.hold(orch.ledger, _claim(name)):
        row = ledger_volumes.create(orch.ledger, actor=orch.actor, name=name, provider=provider_name,
                                    size_gb=size_gb, place=where,
                                    reason=f"requested: {size_gb} GB on {provider_name}" + (f" in {where}" if where else ""))
        try:
            kill_point("volume-before-create")
            made = provider.create_volume(name, size_gb, where)
            kill_point("volume-created")
        except BaseException as e:
            if isinstance(e, (AuthError, UsageError)):  # refused: the provider made nothing
                ledger_volumes.move(orch.ledger, row.id, ledger_volumes.FAILED, f"create refused: {_why(e)}", orch.actor)
                raise
            try:  # it may have made it before failing: look before giving up
                made = _listed(provider, name)
            except OrchError as lookup:
                ledger_volumes.note(orch.ledger, row.id, f"create failed ({_why(e)}) and the lookup failed too "
                                                         f"({_why(lookup)}): reconcile settles it", orch.actor)
                raise ProviderError(f"creating volume {name} failed ({_why(e)}) and {provider_name} could not say "
                                    f"whether it made it anyway: `orch reconcile` settles it once it answers") from e
            if made is None:
                ledger_volumes.move(orch.ledger, row.id, ledger_volumes.FAILED, f"create failed: {_why(e)}", orch.actor)
                raise
            ledger_volumes.move(orch.ledger, row.id, ledger_volumes.READY, f"made though the create errored "
                                f"({_why(e)}): {made.volume_id} in {made.where}", orch.actor, **_facts(made))
            if isinstance(e, KeyboardInterrupt):
                raise
            orch.say(f"the create errored ({_why(e)}) but {provider_name} lists {name}: using it")
            return ledger_volumes.get(orch.ledger, row.id)
        return ledger_volumes.move(orch.ledger, row.id, ledger_volumes.READY, f"made: {made.volume_id} in {made.where}",
                                   orch.actor, **_facts(made))


def _listed(provider, name: str):
    return next((v for v in provider.list_volumes() if v.name == name), None)


def _facts(made) -> dict:
    return {"provider_id": str(made.volume_id)[:128], "place": (made.where or None) and str(made.where)[:128],
            "size_gb": int(made.size_gb or 0), "price_gb_month": made.price_gb_month}


# -- orch volume rm -----------------------------------------------------------------------------
def remove(orch, name: str, confirm: Callable[[str], None]):
    """Delete the volume: refused while an instance mounts it (the ledger's word, and its
    provider's); ``confirm`` asks (it raises to refuse). Its row ``deleting`` before the provider
    is asked, ``deleted`` once it confirms. Returns the row."""
    from orchestrator.volumes import ledger_volumes, volume_snapshot

    check_name(name, "orch volume rm")
    row = ledger_volumes.by_name(orch.ledger, name)
    if row is None:
        raise UsageError(f"no volume named {name!r} (`orch volume ls`)")
    if row.state == ledger_volumes.CREATING:
        raise UsageError(f"volume {name} is still being created (`orch reconcile` settles one an interrupted orch left)")
    holders = volume_snapshot.read(orch.ledger).attached_to(row.id)
    if holders:
        who = ", ".join(f"{a['instance']} ({a['state']})" for a in holders)
        raise UsageError(f"volume {name} is attached to {who}: `orch down` {'it' if len(holders) == 1 else 'them'} "
                         "first (orch never deletes a volume an instance mounts)")
    provider = orch.provider(row.provider)
    shown = _listed(provider, name)  # the provider's own word: an instance outside the ledger may mount it
    if shown is not None and shown.attached_to:
        raise UsageError(f"volume {name} is attached at {row.provider} to {', '.join(shown.attached_to)}: "
                         "end that instance first")
    confirm(f"delete volume {name} on {row.provider} ({row.size_gb} GB): everything on it is lost?")
    with claims.hold(orch.ledger, _claim(name)):
        if row.state == ledger_volumes.READY:
            row = ledger_volumes.move(orch.ledger, row.id, ledger_volumes.DELETING, "deleted by the user", orch.actor,
                                      expect=ledger_volumes.READY)
        try:
            if shown is not None:
                provider.delete_volume(shown)
        except ProviderError as e:
            raise ProviderError(f"deleting volume {name} on {row.provider} failed ({_why(e)}): it is recorded "
                                f"deleting and still bills; `orch volume rm {name}` again or `orch reconcile` "
                                "finishes it") from e
        return ledger_volumes.move(orch.ledger, row.id, ledger_volumes.DELETED, "deleted by the user"
                                   if shown is not None else f"not at {row.provider} any more: nothing to delete",
                                   orch.actor, deleted_at=_now())


# -- what it costs ------------------------------------------------------------------------------
def cost(row, since: datetime | None = None, until: datetime | None = None) -> tuple[float, float]:
    """(hours billed, dollars) of ``row`` from its creation (or ``since``) to its deletion (or
    ``until``, now): size x $/GB-month, prorated over a 730-hour month. A create that failed made
    nothing: nothing."""
    if row.state == states.VOLUME_FAILED:
        return 0.0, 0.0
    until = until or _now()
    start = max(row.created_at, since) if since else row.created_at
    end = min(row.deleted_at, until) if row.deleted_at else until
    hours = max((end - start).total_seconds(), 0.0) / 3600
    return hours, hours * (row.size_gb or 0) * (row.price_gb_month or 0.0) / HOURS_PER_MONTH


def per_month(row) -> float | None:
    return None if row.price_gb_month is None else (row.size_gb or 0) * row.price_gb_month


def costs(ledger, since: datetime | None = None) -> list[dict]:
    """Every volume that billed (in the window from ``since``): what ``orch cost`` lists."""
    from orchestrator.volumes import volume_snapshot

    pic = volume_snapshot.read(ledger, live_only=False)
    out = []
    for row in pic.volumes:
        hours, usd = cost(row, since)
        if row.state in states.VOLUME_LIVE or hours > 0:
            if row.state == states.VOLUME_FAILED:
                continue
            out.append({"name": row.name, "provider": row.provider, "state": row.state, "size_gb": row.size_gb,
                        "price_gb_month": row.price_gb_month, "usd_month": per_month(row), "hours": hours,
                        "usd": usd, "created_at": _iso(row.created_at), "deleted_at": _iso(row.deleted_at)})
    return out


def listing(ledger) -> list[dict]:
    """Each live volume as ``orch volume ls`` shows it: where it lives, its size and price, what
    mounts it now, since when it exists, what it cost so far."""
    from orchestrator.volumes import volume_snapshot

    pic = volume_snapshot.read(ledger)
    out = []
    for row in pic.volumes:
        _, usd = cost(row)
        out.append({"name": row.name, "provider": row.provider, "provider_id": row.provider_id,
                    "where": row.place, "state": row.state, "size_gb": row.size_gb,
                    "price_gb_month": row.price_gb_month, "usd_month": per_month(row), "cost_usd": round(usd, 6),
                    "attached_to": [{"instance": a["instance"], "state": a["state"], "path": a["host_path"] or a["path"]}
                                    for a in pic.attached_to(row.id)],
                    "created_at": _iso(row.created_at)})
    return out


def attached(ledger) -> dict[str, list[dict]]:
    """Live instance id -> [{volume, path, instance}], for ``orch status``."""
    from orchestrator.volumes import volume_snapshot

    pic = volume_snapshot.read(ledger)
    out: dict[str, list[dict]] = {}
    for row in pic.volumes:
        for a in pic.attached_to(row.id):
            out.setdefault(a["instance_id"], []).append({"volume": row.name, "path": a["host_path"] or a["path"],
                                                         "instance": a["instance"]})
    return out


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.astimezone(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


# -- the reaper's look --------------------------------------------------------------------------
def idle(orch, now: datetime, dry_run: bool = False) -> list[dict]:
    """Each ready volume that no live instance has mounted for ``volume_idle_days``: a report (and,
    once per idle stretch, an event and a webhook post). Never a deletion: what a volume holds is
    the user's, and only ``orch volume rm`` deletes it."""
    from orchestrator import config
    from orchestrator.volumes import volume_snapshot

    days = float(config.get("volume_idle_days", IDLE_DAYS))
    pic = volume_snapshot.read(orch.ledger)
    out = []
    for row in pic.volumes:
        if row.state != states.VOLUME_READY or pic.attached_to(row.id):
            continue
        since = max(pic.last_detached.get(row.id) or row.created_at, row.created_at)
        unused = (now - since).total_seconds() / 86400
        if unused < days:
            continue
        month = per_month(row)
        reason = (f"volume {row.name} unattached for {unused:.1f} days (volume_idle_days {days:g})"
                  + (f", billing ${month:.2f}/month" if month is not None else "")
                  + f": `orch volume rm {row.name}` deletes it (orch never does)")
        out.append({"name": row.name, "provider": row.provider, "state": "unattached", "action": "report",
                    "reason": reason})
        if dry_run or (row.idle_noted_at is not None and row.idle_noted_at >= since):
            continue
        from orchestrator.volumes import ledger_volumes

        ledger_volumes.note(orch.ledger, row.id, f"reported by the reaper: {reason}", orch.actor, idle_noted_at=now)
        _post(f"orch: {reason}")
    return out


def _post(text: str) -> None:
    from orchestrator import notify

    try:
        url, wanted = notify.settings()
        if url and "volume" in wanted:
            notify.post(url, text)
    except Exception:  # noqa: BLE001 - a notification never breaks the pass that caused it
        pass


# -- reconcile ----------------------------------------------------------------------------------
@dataclass
class Found:
    """What reconciling the volumes did: lines of what changed, and what it could not do."""

    changed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def reconcile(orch, providers=None) -> Found:
    """Every provider that makes volumes, asked for its orch-tagged volumes once: those the ledger
    does not hold adopted (``ready``, actor reconcile), rows an interrupted orch left ``creating``
    or ``deleting`` settled, a ready one the provider no longer lists recorded deleted. A provider
    whose listing fails is a problem, never "no volumes"."""
    from orchestrator.provider import plugins
    from orchestrator.volumes import volume_snapshot

    found = Found()
    pic = volume_snapshot.read(orch.ledger)
    names = set(providers or ()) | {r.provider for r in pic.volumes}
    if providers is None:
        for name in plugins.providers():
            try:
                if orch.provider(name).configured():
                    names.add(name)
            except OrchError:
                pass
    for name in sorted(names):
        try:
            provider = orch.provider(name)
        except OrchError as e:
            found.problems.append(f"{name}: {_why(e)}")
            continue
        if not isinstance(provider, HasVolumes):
            continue
        try:
            listed = {v.name: v for v in provider.list_volumes()}
        except Exception as e:  # noqa: BLE001 - a failed listing is never "no volumes"
            found.problems.append(f"{name}: volume listing failed: {_why(e)}")
            continue
        rows = [r for r in pic.volumes if r.provider == name]
        for row in rows:
            try:
                _settle(orch, provider, row, listed.get(row.name), found)
            except Exception as e:  # noqa: BLE001 - one volume's trouble must not stop the others
                found.problems.append(f"volume {row.name}: {_why(e)}")
        held = {r.name for r in pic.volumes}
        for vol in listed.values():
            if vol.name not in held:
                try:
                    _adopt(orch, provider, vol, found)
                except Exception as e:  # noqa: BLE001
                    found.problems.append(f"volume {vol.name}: could not adopt it: {_why(e)}")
    return found


def _settle(orch, provider, row, shown, found: Found) -> None:
    from orchestrator.volumes import ledger_volumes as lv

    if row.state == lv.READY and shown is not None:
        _grown(orch, provider, row, shown, found)
        return  # in step: no claim
    with claims.try_hold(orch.ledger, _claim(row.name)) as mine:
        if not mine:
            return  # an orch process is creating or deleting it right now
        row = lv.get(orch.ledger, row.id)
        try:
            if row.state == lv.CREATING:
                if shown is None:
                    lv.move(orch.ledger, row.id, lv.FAILED, f"the create did not make it ({provider.name} does not list "
                                                            "it): nothing bills", ACTOR)
                    found.changed.append(f"{row.name}: creating -> failed (not made)")
                else:
                    lv.move(orch.ledger, row.id, lv.READY, f"made after all: {provider.name} lists {shown.volume_id}",
                            ACTOR, **_facts(shown))
                    found.changed.append(f"{row.name}: creating -> ready (found at {provider.name})")
            elif row.state == lv.DELETING:
                if shown is not None:
                    provider.delete_volume(shown)  # the user asked for it: finished, as a destroy is
                lv.move(orch.ledger, row.id, lv.DELETED, "the delete an interrupted orch began, finished", ACTOR,
                        deleted_at=_now())
                found.changed.append(f"{row.name}: deleting -> deleted")
            elif row.state == lv.READY and shown is None:
                lv.move(orch.ledger, row.id, lv.DELETED, f"gone: {provider.name} no longer lists it (deleted outside "
                                                         "orch?)", ACTOR, deleted_at=_now())
                found.changed.append(f"{row.name}: ready -> deleted (gone at {provider.name})")
        except IllegalTransition:
            pass  # moved meanwhile by the process that holds it now


def _grown(orch, provider, row, shown, found: Found) -> None:
    """The size billed, raised to what the provider lists when that is more: a Lambda filesystem
    bills per GB used, whatever ``--size`` said (its listing's ``bytes_used``, ``volume``), and a
    volume grown outside orch bills its new size. Never lowered below what it was recorded at."""
    from orchestrator.volumes import ledger_volumes as lv

    listed = int(shown.size_gb or 0)
    if listed > (row.size_gb or 0):
        lv.note(orch.ledger, row.id, f"size refreshed: {provider.name} shows {listed} GB in use (was {row.size_gb} GB)",
                ACTOR, size_gb=listed)
        found.changed.append(f"{row.name}: {row.size_gb} GB -> {listed} GB (as {provider.name} shows it)")


def _adopt(orch, provider, vol, found: Found) -> None:
    from orchestrator.volumes import ledger_volumes as lv

    with claims.try_hold(orch.ledger, _claim(vol.name)) as mine:
        if not mine:
            return
        if lv.by_name(orch.ledger, vol.name) is not None:
            found.problems.append(f"volume {vol.name} at {provider.name} carries orch's tag, and a volume of that name "
                                  "is in the ledger on another provider: left alone")
            return
        made = datetime.fromtimestamp(vol.created_at, timezone.utc) if vol.created_at else _now()
        row = lv.VolumeRow(id=lv.new_id(), name=vol.name, provider=provider.name, state=lv.READY,
                           created_at=min(made, _now()), **_facts(vol))
        reason = (f"adopted: {provider.name} shows {vol.volume_id} ({clean(vol.where, 100) or 'no place'}) carrying "
                  "orch's tag, unknown to this ledger")
        if lv.adopt(orch.ledger, row, reason, ACTOR) is not None:
            found.changed.append(f"{vol.name}: adopted from {provider.name}")
