"""Vast.ai through its ``vastai`` SDK (imported only when a verb runs).

Settings (``[providers.vastai]`` in config.toml), all optional:
``api_key`` (else ``VAST_API_KEY``, else the SDK's own key files), ``server_url`` (else ``VAST_URL``),
``image``, ``ssh_user`` ("root"), ``max_price_hr`` (on-demand $/hr cap; the minimum bid for spot),
``min_reliability`` (0.95), ``min_inet_down`` (200 Mbps), ``min_cuda`` (12.1), ``spot_margin``
(0.05 over the live minimum bid), ``retries`` (5), ``http_timeout`` (30 s), ``create_timeout``
(120 s, the SDK's own: a create is slow), ``poll_seconds`` (2), ``stop_timeout`` /
``destroy_timeout`` (120 s), ``direct_ssh_grace`` (3 s: how long the direct SSH route may take to
say its banner before Vast's SSH proxy is tried).

What Vast.ai imposes, each handled here, with where it can be read:

- Failures arrive as HTTP 200 with ``success: false`` (the SDK checks it itself:
  vastai/async_/client.py ``create_instance``); ``api.once`` checks every answer.
- The SDK's ``show_instances`` turns a failed listing into ``[]`` (vastai/api/instances.py:
  ``data.get("instances") or []``): the provider pages the v1 listing and checks its keys.
- A create that answered an error may have rented, and bill, a machine anyway: the SDK re-sends
  429/502/503/504 on every method, ``PUT /asks/{id}/`` included (vastai/api/client.py
  ``_RETRYABLE_STATUS``), and the re-sent create meets its own now-rented offer (404
  ``no_such_ask``). An error answer can carry the id of an instance it made (dstack's Vast client,
  src/dstack/_internal/core/backends/vastai/api_client.py ``VastAICreateInstanceError``: "Vast.ai
  creates spot instances in the stopped state and returns an error if the bid is insufficient").
  After any create error the instance is looked up by its label.
- A create without a bid silently rents on-demand (vastai/api/instances.py
  ``build_create_instance_payload``: ``"price": null``).
- A create without ``cancel_unavail`` on an offer just taken makes a stopped instance (the CLI's
  help for ``vastai create instance --cancel-unavail``: "Return error if scheduling fails (rather
  than creating a stopped instance)").
- A start is accepted and then waits (*scheduling*) until the host frees the GPU, possibly for ever
  (Vast.ai docs, CLI reference "start instance"); stopping again is how to give up.
- ``exited``, ``offline``, ``unknown`` and ``frozen`` instances will not run by themselves and may
  bill as running (Vast.ai docs, CLI reference "show instance"; the SDK's SKILL.md).
- The direct SSH route (``public_ipaddr`` + ``ports["22/tcp"]``) is often firewalled while the
  proxy (``ssh_host``/``ssh_port``) works (SkyPilot's Vast provisioner connects through
  ``ssh_port``: sky/provision/vast/utils.py): an instance offers both routes, the direct one with
  a short grace (``instances.remote``), and ``orchestrator.reach`` takes the first that answers.
- Storage is priced over a 720-hour month (Vast.ai's OpenAPI ``show_instance`` example:
  storage_cost × GB / 720 = dph_total − dph_base).
- Instances on the marketplace share no private network: no groups (``compute.VastAIProvider``).

``api`` calls Vast, ``offers`` searches its marketplace, ``instances`` reads an instance row,
``compute`` holds the verbs and the renting loop, ``self_stop`` the on-instance snippet.
"""

from orchestrator.hookspecs import hookimpl
from providers.vastai.api import VastError
from providers.vastai.compute import OffersTaken, VastAIProvider
from providers.vastai.offers import vast_gpu_name

__all__ = ["VastAIProvider", "VastError", "OffersTaken", "vast_gpu_name", "register_providers"]


@hookimpl
def register_providers(register):
    register(VastAIProvider)
