"""Lambda Cloud through its REST API v1, plain HTTPS with the standard library (Lambda publishes no SDK).

Settings (``[providers.lambda]`` in config.toml), all optional: ``api_key`` (else ``LAMBDA_API_KEY``), ``base_url``
(else ``LAMBDA_API_BASE_URL``, else https://cloud.lambda.ai/api/v1), ``region`` (launch only there; default: any
region with capacity), ``image`` (an image family, or an image id; default: Lambda Stack), ``ssh_user`` ("ubuntu",
Lambda Stack's login), ``retries`` (5), ``http_timeout`` (30 s), ``launch_interval`` (12 s, Lambda's launch rate
limit: this process spaces its launches so, and waits at least this long after a 429), ``poll_seconds`` (2),
``destroy_timeout`` (180 s), ``launch_lookup_seconds`` (60 s: how long an ambiguous launch is looked for),
``unhealthy_grace`` (300 s: how long an unhealthy instance is waited on, before and after its one restart).

``api`` is the HTTP session and Lambda's errors, ``offers`` the instance types as offers, ``compute`` the provider
and its verbs, ``instances`` an instance row as a ``Remote``, ``groups`` a group's one launch (one type, one
region), ``health`` the unhealthy-instance memory, ``keys`` the account's SSH keys.
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
