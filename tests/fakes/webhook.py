"""A Slack-compatible incoming webhook on loopback, written from Slack's documentation, not from
orch: "Sending messages using incoming webhooks" (api.slack.com/messaging/webhooks) says a message
is a POST of JSON (``Content-type: application/json``) with a ``text`` field to
``https://hooks.slack.com/services/T.../B.../XXXX``, answered ``200 ok``; a body Slack cannot read
is answered ``400 invalid_payload``, and a message without text ``400 no_text``
(api.slack.com/changelog/2016-05-17-changes-to-errors-for-incoming-webhooks).

Imports nothing from orch: what orch posts is checked against Slack's idea of a message.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "T0SECRET/B0SECRET/XyZzy0123456789secret"  # the part of a webhook URL that is a credential


class Hook(ThreadingHTTPServer):
    """Keeps every well-formed message (``posts``); ``status`` forces the answer (a failing Slack)."""

    daemon_threads = True

    def __init__(self, status: int | None = None):
        self.posts, self.status = [], status
        super().__init__(("127.0.0.1", 0), _Handler)
        # A short poll: shutdown() (each test's end) waits for the loop's next wake, 0.5 s by default.
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/services/{SECRET}"

    def texts(self) -> list[str]:
        return [p["body"]["text"] for p in self.posts]

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != f"/services/{SECRET}":
            return self._answer(404, b"no_service")
        try:
            message = json.loads(body)
        except ValueError:
            return self._answer(400, b"invalid_payload")
        if not isinstance(message, dict) or not isinstance(message.get("text"), str) or not message["text"]:
            return self._answer(400, b"no_text")
        self.server.posts.append({"path": self.path, "type": self.headers.get("Content-Type"), "body": message})
        if self.server.status is not None:  # received, and answered as a failing Slack would
            return self._answer(self.server.status, b"server_error")
        self._answer(200, b"ok")

    def _answer(self, status: int, text: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass
