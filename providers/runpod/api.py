"""RunPod's REST API v2 over plain HTTPS, with the standard library, and its errors in orch's words.

Everything orch does at RunPod goes through v2 (docs.runpod.io, "API v2 overview" and "Migrate from
API v1"; the published description is api-reference-v2/openapi.json in github.com/runpod/docs):
pods (``/v2/pods``), network volumes (``/v2/network-volumes``), the catalog with stock per data
center (``/v2/catalog/gpus``, ``/v2/catalog/datacenters``) and Instant Clusters (``/v2/clusters``).
GraphQL is no longer used: v2 has a route for every call orch made there (the migration guide maps
each), and RunPod is retiring GraphQL. So runpod-python (a GraphQL client) is no longer imported.

- Base: ``$RUNPOD_API_BASE_URL/v2`` (``https://api.runpod.io/v2``: the same host as ``/graphql``),
  ``Authorization: Bearer KEY``.
- Errors are RFC 9457 problems ``{title, status, detail, errors?}``. A body the schema does not
  define a field of is 422 naming it; a valid body that cannot be placed is 400 ("There are no
  longer any instances available ..."): nothing was made.
- Whether a failure is worth another try is ``orchestrator.provider.http``'s verdict (401/403 the
  key's, 429 and 5xx worth another try after ``Retry-After``); a 5xx or a lost answer on a create
  is ``MaybeMade``: the caller looks before it sends anything again.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote, urlencode

from orchestrator.errors import AuthError, NoCapacity, ProviderError
from orchestrator.provider import http

DEFAULT_BASE_URL = "https://api.runpod.io"
MAX_WAIT = 60.0  # a Retry-After longer than this is not waited out
NO_CAPACITY = ("no longer any instances available", "not enough free gpus", "no instances available",
               "no available", "insufficient capacity")


class RunPodError(ProviderError):
    """A refusal from RunPod's v2 API, with its HTTP status."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class NotFound(RunPodError):
    """404: no such pod, volume or cluster (any more)."""


class Conflict(RunPodError):
    """409: the action is not valid in the resource's state (a cluster member's own delete, a stop
    of a stopped pod)."""


class MaybeMade(http.Transient):
    """RunPod took the request and its answer was an error or was lost: a create may have made it."""


def path_id(value: str) -> str:
    """An id as one path segment: never a way to another route."""
    return quote(str(value), safe="")


