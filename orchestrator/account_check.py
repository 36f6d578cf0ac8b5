"""``orch check PROVIDER [--live]``: does orch work with this account? Run once, after adding a key.

Without ``--live`` nothing is rented: the key is accepted (a listing answers), offers answer,
orch's SSH key is there, and what the provider cannot do is listed.

With ``--live`` orch rents the cheapest thing that has SSH and runs the whole cycle under a hard
deadline: rent and reach it over SSH (host key pinned), start a detached process and see it
outlive the SSH session, stop and start where the provider can (reaching it again, the new host
key accepted where its images make new ones), and destroy it, confirmed gone. Each step is timed;
the money is the ledger's (the price paid, for the time it billed). Whatever fails, the instance is
destroyed before ``check`` returns: it leaves nothing behind. Exit 0 only when every step held.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field

from orchestrator import config, states
from orchestrator.errors import OrchError, UsageError
from orchestrator.provider import Request, Stoppable, can_stop
from orchestrator.provider.features import HasVolumes
from orchestrator.text import why as _why

DEADLINE_MINUTES = 20.0


@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    detail: str


@dataclass
class Report:
    provider: str
    live: bool
    steps: list[Step] = field(default_factory=list)
    instance: str | None = None
    spent_usd: float = 0.0
    cannot: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


class _Deadline(OrchError):
    pass


def check(orch, provider_name: str, live: bool, deadline_minutes: float = DEADLINE_MINUTES, say=print) -> Report:
    provider = orch.provider(provider_name)
    report = Report(provider_name, live)
    caps = provider.capabilities
    report.cannot = [what for what, can in (("stop", isinstance(provider, Stoppable)), ("spot", caps.spot),
                                            ("CPU-only", caps.cpu_only), ("GPUs", caps.gpu), ("--image", caps.image),
                                            ("volumes", isinstance(provider, HasVolumes))) if not can]
    end = time.monotonic() + deadline_minutes * 60

    def step(name: str, fn, cleanup: bool = False) -> bool:
        t0 = time.monotonic()
        try:
            if time.monotonic() > end and not cleanup:  # a cleanup runs whatever the clock says
                raise _Deadline(f"the {deadline_minutes:g} min deadline passed before this step")
            detail = fn() or ""
            ok = True
        except Exception as e:  # noqa: BLE001 - every failure is this step's, reported in one line
            ok, detail = False, _why(e)
        took = time.monotonic() - t0
        if ok and time.monotonic() > end:
            ok, detail = False, f"{detail}; past the {deadline_minutes:g} min deadline"
        report.steps.append(Step(name, ok, round(took, 2), detail))
        say(f"{'ok  ' if ok else 'FAIL'} {name:<10} {took:6.1f} s  {detail}")
        return ok

    if not step("key", lambda: _key(provider)):
        return report
    step("offers", lambda: _offers(provider))
    step("ssh key", lambda: _ssh_key(provider))
    if report.cannot:
        say(f"     cannot     {provider_name} does not offer: {', '.join(report.cannot)}")
    if not live:
        return report
    _live(orch, provider, report, step, end)
    return report


def _key(provider) -> str:
    if not provider.configured():
        raise UsageError(f"no credentials for {provider.name}: see `orch check --help` and the README's provider table")
    found = provider.list()  # a call that needs the key: a refused key is an error here, not "no instances"
    return f"accepted ({len(found)} instance(s) of orch's there now)"


def _offers(provider) -> str:
    got = provider.offers(Request(name="check", gpus=1))
    if got is None:
        return "no source of offers here (nothing to compare)"
    if not got:
        raise OrchError("the provider answered, with no offer at all")
    cheapest = min((o for o in got if o.price_hr is not None), key=lambda o: o.price_hr, default=None)
    return f"{len(got)} offer(s)" + (f", from ${cheapest.price_hr:.3f}/hr ({cheapest.gpu_name})" if cheapest else "")


def _ssh_key(provider) -> str:
    key, public = config.ssh_key()
    note = provider.account_key(public)
    return f"orch's key {key} ({public.split()[0]}): {note}"


def _target(provider) -> Request:
    """The cheapest thing that has SSH: a CPU instance where the provider has them, else the
    cheapest offer."""
    name = f"check-{secrets.token_hex(3)}"
    if provider.capabilities.cpu_only:
        return Request(name=name, cpu=True, disk_gb=10)
    offers = [o for o in (provider.offers(Request(name=name, gpus=1, disk_gb=10)) or []) if o.price_hr is not None]
    if not offers:
        raise OrchError("no offer to rent")
    best = min(offers, key=lambda o: o.price_hr)
    return Request(name=name, gpu=best.gpu_name, gpus=best.gpus, offer=best.offer_id, disk_gb=10)


def _live(orch, provider, report: Report, step, end: float) -> None:
    from orchestrator.money import cost
    from orchestrator.money.policy import Policy
    from playbooks import host

    holder: dict = {}

    def remaining() -> float:
        return max(end - time.monotonic(), 1.0)

    def rent():
        request = _target(provider)
        holder["name"] = request.name
        # Destroyed by its watchdog (or the reaper) after 5 idle minutes should this check die midway.
        policy = Policy(idle_minutes=5, on_idle="destroy").to_json()
        inst = orch.up(request.name, provider.name, request, ssh_timeout=remaining(), policy=policy, prepare=None)
        holder["inst"] = inst
        report.instance = inst.name
        return f"{inst.provider_id} at {inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port}, ${inst.price_hr:.4f}/hr"

    def detached():
        inst = orch.ledger.get(holder["inst"].id)
        with orch.connect(inst) as c:
            pid = host.detach(c, ["sleep", "3600"], "/dev/null")
        with orch.connect(inst) as c:  # a new session: the first one has ended
            from orchestrator.ssh import remote

            alive = remote.run(c, f"kill -0 {pid} 2>/dev/null && echo alive", check=False).strip()
            remote.run(c, f"kill {pid}", check=False)
        if alive != "alive":
            raise OrchError(f"the detached process (pid {pid}) did not outlive its SSH session")
        return f"pid {pid} outlived its SSH session"

    def stop():
        inst = orch.stop(orch.ledger.get(holder["inst"].id), reason="stopped by `orch check`")
        return f"stopped; its disk bills ${inst.stopped_price_hr:.4f}/hr"

    def start():
        inst = orch.start(orch.ledger.get(holder["inst"].id), reason="started by `orch check`",
                          timeout=min(remaining(), 600))
        return f"running again at {inst.ssh_host}:{inst.ssh_port}, reached over SSH"

    def down():
        inst = orch.ledger.get(holder["row"])
        first = None
        try:
            orch.down(inst, "destroyed by `orch check`")
        except Exception as e:  # noqa: BLE001 - a destroy is idempotent: once more before leaving it billing
            first = e
            try:
                orch.down(orch.ledger.get(inst.id), "destroyed by `orch check` (second try)")
            except Exception as second:  # noqa: BLE001
                raise OrchError(f"the destroy failed twice ({_why(e)}; then {_why(second)}): it may still bill, "
                                f"see `orch status {inst.name}`") from None
        inst = orch.ledger.get(inst.id)
        if inst.provider_id and provider.get(inst.provider_id).status.value != "gone":
            raise OrchError(f"{provider.name} still shows {inst.provider_id}")
        if first is not None:
            # The outcome first: the first failure's reason can be long, and a reason is cut at 300 characters.
            raise OrchError(f"a second try destroyed it, confirmed gone; the first destroy failed ({_why(first)})")
        return "destroyed, confirmed gone"

    try:
        if step("rent", rent) and step("detach", detached):
            if can_stop(provider, False) and step("stop", stop):
                step("start", start)
    finally:
        inst = orch.ledger.get(holder["inst"].id) if "inst" in holder else (
            orch.ledger.by_name(holder["name"], live_only=False) if "name" in holder else None)
        if inst is not None and inst.state not in states.TERMINAL:
            holder["row"] = inst.id
            step("down", down, cleanup=True)
        elif inst is None and "name" in holder:
            report.steps.append(Step("down", True, 0.0, "nothing was rented"))
        if inst is not None:
            inst = orch.ledger.get(inst.id)
            report.spent_usd = round(cost.instance_cost(inst, orch.ledger.events(inst.id), []).total_usd, 6)
