"""Vast.ai's GPU marketplace through its ``vastai`` SDK (imported only when a verb runs).

Settings (``[providers.vastai]`` in config.toml), all optional: ``api_key`` (else ``VAST_API_KEY``,
else the SDK's own key files), ``server_url`` (else ``VAST_URL``), ``image``, ``ssh_user`` ("root"),
``max_price_hr`` (on-demand $/hr cap; the minimum bid for spot), ``min_reliability`` (0.95),
``min_inet_down`` (200 Mbps), ``min_cuda`` (12.1), ``spot_margin`` (0.05 over the live minimum bid),
``retries`` (5), ``http_timeout`` (30 s), ``create_timeout`` (120 s, the SDK's own: a create is slow),
``poll_seconds`` (2), ``stop_timeout`` / ``destroy_timeout`` (120 s), ``direct_ssh_grace`` (3 s: how
long the direct SSH route may take to say its banner before Vast's SSH proxy is tried).

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
