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
    mutation = "podTerminate(input: {podId: %s})" if destroy else "podStop(input: {podId: %s}) { id }"
    script = (
        'import json, os, sys, urllib.request\n'
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
        f'query = "mutation {{ {mutation} }}" % json.dumps(pod)\n'
        'base = env("RUNPOD_API_BASE_URL") or "https://api.runpod.io"\n'
        'req = urllib.request.Request(base + "/graphql", data=json.dumps({"query": query}).encode(),\n'
        '    headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})\n'
        'body = json.load(urllib.request.urlopen(req, timeout=30))\n'
        'if body.get("errors"):\n'
        '    sys.exit("RunPod refused: " + body["errors"][0].get("message", ""))\n'
    )
    return f"python3 -c {shlex.quote(script)}"
