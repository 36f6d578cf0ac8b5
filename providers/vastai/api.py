"""Calling Vast.ai through its ``vastai`` SDK: one session, and every failure in orch's words.

The SDK is imported here only when a verb runs. What a failure says is Vast's own (its
``error`` code, its ``msg``); whether it is worth another try is ``orchestrator.provider.http``'s
verdict, the same as every provider's.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from orchestrator.errors import AuthError, ProviderError
from orchestrator.provider import http

# A Retry-After longer than this (a search quota resets at midnight UTC) is not waited out.
MAX_WAIT = 30.0
# The SDK's own timeout (vastai/api/client.py _DEFAULT_TIMEOUT_SECONDS), "conservative enough for
# slow operations like ... instance creation": a create cut short at 30 s may still have rented.
CREATE_TIMEOUT = 120.0
# Where the SDK looks for its key when none is given (vastai/_base.py; XDG_CONFIG_HOME unset).
KEY_FILES = ("~/.config/vastai/vast_api_key", "~/.vast_api_key")


class VastError(ProviderError):
    """A refusal from Vast, with its machine-readable ``error`` code when it gave one."""

    def __init__(self, message: str, code: str | None = None, status: int | None = None, answer: dict | None = None):
        super().__init__(message)
        self.code, self.status, self.answer = code, status, answer or {}


def has_key(settings: dict) -> bool:
    """Whether a key is there: the environment, config.toml, or the SDK's own key files (checked
    without importing the SDK)."""
    return bool(os.environ.get("VAST_API_KEY") or settings.get("api_key")
                or any(os.path.exists(os.path.expanduser(p)) for p in KEY_FILES))


def connect(settings: dict, timeout: float):
    """The SDK's client, one attempt per call (``retry=1``: its retries never multiply with ours)."""
    from vastai import VastAI

    key = os.environ.get("VAST_API_KEY") or settings.get("api_key") or None  # env beats config.toml
    # The SDK reads VAST_URL once, at import: pass it so import order does not matter.
    url = settings.get("server_url") or os.environ.get("VAST_URL") or None
    try:
        sdk = VastAI(api_key=key, server_url=url, retry=1, raw=True, quiet=True)
    except RuntimeError:
        raise AuthError("no Vast.ai API key: set api_key under [providers.vastai] in config.toml, "
                        "or VAST_API_KEY, or run `vastai set api-key`") from None
    sdk.client.timeout = timeout
    return sdk


def once(sdk, fn: Callable[[], Any], what: str) -> Any:
    """One SDK call, its failures turned into orch's errors and ``success: false`` checked."""
    import requests

    try:
        answer = fn()
    except requests.HTTPError as e:
        raise http_error(e.response, what) from None
    except (requests.ConnectionError, requests.Timeout) as e:
        raise http.Transient(f"cannot reach Vast.ai at {sdk.client.server_url} ({what}): {e}") from None
    except (requests.JSONDecodeError, KeyError) as e:  # the SDK indexes answers without looking
        raise VastError(f"Vast.ai answered {what} with something unexpected ({e!r})") from None
    # Failures arrive as HTTP 200 with ``success: false`` (the SDK checks it itself:
    # vastai/async_/client.py ``create_instance``): every answer is checked here.
    if isinstance(answer, dict) and answer.get("success") is False:
        code, msg = answer.get("error"), answer.get("msg") or answer.get("message")
        raise VastError(f"Vast.ai refused {what}: {msg or code or answer}", code=code, answer=answer)
    return answer


def call(sdk, fn: Callable[[], Any], what: str, attempts: int) -> Any:
    """``once``, tried again while it fails transiently (at most ``attempts`` times in all)."""
    return http.call(lambda: once(sdk, fn, what), attempts=attempts, cap=MAX_WAIT)


def slow(sdk, fn: Callable[[], Any], what: str, timeout: float) -> Any:
    """One call that may take long at Vast (a create), under its own ``timeout``; never re-sent."""
    before = sdk.client.timeout
    sdk.client.timeout = timeout
    try:
        return once(sdk, fn, what)
    finally:
        sdk.client.timeout = before


def http_error(r, what: str) -> ProviderError:
    """An HTTP error answer in Vast's words, decided by ``http.verdict``: a 429 that asks for
    longer than ``MAX_WAIT``, or a search quota without Retry-After, is given up, not hammered."""
    status = r.status_code
    try:
        body = r.json()
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    code = body.get("error")
    detail = body.get("msg") or body.get("message") or code or r.text.strip()[:200]
    verdict = http.verdict(status, r.headers.get("Retry-After"), cap=MAX_WAIT)
    if verdict.action == http.AUTH:
        return AuthError(f"Vast.ai rejected the API key ({what}: HTTP {status}: {detail}); check api_key "
                         f"under [providers.vastai] or VAST_API_KEY")
    if status == 429 and (verdict.action == http.LATER or (code == "search_quota_exceeded" and verdict.wait < 0)):
        return VastError(f"Vast.ai rate limit on {what} ({detail}); try again later", code=code, status=429)
    if status == 429:
        return http.Transient(f"Vast.ai rate limit on {what} (HTTP 429: {detail})", wait=verdict.wait, code=code,
                              status=429)
    if verdict.action == http.RETRY:
        return http.Transient(f"Vast.ai server error on {what} (HTTP {status}: {detail})", code=code,
                              status=status, answer=body)
    return VastError(f"Vast.ai refused {what} (HTTP {status}: {detail})", code=code, status=status, answer=body)
