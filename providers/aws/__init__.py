"""AWS EC2, on-demand and spot, through boto3 (``orch-gpu[aws]``; imported only inside the verbs).

Credentials and region are read the way every AWS tool reads them (environment, ``~/.aws``, a
profile); ``AWS_ENDPOINT_URL`` (boto3's own) points it elsewhere. Settings (``[providers.aws]`` in
config.toml), all optional: ``profile``, ``region`` (where instances are made; default: the AWS
configuration's region, else us-east-1), ``regions`` (a list: where offers are looked for and
instances listed; default: ``region``), ``ami`` (an AMI id; default: the newest Deep Learning AMI
found by ``ami_name``/``ami_owner``), ``ssh_user`` ("ubuntu", the DLAMI's login), ``ssh_cidr``
("0.0.0.0/0": who may reach port 22), ``security_group`` ("orch-ssh"), ``cpu_instance_type``
("m6i.large", for --cpu), ``shutdown_behavior`` ("stop" or "terminate": what an on-demand
instance does when the watchdog powers it off), ``address`` ("public", or "private" over a VPN),
``on_demand_prices`` (a table of $/hr by instance type, for regions the
built-in table does not cover), ``poll_seconds`` (2), ``stop_timeout`` / ``destroy_timeout`` (600 s),
``retries`` (5, boto3's standard retry mode).

What EC2 is, and what this provider does about it:
- Offers: GPU instance types from ``describe_instance_types`` (GpuInfo: NVIDIA GPUs, count, memory)
  in each configured region; on-demand prices from the table in ``prices`` (the Pricing API is
  another service, with other permissions); live spot prices from ``describe_spot_price_history``,
  the latest per type and availability zone. Every offer says where its price comes from, and keeps
  its zones' spot prices: a create that rents it as listed (``Request.quote``) asks for neither again.
- A one-time spot instance cannot be stopped (EC2 User Guide, "Stop and start Spot Instances":
  only instances of a persistent request can): ``stops(spot=True)`` says so, and its
  shutdown behaviour is terminate. An on-demand instance stops when it powers off (or terminates,
  by ``shutdown_behavior``): the watchdog's self-stop is a power-off, no credentials on the
  instance. ``self_stop_command`` asks the instance's own attribute which one it is.
- A spot instance that EC2 takes back carries a state reason ``Server.SpotInstanceTermination``
  (or ``Server.SpotInstanceShutdown``, stopped): it is reported preempted, not lost.
- Spot: no ``MaxPrice`` is sent unless the user gave ``--bid`` (botocore's EC2 model, SpotMarketOptions:
  "We do not recommend using this parameter because it can lead to increased interruptions. If you
  do not specify this parameter, you will pay the current Spot price"); the plan's cost is still
  the live price. A spot create goes to the cheapest zone, and on a capacity error to the next
  zone by price (as dstack's AWS backend moves on through its offers).
- Errors by code: capacity ones (InsufficientInstanceCapacity, UnfulfillableCapacity, Unsupported
  in that zone, SpotMaxPriceTooLow, ...) are no capacity, so a job moves on; quota ones
  (VcpuLimitExceeded, MaxSpotInstanceCountExceeded, InstanceLimitExceeded) are one line naming the
  Service Quotas quota (by instance family and market) and how to raise it.
- Regions: an instance is made where its offer is (``--offer us-west-2:g5.xlarge``), which may be
  outside ``regions``: every region orch has created in is remembered in orch's home
  (``aws-regions.json``, written before the create), and listing, lookup and adoption look there too.
- orch's security group: an existing ``orch-ssh`` without its port-22 rule (a failed authorize, a
  rule deleted by hand) gets it back; a group or key pair made meanwhile by another orch
  (``InvalidGroup.Duplicate``, ``InvalidKeyPair.Duplicate``, ``InvalidPermission.Duplicate``) is
  looked up again, not an error.
- Catalogue: the default Deep Learning AMI (OSS Nvidia driver, PyTorch 2.9, Ubuntu 24.04) supports
  G4dn, G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en and P6-B200 (its release notes): only those are
  offered unless ``ami`` (or ``--image``) names another AMI; fractional-GPU types
  (GpuPartitionSize < 1, botocore's GpuDeviceInfo) are never offered.
- ``run_instances`` carries the orch label as its ClientToken: a create repeated after an error
  returns the instance the first one made instead of a second one (EC2 API, "Ensuring idempotency").
  Right after a create, an instance may not be visible yet (EC2 API, "Eventual consistency"):
  a lookup that misses an instance this process just made says pending, not gone (``JustMade``).

One module per concern, as SkyPilot's ``sky/provision/aws/``: ``compute`` the verbs, ``session``
boto3's clients, the regions and the error mapping, ``settings`` the checks of ``[providers.aws]``,
``prices`` and ``offers`` the listing, ``launch`` a create's plan and its ``run_instances``,
``instances`` what EC2 shows of one, ``images`` the AMI, ``network`` the key pair and the SSH
security group, ``groups`` what a group's nodes share, ``self_stop`` the watchdog's power-off.
"""

from orchestrator.hookspecs import hookimpl
from providers.aws.compute import VISIBILITY_GRACE_S, AWSProvider
from providers.aws.groups import GROUP_LOCK, close_group, node_of_group
from providers.aws.images import DEFAULT_AMI_NAME, DEFAULT_AMI_OWNER
from providers.aws.instances import LABEL_TAG, provider_id, split_id
from providers.aws.launch import DEFAULT_CPU_TYPE, Plan
from providers.aws.network import SECURITY_GROUP, account_key, ensure_key, ensure_ssh_group, key_pair_name
from providers.aws.offers import DLAMI_FAMILIES, offer_type
from providers.aws.prices import EBS_GB_MONTH, LINUX, ON_DEMAND, ON_DEMAND_SOURCE, spot_prices
from providers.aws.self_stop import POWER_OFF
from providers.aws.session import DEFAULT_REGION, QUOTAS, REGIONS_FILE, AWSError, QuotaExceeded, Session

__all__ = ["AWSProvider", "VISIBILITY_GRACE_S", "GROUP_LOCK", "close_group", "node_of_group", "DEFAULT_AMI_NAME",
           "DEFAULT_AMI_OWNER", "LABEL_TAG", "provider_id", "split_id", "DEFAULT_CPU_TYPE", "Plan",
           "SECURITY_GROUP", "account_key", "ensure_key", "ensure_ssh_group", "key_pair_name", "DLAMI_FAMILIES",
           "offer_type", "EBS_GB_MONTH", "LINUX", "ON_DEMAND", "ON_DEMAND_SOURCE", "spot_prices", "POWER_OFF",
           "DEFAULT_REGION", "QUOTAS", "REGIONS_FILE", "AWSError", "QuotaExceeded", "Session"]


@hookimpl
def register_providers(register):
    register(AWSProvider)
