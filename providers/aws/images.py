"""The AMI an instance boots: the one named (``--image``, ``ami``), else the newest Deep Learning
AMI (OSS Nvidia driver, PyTorch) that Amazon publishes in the region."""

from __future__ import annotations

from orchestrator.errors import ProviderError
from providers.aws.session import Session, aws

DEFAULT_AMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu *) *"
DEFAULT_AMI_OWNER = "amazon"


def image(session: Session, region: str, wanted: str | None) -> dict:
    settings = session.settings
    ec2 = session.ec2(region)
    ami = wanted or settings.get("ami")
    with aws(f"describe_images in {region}"):
        if ami:
            images = ec2.describe_images(ImageIds=[ami]).get("Images", [])
        else:
            images = ec2.describe_images(Owners=[settings.get("ami_owner") or DEFAULT_AMI_OWNER], Filters=[
                {"Name": "name", "Values": [settings.get("ami_name") or DEFAULT_AMI_NAME]},
                {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]}]).get("Images", [])
    if not images:
        what = ami or f"named {settings.get('ami_name') or DEFAULT_AMI_NAME!r}"
        raise ProviderError(f"no AMI {what} in {region}: set ami under [providers.aws] (or --image ami-...)")
    return max(images, key=lambda i: i.get("CreationDate") or "")


def snapshot_gb(image: dict) -> int:
    """The size of the AMI's root snapshot: the least root volume it boots on."""
    root = image.get("RootDeviceName")
    for bdm in image.get("BlockDeviceMappings") or []:
        if bdm.get("DeviceName") == root:
            return int((bdm.get("Ebs") or {}).get("VolumeSize") or 0)
    return 0
