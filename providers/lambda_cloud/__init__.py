"""Lambda Cloud through its REST API v1, plain HTTPS with the standard library (Lambda publishes no SDK).

Settings (``[providers.lambda]`` in config.toml), all optional: ``api_key`` (else ``LAMBDA_API_KEY``),
``base_url`` (else ``LAMBDA_API_BASE_URL``, else https://cloud.lambda.ai/api/v1), ``region`` (launch
only there; default: any region with capacity), ``image`` (an image family, or an image id; default:
Lambda Stack), ``ssh_user`` ("ubuntu", Lambda Stack's login), ``retries`` (5), ``http_timeout`` (30 s),
``launch_interval`` (12 s: the wait after a launch answered 429), ``poll_seconds`` (2),
``destroy_timeout`` (180 s), ``launch_lookup_seconds`` (60 s: how long an ambiguous launch is looked
for), ``unhealthy_grace`` (300 s: how long an unhealthy instance is waited on, before and after its
one restart).

What Lambda is, from its published OpenAPI description (https://cloud.lambda.ai/api/v1/openapi.json,
v1.10.0), and what this provider does about it:
- Every answer is ``{"data": ...}`` or ``{"error": {"code", "message", "suggestion"}}``; only the
  ``code`` is meant for programs (the spec says so), so only codes are read here.
- Requests are limited to about one a second, launches to one per 12 seconds (five a minute): a 429
  is waited out and asked again; it refused the request, so a repeated launch makes no second machine.
- A launch refused with ``instance-operations/launch/insufficient-capacity`` means that offer was
  taken meanwhile: the next region (or the next cheapest type) is tried.
- An offer a plan chose (``Request.quote``, one of this provider's own offers) is launched as it was
  listed, in the regions that had capacity then: no second ``GET /instance-types``.
- A launch has no idempotency token, and an answer lost to a 5xx or a dropped connection may hide a
  launch that happened: orch looks for the instance by its name for ``launch_lookup_seconds`` (a
  new instance may be missing from the listing for a while, as RunPod's are) and never launches
  blind again; reconcile (every reaper pass) adopts one that shows later. A new id that
  ``GET /instances/{id}`` does not know yet is pending for two minutes, not gone (the grace EC2's
  eventual consistency gets).
- The launch's 403s are the account's, not the key's (spec, launchInstance 403):
  ``global/account-inactive`` (verify the email address, add a payment method) and
  ``global/invalid-address`` (the billing address): each is named.
- ``unhealthy`` is not final (spec InstanceStatus; SkyPilot's Lambda provisioner,
  https://github.com/skypilot-org/skypilot sky/provision/lambda_cloud/instance.py, maps it to INIT,
  not to a failure): orch waits ``unhealthy_grace``, sends one ``/instance-operations/restart``,
  waits again, and only then reports it broken (and ``up`` or the reaper destroys it). The time it
  was first seen unhealthy, and the restart, are kept in orch's home, so a reaper that runs as a new
  process each pass still counts from the first sighting.
- ``preempted`` (taken back by Lambda) is read as gone, and the terminate is sent anyway: it is
  idempotent, and "gone" must mean nothing bills.
- There is no stop and no spot: spot is declared (``capabilities``) and refused in one line, and the
  provider is no ``Stoppable``. There is no self-stop either (no ``SelfEnding``): only a terminate
  through the API ends the bill, and that needs the account's key, which orch never puts on an
  instance.
- A group (``--nodes N``) launches every node in one region, where instances reach each other at
  their ``private_ip``, as SkyPilot's Lambda provisioner does (same file: ``run_instances`` takes one
  region for the whole cluster).
- An instance listing carries ``jupyter_token`` and ``jupyter_url`` (a login to the instance): they
  are dropped before anything orch keeps.
- A launch needs exactly one SSH key held by the account: orch's key is added once, named after
  its fingerprint.

``api`` is the HTTP session and Lambda's errors, ``offers`` the instance types as offers,
``compute`` the provider and its verbs, ``instances`` an instance row as a ``Remote``, ``groups`` a
group's one region, ``health`` the unhealthy-instance memory, ``keys`` the account's SSH keys.
"""

from orchestrator.hookspecs import hookimpl
from providers.lambda_cloud.api import (ACCOUNT_REFUSALS, DEFAULT_BASE_URL, MAX_WAIT, NO_CAPACITY, NOT_FOUND,
                                        LambdaError, Session)
from providers.lambda_cloud.compute import LAUNCH_LOOKUP_SECONDS, VISIBILITY_GRACE_S, LambdaProvider
from providers.lambda_cloud.health import UNHEALTHY_GRACE_S, Unhealthy
from providers.lambda_cloud.instances import SECRET_FIELDS
from providers.lambda_cloud.keys import key_blob, key_name
from providers.lambda_cloud.offers import gpu_from_description

__all__ = ["LambdaProvider", "LambdaError", "Session", "Unhealthy", "key_blob", "key_name", "gpu_from_description",
           "ACCOUNT_REFUSALS", "DEFAULT_BASE_URL", "MAX_WAIT", "NO_CAPACITY", "NOT_FOUND", "LAUNCH_LOOKUP_SECONDS",
           "VISIBILITY_GRACE_S", "UNHEALTHY_GRACE_S", "SECRET_FIELDS"]


@hookimpl
def register_providers(register):
    register(LambdaProvider)