class Rest:
    """One RunPod account's v2 session: ``once`` (one request) and ``call`` (bounded retries, for
    what is safe to repeat). The key is read at every call: ``RUNPOD_API_KEY`` beats ``api_key`` in
    config.toml, which beats the runpod CLI's own credentials file (``~/.runpod/config.toml``)."""

    def __init__(self, api_key: str | None = None, attempts: int = 5, base: float = 0.5, timeout: float = 30.0):
        self.api_key, self.attempts, self.base, self.timeout = api_key, attempts, base, timeout

    @property
    def url(self) -> str:
        return (os.environ.get("RUNPOD_API_BASE_URL") or DEFAULT_BASE_URL).rstrip("/") + "/v2"

    def key(self) -> str:
        key = os.environ.get("RUNPOD_API_KEY") or self.api_key or credentials_file_key()
        if not key:
            raise AuthError("no RunPod API key: set api_key under [providers.runpod] in orch's config, "
                            "or export RUNPOD_API_KEY, or run `runpod config`")
        return str(key)

    def once(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> Any:
        """One request; its JSON answer (None for a 204). RunPod's errors become orch's: retryable
        ones ``http.Transient`` (``MaybeMade`` where RunPod may have acted all the same)."""
        import socket
        import urllib.error
        import urllib.request

        what = f"{method} /v2{path}"
        url = self.url + path + (("?" + urlencode(query)) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.key()}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise _http_error(e, what) from None
        except (TimeoutError, socket.timeout) as e:  # sent, maybe processed: like an error answer
            raise MaybeMade(f"RunPod API did not answer {what} in time: {e}") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise MaybeMade(f"RunPod API did not answer {what} in time: {e.reason}") from None
            raise http.Transient(f"RunPod API unreachable ({what}): {e.reason}") from None
        except OSError as e:  # reset while reading the answer: it may have been processed
            raise MaybeMade(f"RunPod API dropped the connection on {what}: {e}") from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise http.Transient(f"RunPod API answered {what} with something that is not JSON: {raw[:200]!r}") from None

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> Any:
        """A request that is safe to repeat, with bounded retries."""
        return http.call(lambda: self.once(method, path, body, query), attempts=self.attempts, base=self.base,
                         cap=MAX_WAIT)


def create_once(send: Callable[[], Any], find: Callable[[], Any], what: str, window: float, poll: float,
                attempts: int, base: float) -> Any:
    """A create that is never sent twice blindly (RunPod's names are not unique, and v2 takes no
    idempotency key): ``send()`` once; after a failure worth another try, ``find()`` (what the create
    would have made, by its name) is looked for, for ``window`` seconds where RunPod may have acted
    (``MaybeMade``), once where it made nothing (a 429, a refused connection). What was found is the
    answer; else, after a ``MaybeMade``, an error that no second create follows; after a refusal that
    made nothing, another try (bounded)."""

    def once() -> Any:
        try:
            return send()
        except AuthError:
            raise
        except http.Transient as e:
            maybe = isinstance(e, MaybeMade)
            found = looked_for(find, window if maybe else 0, poll)
            if found is not None:
                return found
            if maybe:
                raise ProviderError(f"creating {what} failed ({e}), and it did not show within {window:g} s: orch "
                                    "sends no second create; `orch reconcile` settles it should it show later (or "
                                    "look in the RunPod console before trying again)") from None
            raise

    return http.call(once, attempts=attempts, base=base, cap=MAX_WAIT)


def looked_for(find: Callable[[], Any], seconds: float, poll: float) -> Any:
    """``find()``'s first answer that is not None within ``seconds`` (a listing may lag a create); a
    listing that fails counts as not found yet."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = find()
        except ProviderError:
            found = None
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(max(poll, 0.05))


def credentials_file_key() -> str | None:
    """The key ``runpod config`` wrote (``~/.runpod/config.toml``, ``[default] api_key``), read
    without the SDK."""
    path = Path(os.path.expanduser("~/.runpod/config.toml"))
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    section = data.get("default") if isinstance(data, dict) else None
    key = section.get("api_key") if isinstance(section, dict) else None
    return str(key) if key else None


def _http_error(e, what: str) -> ProviderError:
    """Orch's error for RunPod's HTTP error ``e``: its own words (the problem's detail and the
    validation errors it names), the decision ``http.verdict``'s."""
    status = e.code
    try:
        body = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        body = {}
    body = body if isinstance(body, dict) else {}
    detail = str(body.get("detail") or body.get("title") or body.get("error") or e.reason or "")[:300]
    errors = body.get("errors") if isinstance(body.get("errors"), list) else []
    if errors:
        detail += " (" + "; ".join(str(x)[:200] for x in errors[:5]) + ")"
    verdict = http.verdict(status, e.headers.get("Retry-After") if e.headers else None, cap=MAX_WAIT)
    if verdict.action == http.AUTH:
        return AuthError(f"RunPod rejected the API key ({what}: HTTP {status}: {detail}); check api_key under "
                         "[providers.runpod] or RUNPOD_API_KEY")
    if verdict.action == http.LATER:
        return RunPodError(f"RunPod's rate limit on {what} asks for {verdict.wait:.0f} s: try again later", status)
    if verdict.action == http.RETRY:
        if status == 429:  # the limiter refused it: nothing was done
            return http.Transient(f"RunPod's rate limit on {what} (HTTP 429)", wait=verdict.wait, status=status)
        return MaybeMade(f"RunPod API error on {what} (HTTP {status}: {detail})", wait=verdict.wait, status=status)
    if status == 404:
        return NotFound(f"RunPod: {what}: {detail}", status)
    if status == 409:
        return Conflict(f"RunPod refused {what} (HTTP 409: {detail})", status)
    if any(s in detail.lower() for s in NO_CAPACITY):
        return NoCapacity(f"RunPod has no capacity for this request: {detail}")
    return RunPodError(f"RunPod refused {what} (HTTP {status}: {detail})", status)
