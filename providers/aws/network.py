"""How orch reaches its instances: its key pair (named by the key's fingerprint) and its security
group ``orch-ssh`` in the default VPC, port 22 only. Another orch making either at the same moment
(``InvalidKeyPair.Duplicate``, ``InvalidGroup.Duplicate``, ``InvalidPermission.Duplicate``) is
looked up again, not an error; a group that lost its port-22 rule gets it back."""

from __future__ import annotations

from orchestrator.errors import ProviderError
from orchestrator.provider import key_name
from providers.aws.session import AWSError, Session, aws

SECURITY_GROUP = "orch-ssh"


def has_key(session: Session, region: str, name: str) -> bool:
    try:
        with aws(f"describe_key_pairs in {region}"):
            session.ec2(region).describe_key_pairs(KeyNames=[name])
        return True
    except AWSError as e:
        if e.code != "InvalidKeyPair.NotFound":
            raise
    return False


def ensure_key(session: Session, region: str, public_key: str) -> str:
    name = key_name(public_key)
    if has_key(session, region, name):
        return name
    try:
        with aws(f"import_key_pair {name} in {region}"):
            session.ec2(region).import_key_pair(KeyName=name,
                                                PublicKeyMaterial=" ".join(public_key.split()[:2]).encode())
    except AWSError as e:
        if e.code != "InvalidKeyPair.Duplicate":  # another orch imported it meanwhile: the same key, by name
            raise
    return name


def account_key(session: Session, public_key: str) -> str:
    """Where orch's key is held as a key pair, and where the first create will import it."""
    name = key_name(public_key)
    held = [region for region in session.regions if has_key(session, region, name)]
    where = f"held as EC2 key pair {name} in {', '.join(held)}" if held else "not imported yet"
    missing = [r for r in session.regions if r not in held]
    return where + (f"; the first `orch up` in {', '.join(missing)} imports it as {name}" if missing else "")


def default_vpc(session: Session, region: str) -> str:
    with aws(f"describe_vpcs in {region}"):
        vpcs = session.ec2(region).describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
    if not vpcs:
        raise ProviderError(f"{region} has no default VPC for orch's instances: create one "
                            "(aws ec2 create-default-vpc)")
    return vpcs[0]["VpcId"]


def ensure_ssh_group(session: Session, region: str) -> str:
    """orch's security group in the default VPC: port 22 open to ``ssh_cidr``, nothing else."""
    ec2 = session.ec2(region)
    name = str(session.settings.get("security_group") or SECURITY_GROUP)
    cidr = str(session.settings.get("ssh_cidr") or "0.0.0.0/0")
    group = security_group(session, region, name, "orch: SSH (port 22) only")
    extra = [p for p in group.get("IpPermissions", [])
             if not (p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22 and p.get("ToPort") == 22)]
    if extra:
        raise ProviderError(f"security group {name} ({group['GroupId']}) in {region} opens more than port "
                            "22: orch's instances would be reachable on other ports; fix or delete it")
    ssh = [r.get("CidrIp") for p in group.get("IpPermissions", []) for r in p.get("IpRanges") or []]
    if cidr not in ssh:
        authorize(ec2, region, name, group["GroupId"], {
            "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
            "IpRanges": [{"CidrIp": cidr, "Description": "SSH for orch"}]})
    return group["GroupId"]


def security_group(session: Session, region: str, name: str, description: str,
                   tags: dict[str, str] | None = None) -> dict:
    """The security group ``name`` in the default VPC, made (with ``tags``) where it is missing. Another
    orch making it at the same moment (``InvalidGroup.Duplicate``) is looked up again, not an error."""
    ec2 = session.ec2(region)
    vpc = default_vpc(session, region)
    group = _group(ec2, region, name, vpc)
    if group is None:
        extra = {"TagSpecifications": [{"ResourceType": "security-group",
                                        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]} if tags else {}
        try:
            with aws(f"create_security_group {name} in {region}"):
                ec2.create_security_group(GroupName=name, VpcId=vpc, Description=description, **extra)
        except AWSError as e:
            if e.code != "InvalidGroup.Duplicate":  # another orch made it meanwhile: use that one
                raise
        group = _group(ec2, region, name, vpc)
        if group is None:
            raise ProviderError(f"security group {name} in {region} was made but cannot be found: try again")
    return group


def authorize(ec2, region: str, name: str, group_id: str, permission: dict) -> None:
    """One ingress rule added. Create and authorize are two calls: one failed authorize, or a rule
    deleted by hand, leaves a group without its rule (an instance unreachable for the whole SSH
    wait, a group's nodes unable to meet), so every use checks the rule and adds it back; one added
    meanwhile by another orch (``InvalidPermission.Duplicate``) is there, which is what was wanted."""
    try:
        with aws(f"authorize_security_group_ingress on {name} in {region}"):
            ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[permission])
    except AWSError as e:
        if e.code != "InvalidPermission.Duplicate":
            raise


def _group(ec2, region: str, name: str, vpc: str) -> dict | None:
    with aws(f"describe_security_groups in {region}"):
        wanted = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}]
        groups = ec2.describe_security_groups(Filters=wanted).get("SecurityGroups", [])
    return groups[0] if groups else None
