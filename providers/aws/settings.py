"""``[providers.aws]`` in config.toml, checked when it is read: before anything is rented, a user
that is an ssh option or a region that is no region name would otherwise fail only once the
instance bills."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import UsageError
from orchestrator.ssh.remote import USER
from providers.aws.session import REGION

STRINGS = ("profile", "region", "ami", "ami_name", "ami_owner", "ssh_user", "ssh_cidr", "security_group",
           "cpu_instance_type")


def check(settings: dict[str, Any]) -> None:
    for key in STRINGS:
        value = settings.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or not value.isprintable()):
            raise UsageError(f"[providers.aws] {key} must be a non-empty string, not {value!r}")
    if settings.get("ssh_user") is not None and not USER.fullmatch(settings["ssh_user"]):
        raise UsageError(f"[providers.aws] ssh_user must be a login name, not {settings['ssh_user']!r}")
    if settings.get("region") is not None and not REGION.fullmatch(settings["region"]):
        raise UsageError(f"[providers.aws] region must be a region name (us-east-1), not {settings['region']!r}")
    regions = settings.get("regions")
    if regions is not None and (not isinstance(regions, list) or not regions or
                                not all(isinstance(r, str) and REGION.fullmatch(r) for r in regions)):
        raise UsageError(f"[providers.aws] regions must be a list of region names, not {regions!r}")
    if settings.get("shutdown_behavior", "stop") not in ("stop", "terminate"):
        raise UsageError("[providers.aws] shutdown_behavior must be stop or terminate")
    if settings.get("address", "public") not in ("public", "private"):
        raise UsageError("[providers.aws] address must be public or private")
    for key, what in (("on_demand_prices", "instance type = $/hr"), ("ebs_prices", "region = $/GB-month")):
        prices = settings.get(key, {})
        if not isinstance(prices, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")
                for v in prices.values()):
            raise UsageError(f"[providers.aws] {key} must be a table of {what}")
