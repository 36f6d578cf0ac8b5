"""Lambda's REST API v1 over plain HTTPS, with the standard library (Lambda publishes no Python SDK).

What Lambda is comes from its published OpenAPI description (https://cloud.lambda.ai/api/v1/openapi.json,
v1.10.0). Every answer is ``{"data": ...}`` or ``{"error": {"code", "message", "suggestion"}}``; only
the ``code`` is meant for programs (the description says so, "Response types"), so only codes are
read. Whether a failure is worth another try is ``orchestrator.provider.http``'s verdict; what the
user reads is Lambda's own words.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Callable

from orchestrator.errors import AuthError, ProviderError
from orchestrator.provider import http
from orchestrator.provider.http import Transient

DEFAULT_BASE_URL = "https://cloud.lambda.ai/api/v1"
NO_CAPACITY = "instance-operations/launch/insufficient-capacity"
NOT_FOUND = "global/object-does-not-exist"
# The launch's 403s are the account's, not the key's (Lambda's OpenAPI description, launchInstance 403:
# ApiErrorAccountInactive, ApiErrorInvalidBillingAddress): each is named, with what fixes it (the
# description's own suggestions).
ACCOUNT_REFUSALS = {
    "global/account-inactive": "the Lambda account is inactive: verify its email address and add a valid payment "
                               "method in the Lambda console (Settings, Billing)",
    "global/invalid-address": "the Lambda account's billing address is invalid: correct it in the Lambda console "
                              "(Settings, Billing)",
}
# The account's instance quota (Lambda's OpenAPI description, launchInstance 400 ApiErrorQuotaExceeded:
# "Quota exceeded.", "Contact Support to increase your quota."; Lambda docs, "Creating and managing
# instances": "New accounts have a limit on the number of instances you can launch ... increases
# automatically as you pay your invoices"): the account's limit, not the cloud's stock, so no capacity error.
QUOTA_EXCEEDED = "global/quota-exceeded"
MAX_WAIT = 60.0  # a Retry-After longer than this is not waited out
LAUNCH_LOOKUP_SECONDS = 60.0  # how long a launch whose answer was lost is looked for (by its name)
# Lambda's rate limit on launches: "one request per 12 seconds, or five requests per minute" (the OpenAPI
# description). One orch process spaces its own launches so; a 429 (another process's) is waited out.
LAUNCH_INTERVAL = 12.0
_LAUNCHES = threading.Lock()
_last_launch = [float("-inf")]  # when this process's last launch was answered (monotonic)


class LambdaError(ProviderError):
    """A refusal from Lambda, with its error ``code`` where it gave one."""

    def __init__(self, message: str, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


class QuotaExceeded(LambdaError):
    """The account's instance quota, not Lambda's stock: raising it is the user's step."""


class LostLaunch(Exception):
    """A launch whose answer was lost (a 5xx, a dropped connection): it may have happened. A launch
    has no idempotency token, so the caller looks for what it made, and never launches blind again."""

    def __init__(self, offer, region: str, error: Exception):
        super().__init__(str(error))
        self.offer, self.region, self.error = offer, region, error


# What a call to Lambda raises, short of a refused key: a refusal, or a failure worth another try
# (429, 5xx, a dropped connection). Both carry ``code`` and ``status``.
ERRORS = (LambdaError, Transient)


def api_key(settings: dict) -> str | None:
    """The API key: ``LAMBDA_API_KEY`` beats ``api_key`` in config.toml."""
    return os.environ.get("LAMBDA_API_KEY") or settings.get("api_key") or None


def lambda_id(provider_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,100}", str(provider_id)):
        raise ProviderError(f"{provider_id!r} is not a Lambda Cloud instance id")
    return str(provider_id)


