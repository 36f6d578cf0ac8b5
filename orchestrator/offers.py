"""Offers across providers (being written)."""


def pick_cheapest(orch, request, spec, providers=None):
    from orchestrator.errors import UsageError

    raise UsageError("--cheapest is not available yet")
