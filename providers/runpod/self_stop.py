"""What a pod runs to stop or end itself, with its own pod-scoped key.

Inside a pod RunPod sets ``RUNPOD_POD_ID`` and ``RUNPOD_API_KEY``, a key scoped to that pod (RunPod
docs, "Environment variables", docs.runpod.io/pods/templates/environment-variables; "Every Pod ...
comes preinstalled with ... a Pod-scoped API key", docs.runpod.io/runpodctl). A non-interactive SSH
session may lack them: the container's PID 1 has them.
"""

from __future__ import annotations

import shlex


def self_stop_command(destroy: bool) -> str:
    """A shell snippet that, run inside the pod, stops (or terminates) the pod itself. The key is
    read from the environment inside Python, never put on a command line."""
    # REST v2 (RunPod API v2 reference, "Terminate a pod", "Trigger a pod state transition"):
    # ``DELETE /v2/pods/{id}`` ends it, ``POST /v2/pods/{id}/action {"action": "stop"}`` stops it.
    method, suffix, body = ("DELETE", "", "None") if destroy else ("POST", "/action", 'json.dumps({"action": "stop"}).encode()')
    script = (
        'import json, os, sys, urllib.error, urllib.parse, urllib.request\n'
        'def env(k):\n'
        '    if os.environ.get(k):\n'
        '        return os.environ[k]\n'
        '    try:\n'
        '        pairs = open("/proc/1/environ", "rb").read().split(b"\\0")\n'
        '    except OSError:\n'
        '        return ""\n'
        '    return dict(p.decode(errors="replace").partition("=")[::2] for p in pairs if p).get(k, "")\n'
        'pod, key = env("RUNPOD_POD_ID"), env("RUNPOD_API_KEY")\n'
        'if not pod or not key:\n'
        '    sys.exit("RUNPOD_POD_ID or RUNPOD_API_KEY missing: cannot stop this pod")\n'
        'base = env("RUNPOD_API_BASE_URL") or "https://api.runpod.io"\n'
        'url = base.rstrip("/") + "/v2/pods/" + urllib.parse.quote(pod, safe="") + %r\n'
        'req = urllib.request.Request(url, data=%s, method=%r,\n'
        '    headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})\n'
        'try:\n'
        '    urllib.request.urlopen(req, timeout=30).read()\n'
        'except urllib.error.HTTPError as e:\n'
        '    sys.exit("RunPod refused: HTTP %%d %%s" %% (e.code, e.read()[:300].decode(errors="replace")))\n'
    ) % (suffix, body, method)
    return f"python3 -c {shlex.quote(script)}"