class Session:
    """Lambda's API as one provider's settings reach it: its address, its key, its timeout, its retries."""

    def __init__(self, settings: dict, number: Callable[[str, float], float]):
        self.settings, self.number = settings, number

    @property
    def base_url(self) -> str:
        url = self.settings.get("base_url") or os.environ.get("LAMBDA_API_BASE_URL") or DEFAULT_BASE_URL
        return str(url).rstrip("/")

    def _key(self) -> str:
        key = api_key(self.settings)
        if not key:
            raise AuthError("no Lambda Cloud API key: set api_key under [providers.lambda] in config.toml, "
                            "or LAMBDA_API_KEY")
        return str(key)

    def once(self, method: str, path: str, body: dict | None = None) -> Any:
        """One request (a launch is sent only so); Lambda's errors become orch's, 429/5xx/network ones
        ``Transient``."""
        import urllib.error
        import urllib.request

        what = f"{method} {path}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self._key()}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.number("http_timeout", 30)) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise _http_error(e, what) from None
        except (OSError, ValueError) as e:  # refused, reset, timed out, a bad URL
            raise Transient(f"cannot reach Lambda Cloud at {self.base_url} ({what}): {e}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise LambdaError(f"Lambda Cloud answered {what} with something that is not JSON: {raw[:200]!r}") from None
        if not isinstance(answer, dict) or "data" not in answer:
            raise LambdaError(f"Lambda Cloud answered {what} without data: {str(answer)[:200]}")
        return answer["data"]

    def call(self, method: str, path: str, body: dict | None = None) -> Any:
        """A request that is safe to repeat (anything but a launch), with bounded retries."""
        return http.call(lambda: self.once(method, path, body), attempts=int(self.number("retries", 5)), cap=MAX_WAIT)

    def launch(self, body: dict) -> Any:
        """``POST /instance-operations/launch`` within Lambda's rate limit: this process's launches are
        spaced ``launch_interval`` apart, and a 429 is waited out (its Retry-After, else a backoff from
        ``launch_interval``) and sent again: the limiter refused it, so nothing was made. Any other
        failure is raised as it is (a 5xx may hide a launch that happened: the caller looks)."""
        interval = self.number("launch_interval", LAUNCH_INTERVAL)

        def once() -> Any:
            # One launch at a time, spaced from when the last one was answered: Lambda counts from
            # when each reached it, which is before its answer (and may be long after it was sent).
            with _LAUNCHES:
                wait = _last_launch[0] + interval - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    return self.once("POST", "/instance-operations/launch", body)
                finally:
                    _last_launch[0] = time.monotonic()

        return http.call(once, attempts=int(self.number("retries", 5)), base=interval if interval > 0 else 0.5,
                         cap=MAX_WAIT, retryable=lambda e: isinstance(e, Transient) and e.status == 429)


def _http_error(e, what: str) -> ProviderError:
    """Orch's error for Lambda's HTTP error ``e``: Lambda's words (its code and message, the launch's
    two account refusals named), the decision ``http.verdict``'s."""
    status = e.code
    try:
        body = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        body = {}
    error = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = str(error.get("message") or code or e.reason or "")[:200]
    verdict = http.verdict(status, e.headers.get("Retry-After") if e.headers else None, cap=MAX_WAIT)
    if verdict.action == http.AUTH:
        if status == 403 and code in ACCOUNT_REFUSALS:
            return AuthError(f"Lambda Cloud refused {what}: {ACCOUNT_REFUSALS[code]} ({code})")
        return AuthError(f"Lambda Cloud refused the API key ({what}: HTTP {status}: {message}); check api_key "
                         f"under [providers.lambda] or LAMBDA_API_KEY")
    if verdict.action == http.LATER:
        return LambdaError(f"Lambda Cloud's rate limit on {what} asks for {verdict.wait:.0f} s: try again later",
                           code=code, status=status)
    if verdict.action == http.RETRY:
        answer = body if isinstance(body, dict) else {}
        if status == 429:
            return Transient(f"Lambda Cloud's rate limit on {what} (HTTP 429)", wait=verdict.wait, code=code,
                             status=status, answer=answer)
        return Transient(f"Lambda Cloud server error on {what} (HTTP {status}: {message})", wait=verdict.wait,
                         code=code, status=status, answer=answer)
    if code == NO_CAPACITY:
        return LambdaError(f"Lambda Cloud has no capacity for this launch ({message})", code=code, status=status)
    if code == QUOTA_EXCEEDED:
        suggestion = str(error.get("suggestion") or "Contact Support to increase your quota.")[:200]
        return QuotaExceeded(f"Lambda Cloud refused {what}: the account's instance quota is used up ({code}: "
                             f"{message}). Lambda raises it as invoices are paid; {suggestion} (Lambda console, "
                             "Support)", code=code, status=status)
    return LambdaError(f"Lambda Cloud refused {what} (HTTP {status}: {code or ''} {message})".replace("  ", " "),
                       code=code, status=status)
