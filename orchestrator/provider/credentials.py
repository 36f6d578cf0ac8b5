"""orch's own credentials: the names a job's secret may not take unless a person says so.

A secret (``secrets:``, SkyPilot's ``secrets:``/``envs`` without a value, dstack's ``env: [NAME]``)
is read from the environment of the orch process that launches the job and put in the rented
machine's environment, where whoever owns a marketplace host reads it. A task file downloaded from
elsewhere, or a row a teammate wrote into a shared ledger, must not turn that into a copy of the
keys orch itself rents with: every provider's ``env_keys`` (as each plugin declares them), the
``ORCH_`` variables (orch's home, its database URL), and the Hugging Face token orch hands itself
only to what talks to the hub (``training.HUB_ENV``). Handing one to a job is said on the command
line, name by name (``--allow-secret NAME``), and kept at home, never in the ledger
(``jobs.submit``, ``schedule_secrets``).
"""

from __future__ import annotations

from orchestrator.errors import UsageError
from orchestrator.text import nearest

PREFIX = "ORCH_"
HUB = {"HF_TOKEN": "the Hugging Face token orch passes itself, only to a hub download or a --push-to training"}


def own() -> dict[str, str]:
    """Each of orch's own credential names (but the ``ORCH_`` ones) -> what it is."""
    from orchestrator.provider import plugins

    found: dict[str, str] = {}
    for name, cls in sorted(plugins.providers().items()):
        for key in getattr(cls, "env_keys", ()):
            found.setdefault(key, f"one of the {name} provider's own settings (orch rents with it)")
    found.update(HUB)
    return found


def why(name: str) -> str | None:
    """What ``name`` is to orch, where it is one of its own credentials; None for any other name."""
    if name.startswith(PREFIX):
        return "an ORCH_ variable, orch's own (its home, its database URL)"
    return own().get(name)


def refuse(name: str, allowed, where: str) -> None:
    """Refused in one line when ``name`` is one of orch's own and not in ``allowed`` (the names a
    person gave with ``--allow-secret``); an ``ORCH_`` name is never a secret."""
    what = why(name)
    if what is None or (name in allowed and not name.startswith(PREFIX)):
        return
    hint = "" if name.startswith(PREFIX) else \
        f"; to hand it to the job on purpose, say so on the command line: --allow-secret {name}"
    raise UsageError(f"{where}: secret {name} is {what}: a task file or a stored job never sends it to a rented "
                     f"machine, where its owner can read it{hint}")


def allowed(name: str, command: str) -> None:
    """``--allow-secret NAME`` of ``command`` refused unless NAME is one of orch's own credentials
    that may be handed over (not an ``ORCH_`` variable): the flag says "this key, on purpose"; a
    name it does not know is a typo of one, or a secret of the user's own, which ``--secret`` (or a
    task file's ``secrets:``) gives, and acting as that would hide the typo."""
    if name.startswith(PREFIX):
        raise UsageError(f"{command}: --allow-secret {name}: an ORCH_ variable is orch's own (its home, its "
                         "database URL) and never a job's secret")
    known = own()
    if name not in known:
        own_way = "--secret NAME or secrets: in the task file" if command != "orch schedule add" else \
            "secrets: in the task file"
        raise UsageError(f"{command}: --allow-secret {name}: not one of orch's own credentials{nearest(name, known)}; "
                         f"--allow-secret hands one of those (a provider's key, HF_TOKEN) to a job on purpose, a "
                         f"secret of your own is given with {own_way}")


def stored(names, allowed, where: str) -> None:
    """A stored job's or schedule's secrets (a shared ledger is input too), each held to ``refuse``
    against the names allowed at home (``allowed``)."""
    for name in names:
        if isinstance(name, str):
            refuse(name, allowed, where)
