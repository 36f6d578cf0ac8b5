"""RunPod's GraphQL endpoint, through the runpod SDK's one GraphQL call, and its errors in orch's words.

Every query is written here, never by the SDK: its own ``create_pod`` pastes strings into its query
unescaped (a ``"`` in an env value breaks it; RunPod's GraphQL takes no variables through
``run_graphql_query``), so values go in as ``literal``s. The call honours ``RUNPOD_API_BASE_URL``.
The SDK is imported only when a call is made (``_sdk``): ``orch --help`` never pays its import.
Which failure is worth another try is ``orchestrator.provider.http``'s ``Transient``; RunPod's
own texts say which one it is, since the SDK keeps the HTTP status to itself (an HTML 429 or 502
reaches us as a JSON decoding error).
"""

from __future__ import annotations

import json
import os
from typing import Any

from orchestrator.errors import AuthError, NoCapacity, ProviderError
from orchestrator.provider import http

NO_CAPACITY = ("no longer any instances available", "not enough free gpus", "no instances available")
# Answers from a request RunPod processed: the pod may exist though the answer is an error.
MAYBE_MADE = ("something went wrong", "internal server error")
TRANSIENT = ("too many requests", "rate limit", "timed out", "try again later")


class MaybeMade(http.Transient):
    """RunPod processed the request and answered an error: a create may have made the pod."""


class GraphQLEnum(str):
    """A GraphQL enum value: written bare, not quoted."""


def literal(value: Any) -> str:
    """A GraphQL literal. ``json.dumps`` of a str is a valid, fully escaped GraphQL string."""
    if isinstance(value, GraphQLEnum):
        return str(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise TypeError(f"no GraphQL literal for {type(value).__name__}")


class GraphQL:
    """One RunPod account's GraphQL session: ``once`` (one POST) and ``query`` (bounded retries,
    for what is safe to repeat). The key is read at every call: the environment's beats
    ``api_key`` in config.toml, which beats the SDK's own credentials file."""

    def __init__(self, api_key: str | None = None, attempts: int = 5, base: float = 0.5):
        self.api_key, self.attempts, self.base = api_key, attempts, base

    def key(self, runpod) -> str:
        key = os.environ.get("RUNPOD_API_KEY") or self.api_key
        if not key:
            key = (runpod.get_credentials(runpod.profile) or {}).get("api_key")
        if not key:
            raise AuthError("no RunPod API key: set api_key under [providers.runpod] in orch's config, "
                            "or export RUNPOD_API_KEY, or run `runpod config`")
        return key

    def once(self, query: str) -> dict:
        """One POST; the whole answer. SDK exceptions become orch's errors; retryable ones are
        ``http.Transient`` (``MaybeMade`` where RunPod may have done it all the same)."""
        import requests

        runpod = _sdk()
        from runpod import error as rp_error
        from runpod.api.graphql import run_graphql_query

        key = self.key(runpod)
        try:
            return run_graphql_query(query, api_key=key)
        except rp_error.AuthenticationError:
            raise AuthError("RunPod rejected the API key (401 Unauthorized): check api_key under "
                            "[providers.runpod] or RUNPOD_API_KEY") from None
        except rp_error.QueryError as e:
            raise answered(str(e)) from None
        except ValueError as e:  # an HTML body (429, 502) fails JSON decoding inside the SDK
            raise http.Transient(f"RunPod API answered something that is not JSON (rate limit or "
                                 f"outage?): {e}") from None
        except requests.ReadTimeout as e:  # sent, maybe processed: like an error answer
            raise MaybeMade(f"RunPod API did not answer in time: {e}") from None
        except requests.RequestException as e:
            raise http.Transient(f"RunPod API unreachable: {e}") from None

    def query(self, query: str) -> dict:
        """The answer's ``data``, after bounded retries: for calls that are safe to repeat."""
        return http.call(lambda: self.once(query), attempts=self.attempts, base=self.base)["data"]


def answered(message: str) -> ProviderError:
    """The error for a GraphQL error RunPod answered, by its text."""
    low = message.lower()
    if any(s in low for s in NO_CAPACITY):
        return NoCapacity(f"RunPod has no capacity for this request: {message}")
    if any(s in low for s in MAYBE_MADE):
        return MaybeMade(f"RunPod API error: {message}")
    if any(s in low for s in TRANSIENT):
        return http.Transient(f"RunPod API error: {message}")
    return ProviderError(f"RunPod API error: {message}")


def _sdk():
    """``import runpod`` without its serverless worker's CPU probe. Importing the package runs
    runpod/serverless/utils/rp_debugger.py, whose module-level ``cpuinfo.get_cpu_info()`` starts a
    Python subprocess: about a second of CPU on every orch command that talks to RunPod. orch uses
    only the GraphQL client and never reads that CPU brand (it labels serverless debug logs), so
    the probe answers with ``platform.machine()`` while the package imports, and the real py-cpuinfo stays
    importable afterwards."""
    import logging
    import sys

    if "runpod" in sys.modules:
        import runpod

        return runpod
    # runpod/serverless/utils/rp_upload.py also calls logging.basicConfig(level=INFO) at import: from
    # then on every library's INFO records (Alembic's migration steps, say) were printed on orch's
    # stderr, around the one line an error gets. orch configures no logging, so the root logger is
    # put back as it was.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    shim = None
    if "cpuinfo" not in sys.modules:
        import platform
        import types

        shim = types.ModuleType("cpuinfo")
        shim.get_cpu_info = lambda: {"brand_raw": platform.machine()}  # os.uname: no subprocess
        sys.modules["cpuinfo"] = shim
    try:
        import runpod
    finally:
        if shim is not None:
            del sys.modules["cpuinfo"]
        root.handlers[:] = handlers
        root.setLevel(level)
    return runpod
