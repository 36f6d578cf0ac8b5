"""The watchdog's way out on EC2: a power-off, no credentials on the instance. An on-demand
instance stops (or terminates, by ``shutdown_behavior``) when it powers off; a one-time spot
instance terminates. Which one it is, is its ``instanceInitiatedShutdownBehavior``, asked of EC2."""

from __future__ import annotations

from providers.aws.instances import split_id
from providers.aws.session import Session, aws

# The watchdog's self-stop: power off, as root or through passwordless sudo (the DLAMI's ubuntu has it).
POWER_OFF = 'if [ "$(id -u)" = 0 ]; then shutdown -h now; else sudo -n shutdown -h now; fi'


def self_stop_command(session: Session, provider_id: str, destroy: bool) -> str | None:
    """A power-off, where the instance's shutdown behaviour makes it the verb asked for. The
    attribute is asked of EC2, not assumed."""
    iid, region = split_id(provider_id)
    with aws(f"describe_instance_attribute {iid}"):
        behaviour = session.ec2(region).describe_instance_attribute(
            InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
    value = (behaviour.get("InstanceInitiatedShutdownBehavior") or {}).get("Value")
    return POWER_OFF if value == ("terminate" if destroy else "stop") else None
