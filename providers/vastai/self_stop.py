"""How a Vast.ai instance stops or destroys itself, with the container's own API key."""

from __future__ import annotations

import shlex


def command(destroy: bool) -> str:
    """Shell that, run on the instance, stops (or destroys) it with the container's own key.

    The key is read from the environment inside Python, never put on a command line. SSH
    sessions on Vast do not see the container's variables, so PID 1's are the fallback.
    (The CLI form, ``vastai destroy instance $CONTAINER_ID --api-key ...``, needs ``-y``:
    without it, and with no terminal, it prints "Aborted." and destroys nothing.)
    """
    method, body = ("DELETE", "{}") if destroy else ("PUT", '{"state": "stopped"}')
    code = _SELF_STOP.replace("@METHOD@", method).replace("@BODY@", body)
    return f"python3 -c {shlex.quote(code)}"


_SELF_STOP = """\
import json, os, sys, time, urllib.error, urllib.request
env = dict(os.environ)
if not env.get("CONTAINER_API_KEY"):
    try:
        with open("/proc/1/environ", "rb") as f:
            for item in f.read().split(b"\\0"):
                k, _, v = item.decode(errors="replace").partition("=")
                env.setdefault(k, v)
    except OSError:
        pass
iid, key = env.get("CONTAINER_ID"), env.get("CONTAINER_API_KEY")
if not iid or not key:
    sys.exit("orch: CONTAINER_ID or CONTAINER_API_KEY missing: cannot reach the Vast.ai API")
url = env.get("VAST_URL", "https://console.vast.ai").rstrip("/") + "/api/v0/instances/%s/" % iid
for attempt in range(6):
    req = urllib.request.Request(url, data=json.dumps(@BODY@).encode(), method="@METHOD@",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.load(r)
        if answer.get("success") is False:
            sys.exit("orch: Vast.ai refused: %s" % answer)
        sys.exit(0)
    except urllib.error.HTTPError as e:
        if e.code != 429 and e.code < 500:
            sys.exit("orch: Vast.ai answered HTTP %d" % e.code)
    except (OSError, ValueError):
        pass
    time.sleep(2 ** attempt)
sys.exit("orch: Vast.ai did not answer")
"""
