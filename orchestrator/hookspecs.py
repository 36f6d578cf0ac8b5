"""The whole plugin surface: providers register classes, and anyone may listen to events."""

import pluggy

hookspec = pluggy.HookspecMarker("orch")
hookimpl = pluggy.HookimplMarker("orch")


@hookspec
def register_providers(register):
    """Call ``register(ProviderClass)`` for each provider this plugin offers."""


@hookspec
def instance_event(instance, event):
    """Broadcast after each lifecycle transition (``event`` has from/to state, reason, actor)."""
