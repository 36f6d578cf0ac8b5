"""What `orch run`, `orch exec` and `orch schedule add` share at the command line: the options they
declare alike, the flags as ``jobs.request.Flags`` (which the user typed, from Typer's context), and
a dry run's printing. The request itself is built in the core (``jobs.request.build``).
"""

from __future__ import annotations

from orchestrator.cli.app import out
from orchestrator.text import clean

OFFERS_SHOWN = 10


def typed(ctx) -> frozenset:
    """The parameters the user typed (or set in the environment) of this invocation: a flag typed
    wins over the task file, a default does not."""
    return frozenset(name for name in ctx.params
                     if getattr(ctx.get_parameter_source(name), "name", None) in ("COMMANDLINE", "ENVIRONMENT"))


def up_defaults() -> dict:
    """Every option of `orch up` at its default: a request with no flag typed (`orch schedule add`:
    the task file says it all)."""
    import inspect

    from orchestrator.cli import instances

    skip = ("name", "provider", "max_hours", "wait", "as_json")  # a job reads these its own way
    return {n: getattr(p.default, "default", p.default) for n, p in inspect.signature(instances.up).parameters.items()
            if n not in skip}


def workdir_max_mb_option():
    """``--workdir-max-mb``, as `orch run`, `orch exec` and `orch schedule add` take it."""
    import typer

    return typer.Option(None, "--workdir-max-mb", help="The cap on what the workdir sends, in MB (default 200; a task "
                                                       "file may lower it, not raise it).")


def allow_secret_option():
    """``--allow-secret``, as `orch run`, `orch exec` and `orch schedule add` take it."""
    import typer

    return typer.Option(None, "--allow-secret", help="NAME of one of orch's own credentials (a provider's key, "
                                                     "HF_TOKEN) handed to the command as a secret, on purpose "
                                                     "(repeatable).")


def print_plan(sub, choice) -> None:
    """A dry run: what would run where, at what cost, and the offers the plan chose from."""
    js = sub.spec
    nodes = js.nodes
    _head(sub)
    out(f"  plan     {clean(choice.line, 300)}")
    if nodes > 1:
        out(f"  nodes    {nodes}, rented together (all or nothing) on {choice.provider}; each gets ORCH_NODE_RANK, "
            f"ORCH_NUM_NODES={nodes}, ORCH_NODE_IPS, ORCH_MASTER_ADDR, ORCH_MASTER_PORT, ORCH_GPUS_PER_NODE; "
            "a lost node is replaced alone")
        dropped = _cannot_group(js.providers)
        if dropped:
            out(f"  nodes    not asked, as they rent no group: {', '.join(dropped)}")
    _volumes(js)
    _offers(js, choice)
    out("  dry run: nothing rented, nothing recorded")


def _cannot_group(asked) -> list[str]:
    """The providers a group job left out where none was named (``jobs.request.group_providers`` asks
    every one that rents groups): those that rent none. Nothing where the job names its own."""
    from orchestrator.jobs.request import renter
    from orchestrator.provider import RentsGroups

    known = sorted(_provider_names())
    able = [p for p in known if isinstance(renter(p), RentsGroups)]
    if not set(able) <= set(asked or []):
        return []
    return [p for p in known if p not in able]


def _volumes(js) -> None:
    """Which volume each path mounts, and where ``HF_HOME`` goes (``volume_mounts.env``: the first
    volume's ``hf``, unless the task sets its own)."""
    from orchestrator.volumes.volume_mounts import HF_DIR
    from orchestrator.volumes.volume_uses import Use

    uses = [Use.from_dict(u) for u in js.volumes or []]
    if not uses:
        return
    def names(use) -> str:
        return ", ".join(use.volume(r) for r in range(js.nodes)) if use.per_node else use.name

    for use in uses:
        out(f"  volume   {names(use)} at {use.path}" + (", one per node (node R mounts its own)" if use.per_node else ""))
    work = js.work
    if "HF_HOME" not in (getattr(work, "env", None) or {}) and "HF_HOME" not in (getattr(work, "secrets", None) or []):
        out(f"  HF_HOME  {uses[0].path}/{HF_DIR}: the hub's downloads stay on the volume ({names(uses[0])})")


