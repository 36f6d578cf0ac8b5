"""AWS EC2, on-demand and spot, through boto3 (``orch-gpu[aws]``; imported only inside the verbs).

Credentials and region are read as every AWS tool reads them (``session``). Settings (``[providers.aws]``), all
optional: ``profile``, ``region`` (where instances are made; default: the AWS configuration's, else us-east-1),
``regions`` (where offers and instances are looked for; default: ``region``), ``ami`` (an AMI id; default: the
newest Deep Learning AMI by ``ami_name``/``ami_owner``), ``ssh_user`` ("ubuntu"), ``ssh_cidr`` ("0.0.0.0/0"),
``security_group`` ("orch-ssh"), ``cpu_instance_type`` ("m6i.large", for --cpu), ``shutdown_behavior`` ("stop" or
"terminate"), ``address`` ("public", or "private" over a VPN), ``on_demand_prices`` ($/hr by type),
``ebs_prices`` (gp3 $/GB-month by region; default: the us-east-1 rate, $0.08),
``poll_seconds`` (2), ``stop_timeout``/``destroy_timeout`` (600 s), ``retries`` (5).

``compute`` the verbs, ``session`` boto3's clients, regions and errors, ``settings`` the settings' checks,
``prices``/``offers`` the listing, ``launch`` a create, ``instances`` what EC2 shows of one, ``images`` the
AMI, ``network`` key pair and SSH group, ``groups`` a group's shared parts, ``self_stop`` the power-off.
"""

from orchestrator.hookspecs import hookimpl
from providers.aws.compute import VISIBILITY_GRACE_S, AWSProvider
from providers.aws.groups import GROUP_LOCK, close_group, node_of_group
from providers.aws.images import DEFAULT_AMI_NAME, DEFAULT_AMI_OWNER
from providers.aws.instances import LABEL_TAG, provider_id, split_id
from providers.aws.launch import DEFAULT_CPU_TYPE, Plan
from providers.aws.network import SECURITY_GROUP, account_key, ensure_key, ensure_ssh_group
from providers.aws.offers import DLAMI_FAMILIES, offer_type
from providers.aws.prices import EBS_GB_MONTH, LINUX, ON_DEMAND, ON_DEMAND_SOURCE, spot_prices
from providers.aws.self_stop import POWER_OFF
from providers.aws.session import DEFAULT_REGION, QUOTAS, REGIONS_FILE, AWSError, QuotaExceeded, Session

__all__ = ["AWSProvider", "VISIBILITY_GRACE_S", "GROUP_LOCK", "close_group", "node_of_group", "DEFAULT_AMI_NAME",
           "DEFAULT_AMI_OWNER", "LABEL_TAG", "provider_id", "split_id", "DEFAULT_CPU_TYPE", "Plan",
           "SECURITY_GROUP", "account_key", "ensure_key", "ensure_ssh_group", "DLAMI_FAMILIES",
           "offer_type", "EBS_GB_MONTH", "LINUX", "ON_DEMAND", "ON_DEMAND_SOURCE", "spot_prices", "POWER_OFF",
           "DEFAULT_REGION", "QUOTAS", "REGIONS_FILE", "AWSError", "QuotaExceeded", "Session"]


@hookimpl
def register_providers(register):
    register(AWSProvider)
