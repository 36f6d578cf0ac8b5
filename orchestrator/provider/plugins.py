"""Plugin manager: built-in and third-party providers arrive through one entry-point group."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import pluggy

from orchestrator import hookspecs
from orchestrator.errors import UsageError

ENTRY_POINT_GROUP = "orch.providers"

_pm: pluggy.PluginManager | None = None
_listeners: dict[str, object] = {}  # orch's own listeners, registered with the manager when it is made


def manager() -> pluggy.PluginManager:
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("orch")
        pm.add_hookspecs(hookspecs)
        for name, module in _listeners.items():
            pm.register(module, name=name)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if pm.get_plugin(ep.name) is not None:
                continue
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as e:  # one broken plugin must not take the CLI down with it
                print(f"orch: plugin {ep.name!r} failed to load: {e}", file=sys.stderr)
        _pm = pm
    return _pm


def providers() -> dict[str, type]:
    found: dict[str, type] = {}

    def register(cls):
        found[cls.name] = cls

    manager().hook.register_providers(register=register)
    _check_sections(found)
    return found


def _check_sections(found: dict[str, type]) -> None:
    """A ``[providers.NAME]`` of config.toml that names no provider is a typo (``[providers.lcoal]``):
    its settings would be read by nobody (a price of $0 where one was set). Refused by name with the
    provider meant; a plugin installed but broken keeps its section."""
    from orchestrator import config
    from orchestrator.text import nearest

    for name in config.load().get("providers", {}):
        if name in found:
            continue
        known = {*found, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))}
        if name not in known:
            raise UsageError(f"{config.home() / 'config.toml'}: unknown provider {name!r} in [providers.{name}]"
                             + (nearest(name, known) or f" (known: {', '.join(sorted(found))})"))


def provider_class(name: str) -> type:
    known = providers()
    if name not in known:
        raise UsageError(f"unknown provider {name!r} (known: {', '.join(sorted(known))})")
    return known[name]


def embedded() -> str:
    """The provider that needs no account and no network (it declares ``embedded``): the demo's,
    and the default where config.toml names none."""
    found = sorted(name for name, cls in providers().items() if getattr(cls, "embedded", False))
    if not found:
        raise UsageError("no embedded provider is installed: name one with --provider")
    return found[0]


def default_provider() -> str:
    from orchestrator import config

    name = config.get("default_provider")
    return embedded() if name is None else name  # a name given, even a wrong one, is checked where it is used


def listen(module) -> None:
    """Register one of orch's own listeners of ``instance_event`` (once): whoever opens orch for a
    command (``lifecycle.Orch.open``) says which, so this registry names no module above it. The
    plugins are not looked up for it: a command that never needs them never pays for them."""
    name = f"orch.{module.__name__.rsplit('.', 1)[-1]}"
    _listeners.setdefault(name, module)
    if _pm is not None and _pm.get_plugin(name) is None:
        _pm.register(module, name=name)


def broadcast(instance, event) -> None:
    manager().hook.instance_event(instance=instance, event=event)
