"""Plugin manager: built-in and third-party providers arrive through one entry-point group."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import pluggy

from orchestrator import hookspecs
from orchestrator.errors import UsageError

ENTRY_POINT_GROUP = "orch.providers"

_pm: pluggy.PluginManager | None = None


def manager() -> pluggy.PluginManager:
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("orch")
        pm.add_hookspecs(hookspecs)
        from orchestrator import notify, sshconfig

        for builtin in (sshconfig, notify):  # built-in listeners of instance_event
            pm.register(builtin, name=f"orch.{builtin.__name__.rsplit('.', 1)[-1]}")
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
    return found


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


def broadcast(instance, event) -> None:
    manager().hook.instance_event(instance=instance, event=event)
