"""A loopback stand-in for EC2's instance metadata service, IMDSv2, enough for a spot notice.

Written from the EC2 User Guide, not from orch:
- "Use the Instance Metadata Service to access instance metadata" (IMDSv2): a session token from
  ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to 21600; without it,
  400), then every ``GET`` carries ``X-aws-ec2-metadata-token``; a GET without a valid token is
  answered 401.
- "Spot Instance interruption notices": ``GET /latest/meta-data/spot/instance-action`` is 404 until
  EC2 will interrupt the instance, then ``{"action": "terminate", "time": "2026-12-07T08:22:00Z"}``
  (two minutes ahead); AWS suggests checking every 5 seconds.
- "EC2 instance rebalance recommendations": ``GET /latest/meta-data/events/recommendations/rebalance``
  is 404 until the risk rises, then ``{"noticeTime": "..."}``.

Imports nothing from orch. ``interrupt`` and ``rebalance`` give the notices; every request is
recorded (method, path, whether its token was good).
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Metadata(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        self.tokens: set[str] = set()
        self.action: dict | None = None
        self.rebalance_at: str | None = None
        self.requests: list[tuple[str, str, bool]] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        # A short poll: shutdown() (each test's end) waits for the loop's next wake, 0.5 s by default.
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def interrupt(self, action: str = "terminate", time: str = "2026-12-07T08:22:00Z") -> None:
        self.action = {"action": action, "time": time}

    def rebalance(self, time: str = "2026-12-07T08:20:00Z") -> None:
        self.rebalance_at = time

    def asked(self, path: str) -> int:
        """How many GETs of ``path`` came with a good token."""
        return sum(1 for m, p, ok in self.requests if m == "GET" and p == path and ok)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):  # quiet
        pass

    def do_PUT(self):  # noqa: N802 - http.server's name
        if self.path != "/latest/api/token":
            return self._answer(404, b"not found")
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            self.server.requests.append(("PUT", self.path, False))
            return self._answer(400, b"bad ttl")
        token = secrets.token_urlsafe(24)
        self.server.tokens.add(token)
        self.server.requests.append(("PUT", self.path, True))
        self._answer(200, token.encode())

    def do_GET(self):  # noqa: N802
        ok = self.headers.get("X-aws-ec2-metadata-token") in self.server.tokens
        self.server.requests.append(("GET", self.path, ok))
        if not ok:
            return self._answer(401, b"unauthorized")
        if self.path == "/latest/meta-data/spot/instance-action" and self.server.action:
            return self._answer(200, json.dumps(self.server.action).encode())
        if self.path == "/latest/meta-data/events/recommendations/rebalance" and self.server.rebalance_at:
            return self._answer(200, json.dumps({"noticeTime": self.server.rebalance_at}).encode())
        self._answer(404, b"not found")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
