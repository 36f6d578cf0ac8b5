"""The one way the ledger learns what a provider shows: ``sync(orch, inst, remote)``.

``orch status NAME``, every reaper pass and ``orch reconcile`` call it with what the provider says
of the instance now (``None``: not listed, and gone when asked). It records every difference as a
transition with its reason, and nothing else; deciding what to do about it is the reaper's job.
An instance another orch process holds (its claim, see ``claims``) is that process's business.

What it records, by what the provider shows:

- **gone**: destroyed (when orch was destroying it), preempted then destroyed (a spot instance the
  provider ended: nothing of it bills from then on), destroyed by its own watchdog (on the
  watchdog's own word: ``watchdog.mark``), else lost, ended from outside orch;
- **running** while the ledger says stopped, preempted or scheduling: *unattended* (it bills and
  nothing orch prepared runs there); a ready instance whose endpoint moved gets the new one,
  but a route that answered (Vast.ai's proxy) is kept while the provider still offers it;
- **stopped** while ready: preempted (spot), stopped by its own watchdog (on its own word, never
  because it was armed), or stopped from outside orch (its console, its API, a power-off: the
  provider's word for it added; the watchdog's state file, read once it is back, says if it was it);
- **scheduling**: a start waits for a GPU (or an outbid spot instance for its bid);
- **broken**: the container exited or the host dropped.

An interrupted ``orch`` (no process holds the claim any more) is settled too: a stop or start
takes what the provider shows, a destroy is finished, and an instance an ``orch up`` left half-made
is destroyed once its idle time has passed (``orch up NAME`` resumes it before then).
"""

from __future__ import annotations

from datetime import datetime, timezone

from orchestrator import states
from orchestrator.ledger import claims
from orchestrator.money import policy
from orchestrator.provider import Remote, Status


# What the provider shows and the ledger says agree, and sync would leave the row as it is (below).
_AGREE = frozenset({(Status.STOPPED, states.STOPPED), (Status.STOPPED, states.PREEMPTED),
                    (Status.SCHEDULING, states.SCHEDULING), (Status.BROKEN, states.BROKEN)})


def sync(orch, inst, remote: Remote | None):
    """Bring one ledger row in line with ``remote`` (None: the provider does not have it)."""
    if inst.state not in states.LIVE or inst.state == states.REQUESTED:
        return inst  # a request in flight is settled by reconcile.settle_requested
    if remote is not None and (remote.status, inst.state) in _AGREE:
        return inst  # nothing to move, so no claim to ask about (a reaper pass over a stopped fleet)
    if claims.busy(orch.ledger, inst.name):
        return inst
    status = Status.GONE if remote is None else remote.status
    s = inst.state
    move = orch.move
    what = f" ({remote.detail})" if remote is not None and remote.detail else ""

    if status == Status.GONE:
        if s == states.DESTROYING:
            return move(inst, states.DESTROYED, "confirmed gone at the provider")
        if s == states.PREEMPTED or (remote is not None and remote.preempted):
            return _ended_by_market(orch, inst, remote, what)
        word = _watchdog_word(orch, inst, remote, "destroy")
        if word:
            from orchestrator.instances.watchdog import ACTOR

            orch.ledger.transition(inst.id, states.DESTROYING, actor=ACTOR, expect=s,
                                   reason=f"gone at the provider: destroyed by its watchdog{word}")
            return orch.ledger.transition(inst.id, states.DESTROYED, actor=ACTOR,
                                          reason="confirmed gone at the provider")
        if inst.spot:
            return _ended_by_market(orch, inst, remote, what)
        return move(inst, states.LOST,
                    f"ended from outside orch: gone at the provider without orch destroying it{what}")

    if s == states.DESTROYING:
        return orch.down(inst, "finishing a destroy that an interrupted orch had begun")
    if s == states.PROVISIONING:
        return _abandoned(orch, inst)

    if status == Status.RUNNING:
        if s in (states.STOPPED, states.PREEMPTED, states.SCHEDULING):
            return move(inst, states.UNATTENDED, f"running at the provider though the ledger said {s}: it bills, "
                                                 "and nothing orch prepared runs there", **_route(inst, remote))
        if s == states.STARTING:
            return move(inst, states.UNATTENDED, "the interrupted start left it running, not prepared",
                        **_route(inst, remote))
        if s == states.STOPPING:
            return move(inst, states.READY, "the interrupted stop left it running", **_route(inst, remote))
        if s == states.BROKEN:
            return move(inst, states.READY, f"running again at the provider{what}", **_route(inst, remote))
        fields = _route(inst, remote)
        return orch.ledger.update(inst.id, **fields) if fields else inst

    if status == Status.STOPPED:
        if s in (states.READY, states.UNATTENDED, states.BROKEN):
            if inst.spot and (remote.preempted or s == states.READY):
                return move(inst, states.PREEMPTED, f"spot instance stopped by the provider (preempted){what}")
            word = _watchdog_word(orch, inst, remote, "stop") if s == states.READY else None
            if word:
                from orchestrator.instances.watchdog import ACTOR

                return orch.ledger.transition(inst.id, states.STOPPED, actor=ACTOR, expect=s,
                                              reason=f"stopped by its watchdog{word}")
            return move(inst, states.STOPPED, f"stopped at the provider, not by orch{what}")
        if s in (states.STOPPING, states.STARTING, states.SCHEDULING):
            verb = {states.STOPPING: "stop", states.STARTING: "start"}.get(s)
            return move(inst, states.STOPPED, "stopped at the provider" + (
                f" (the interrupted {verb} left it so)" if verb else ""))
        return inst

    if status == Status.SCHEDULING:
        if s in (states.READY, states.UNATTENDED) and inst.spot:
            return move(inst, states.PREEMPTED, f"outbid: waits at the provider for its bid to win again{what}")
        if s in (states.STOPPED, states.STARTING, states.READY, states.UNATTENDED, states.PREEMPTED, states.STOPPING):
            return move(inst, states.SCHEDULING, f"a start waits at the provider for its host to free a GPU{what}")
        return inst

    if status == Status.BROKEN and s != states.BROKEN:
        return move(inst, states.BROKEN, f"broken at the provider{what}: it will not run again by itself, "
                                         "and it may still bill")
    return inst  # pending: still moving at the provider; the next look sees where it lands