def _vram(low: float | None, high: float | None) -> str:
    if low and high:
        return f" with {low:g} GB each" if low == high else f" with {low:g} to {high:g} GB each"
    return f" with at least {low:g} GB each" if low else f" with at most {high:g} GB each" if high else ""


def _head(sub) -> None:
    """What the task is: its machines, what it runs, its caps."""
    js = sub.spec
    req = js.request
    what = "CPU only" if req.cpu else f"{req.gpus}x {req.gpu or 'any GPU'}" + _vram(js.min_vram, js.max_vram)
    out(f"task {sub.name}: {js.nodes} node(s), {what}" + (", spot" if req.spot else "")
        + (f", disk {req.disk_gb} GB" if sub.disk_given else ""))
    for line in js.kind_of().plan_lines(sub.name):
        out(line)
    caps = [f"max_cost ${sub.max_cost:g}" if sub.max_cost is not None else None,
            f"max_hours {sub.max_hours:g}" if sub.max_hours else None, f"retries {sub.retries}"]
    out(f"  caps     {', '.join(c for c in caps if c)}")


def print_list_prices(sub) -> bool:
    """A dry run that could ask no provider for offers, for want of a key here: the task, then the
    list prices orch ships for what it asks (``catalogue``), each marked "list price, DATE, not
    live". False where that is not so (a provider with a key answered, or the catalogue lists
    nothing of the kind): the plan's own refusal stands."""
    from orchestrator.money import catalogue
    from orchestrator.jobs.request import renter

    js = sub.spec
    req = js.request
    if req.cpu or req.offer:
        return False
    unkeyed = []
    for name in js.providers or sorted(_provider_names()):
        provider = renter(name)
        if provider.missing_credentials():
            unkeyed.append(name)
        elif not provider.embedded:  # a provider with a key was asked: its answer stands
            return False
    date, _ = catalogue.load()
    rows = catalogue.matching(req.gpu, req.gpus, js.min_vram, unkeyed, js.max_vram)
    if not unkeyed or not rows:
        return False
    _head(sub)
    dropped = _cannot_group(js.providers) if js.nodes > 1 else []
    if dropped:
        out(f"  nodes    not asked, as they rent no group: {', '.join(dropped)}")
    out(f"  plan     no live offer: no key here for {', '.join(unkeyed)} (`orch check` says what each needs); "
        "a launch asks the providers live")
    per = f"per hour for {js.nodes} nodes" if js.nodes > 1 else "per hour"
    out(f"list prices from orch's catalogue (on-demand, {per}; {catalogue.label(date)})"
        + (": spot prices move and are not listed" if req.spot else "") + ", cheapest first:")
    for i, row in enumerate(rows[:OFFERS_SHOWN], 1):
        out(f"  {i:2d}. {row.provider}: {row.gpus}x {row.gpu} {row.vram_gb:g} GB ({row.offer}), "
            f"${row.usd_hr * js.nodes:.2f}/hr, {catalogue.label(date)}")
    for source in dict.fromkeys(row.source for row in rows[:OFFERS_SHOWN]):
        out(f"  source   {source}")
    out("  dry run: nothing rented, nothing recorded")
    return True


def _provider_names() -> list[str]:
    from orchestrator.provider import plugins

    return list(plugins.providers())


def _offers(js, choice) -> None:
    """The ranked offers the plan chose from, from its own listing (a CPU job or --offer ranks none)."""
    from orchestrator.money import offers

    req = js.request
    if req.cpu or req.offer or choice.answer is None:
        out(f"offers: nothing to rank ({'a CPU-only instance' if req.cpu else 'an offer given'} on {choice.provider})")
        return
    mode = "spot" if req.spot else "on-demand"
    rows = choice.answer.rows
    per = "per job" if rows and rows[0].epochs else "per hour"
    out(f"offers ({mode}, {per}), best first:")
    for i, row in enumerate(rows[:OFFERS_SHOWN], 1):
        out(f"  {i:2d}. {offers.describe(row, mode)}")
    if len(rows) > OFFERS_SHOWN:
        out(f"  ... and {len(rows) - OFFERS_SHOWN} more (`orch offers`)")
