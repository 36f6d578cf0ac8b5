"""The account's SSH keys: a launch names exactly one key the account holds (Lambda's OpenAPI
description, InstanceLaunchRequest ``ssh_key_names``), so orch's key is added once, named after its
fingerprint."""

from __future__ import annotations

from orchestrator.errors import ProviderError
from orchestrator.provider import key_name
from providers.lambda_cloud.api import LambdaError, Session


def key_blob(public_key: str) -> str:
    """'ssh-ed25519 AAAA...' of a public key line, without its comment: what identifies the key."""
    return " ".join(public_key.split()[:2])


def _listed(api: Session) -> list[dict]:
    keys = api.call("GET", "/ssh-keys")
    if not isinstance(keys, list):
        raise LambdaError(f"Lambda Cloud's SSH key listing came back without keys: {str(keys)[:200]}")
    return [k for k in keys if isinstance(k, dict)]


def held(api: Session, public_key: str) -> str | None:
    """The name under which the account holds orch's key; None when it does not. A key of orch's
    name that is another key is refused: launching with it would lock orch out."""
    mine, name = key_blob(public_key), key_name(public_key)
    keys = _listed(api)
    for k in keys:
        if key_blob(str(k.get("public_key") or "")) == mine:
            return str(k.get("name"))
    if any(k.get("name") == name for k in keys):
        raise ProviderError(f"the Lambda account holds an SSH key named {name!r} that is not orch's key: "
                            "delete or rename it in the Lambda console")
    return None


def ensure(api: Session, public_key: str) -> str:
    """The name of orch's key in the account, added first where the account lacks it."""
    found = held(api, public_key)
    if found:
        return found
    name = key_name(public_key)
    added = api.call("POST", "/ssh-keys", {"name": name, "public_key": key_blob(public_key)})
    if not isinstance(added, dict) or added.get("name") != name:
        raise LambdaError(f"Lambda Cloud did not confirm orch's SSH key {name}: {str(added)[:200]}")
    return name