def refresh_all(orch) -> list[tuple[str, str]]:
    """Every live instance in line with what its provider shows now (`orch status --refresh`): one
    listing per provider, then ``sync``; no SSH. Returns (provider, why) for each listing that
    failed: those instances keep what the ledger says."""
    from orchestrator.text import why

    failed = []
    live = [i for i in orch.ledger.instances(live_only=True) if i.provider_id is not None]
    for name in sorted({i.provider for i in live}):
        try:
            provider = orch.provider(name)
            listing = {r.provider_id: r for r in provider.list()}
            for inst in (i for i in live if i.provider == name):
                remote = listing.get(inst.provider_id)
                sync(orch, inst, remote if remote is not None else provider.get(inst.provider_id))
        except Exception as e:  # noqa: BLE001 - a failed listing is never read as "nothing there"
            failed.append((name, why(e)))
    return failed


def _ended_by_market(orch, inst, remote: Remote | None, what: str):
    """A preempted instance its provider has ended (terminated, not stopped): nothing of it bills any
    more, its disk included (a spot root volume goes with it), so the row ends here, destroyed, and
    no cost is counted from now on. A spot instance gone while orch did not destroy it, whose
    provider no longer says why (EC2 forgets a terminated instance after about an hour), was taken
    back by its market as far as anyone can tell: ended the same way, not recorded lost."""
    said = remote is not None and remote.preempted
    why = (f"ended by {inst.provider}'s spot market{what}" if said else f"gone at {inst.provider} without orch "
           "destroying it, and it no longer says why: a spot instance, taken back by its market")
    if inst.state == states.PREEMPTED:
        why = "ended at the provider after its preemption"
    elif states.allowed(inst.state, states.PREEMPTED):
        inst = orch.move(inst, states.PREEMPTED, why)
        why = "ended at the provider after its preemption"
    inst = orch.move(inst, states.DESTROYING, f"{why}: nothing of it bills any more")
    return orch.move(inst, states.DESTROYED, "confirmed gone at the provider")


def _route(inst, remote: Remote) -> dict:
    """The endpoint to record: the ledger's own while the provider still offers it (it answered),
    else the provider's preferred one."""
    if not remote.routes:
        return {}
    if any((r.host, r.port) == (inst.ssh_host, inst.ssh_port) for r in remote.routes):
        return {}
    ep = remote.endpoint or remote.routes[0]
    return {"ssh_host": ep.host, "ssh_port": ep.port, "ssh_user": ep.user}


def _armed(orch, inst) -> dict | None:
    from orchestrator.instances.watchdog import armed_now

    return armed_now(orch, inst)


def _watchdog_word(orch, inst, remote, what: str) -> str:
    """", armed RULE -> ACTION: ITS REASON" where the watchdog's own word says it did ``what``
    (``watchdog.mark``); "" where it left none: then it is not blamed."""
    from orchestrator.instances.watchdog import mark

    word = mark(orch, inst, remote, what)
    if word is None:
        return ""
    armed = _armed(orch, inst)
    rule = f" ({_rule(armed)} -> {armed['idle_action']})" if armed else ""
    return f"{rule}: {word}"


def _rule(armed: dict) -> str:
    return f"idle {armed['idle_minutes']:g} min" + (f" or max {armed['max_hours']:g} h" if armed["max_hours"] else "")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _abandoned(orch, inst):
    """Left half-made by an interrupted ``orch up`` (nobody holds its claim): destroyed once its idle
    time has passed, never left billing; until then ``orch up NAME`` can resume it."""
    grace_min = policy.of(inst).idle_minutes
    updated = inst.updated_at if inst.updated_at.tzinfo else inst.updated_at.replace(tzinfo=timezone.utc)
    age_min = (_now() - updated).total_seconds() / 60
    if inst.protected or age_min < grace_min:
        return inst
    return orch.down(inst, f"left half-made by an interrupted `orch up` {age_min:.0f} min ago and never verified: "
                           "destroyed so it does not keep billing")
