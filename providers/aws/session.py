"""boto3, as orch asks it: one session, one EC2 client per region, the regions orch works in
(configured, and remembered where it has created), and boto3's errors as orch's.

Credentials and region are read the way every AWS tool reads them (environment, ``~/.aws``, a
profile); ``AWS_ENDPOINT_URL`` (boto3's own) points it elsewhere."""

from __future__ import annotations

import json
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.errors import AuthError, NoCapacity, ProviderError

DEFAULT_REGION = "us-east-1"
REGIONS_FILE = "aws-regions.json"  # in orch's home: every region orch has created an instance in
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")  # us-east-1, ap-southeast-2, us-gov-west-1

_AUTH_CODES = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch",
               "ExpiredToken", "OptInRequired", "RequestExpired"}
# No machine for this request now, here (EC2 API "Error codes"): another zone, region or provider may have
# one. These are no capacity, so a job moves on.
NO_CAPACITY = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
               "InsufficientReservedInstanceCapacity", "UnfulfillableCapacity", "SpotMaxPriceTooLow"}
# "The specified request is unsupported" (EC2 API "Error codes", ``Unsupported``: "for example, you might be
# trying to launch an instance in an Availability Zone that currently has constraints on that instance type"):
# not this zone, so a launch tries the next one; but no capacity error, since a request EC2 does not support
# anywhere would otherwise pass for a full market and send a job from offer to offer (``launch.launch``).
UNSUPPORTED = "Unsupported"
# The account's limit, not the cloud's stock: one line naming the Service Quotas quota (by instance
# family and market) and how to raise it (``quota_line``).
QUOTA = {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded"}
# Service Quotas' EC2 quotas by instance family bucket: (on-demand name, code), (spot name, code).
QUOTAS = {
    "G": (("Running On-Demand G and VT instances", "L-DB2E81BA"), ("All G and VT Spot Instance Requests", "L-3819A6DF")),
    "P": (("Running On-Demand P instances", "L-417A185B"), ("All P Spot Instance Requests", "L-7212CCBC")),
    "Standard": (("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "L-1216C47A"),
                 ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "L-34B43A08")),
}


class AWSError(ProviderError):
    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class QuotaExceeded(AWSError):
    """The account's EC2 quota, not the cloud's stock: raising it is the user's step."""


def error_code(e) -> str:
    return str((getattr(e, "response", None) or {}).get("Error", {}).get("Code") or "")


@contextmanager
def aws(what: str):
    """boto3's exceptions as orch's errors, each with what was being done."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

    try:
        yield
    except (NoCredentialsError, PartialCredentialsError) as e:
        raise AuthError(f"no usable AWS credentials ({what}): {e}; set them as the AWS CLI reads them "
                        "(environment, ~/.aws/credentials, a profile)") from None
    except ClientError as e:
        code = error_code(e)
        message = e.response.get("Error", {}).get("Message") or str(e)
        if code in _AUTH_CODES:
            raise AuthError(f"AWS refused the credentials ({what}): {code}: {message}") from None
        if code in NO_CAPACITY:
            raise NoCapacity(f"AWS has no capacity ({what}): {code}: {message}") from None
        raise AWSError(f"AWS refused {what}: {code}: {message}", code=code) from None
    except BotoCoreError as e:
        raise ProviderError(f"cannot reach AWS ({what}): {e}") from None


def family(itype: str) -> str:
    return itype.split(".", 1)[0]


def quota_line(code: str, itype: str, region: str, spot: bool) -> str:
    """One line: which quota stopped the create, and how to raise it."""
    fam = family(itype)
    bucket = "G" if fam[0] in "gv" else "P" if fam[0] == "p" else "Standard"
    name, quota = QUOTAS[bucket][1 if spot else 0]
    return (f"AWS refused {itype} in {region}: the account's quota \"{name}\" ({quota}, counted in vCPUs) is "
            f"used up ({code}). Raise it in the Service Quotas console (Amazon EC2, {region}), or `aws "
            f"service-quotas request-service-quota-increase --service-code ec2 --quota-code {quota} --desired-value "
            f"VCPUS --region {region}`; new accounts start at 0 for GPU instances")


def credentials_found(settings: dict[str, Any]) -> bool:
    """Credentials as the AWS tools find them, looked for without importing boto3 (an instance
    role on EC2 is not seen here: name a profile or region in [providers.aws] to say it is there)."""
    env = os.environ
    if any(env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        return True
    if any(k != "spot_margin" for k in settings):  # a [providers.aws] section (spot_margin is orch's)
        return True
    files = (env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials", env.get("AWS_CONFIG_FILE") or
             "~/.aws/config")
    return any(os.path.exists(os.path.expanduser(f)) for f in files)


class Session:
    """boto3's session (made at the first call, so that importing orch imports no boto3), an EC2
    client per region, and where orch looks: the configured regions and those it has created in."""

    def __init__(self, settings: dict[str, Any], home=None, retries: int = 5):
        self.settings, self.home, self.retries = settings, home, retries
        self._lock = threading.Lock()
        self._boto = None
        self._clients: dict[str, Any] = {}

    @property
    def boto(self):
        import boto3

        with self._lock:
            if self._boto is None:
                from botocore.exceptions import ProfileNotFound

                try:
                    self._boto = boto3.session.Session(profile_name=self.settings.get("profile"))
                except ProfileNotFound as e:
                    raise AuthError(f"AWS profile not found ({e}): check profile under [providers.aws] or "
                                    "AWS_PROFILE") from None
            return self._boto

    def ec2(self, region: str):
        from botocore.config import Config

        session = self.boto
        with self._lock:
            if region not in self._clients:
                self._clients[region] = session.client("ec2", region_name=region, config=Config(
                    retries={"mode": "standard", "max_attempts": self.retries},
                    connect_timeout=15, read_timeout=60))
            return self._clients[region]

    # -- regions -------------------------------------------------------------------------
    @property
    def region(self) -> str:
        return self.settings.get("region") or self.boto.region_name or DEFAULT_REGION

    @property
    def regions(self) -> list[str]:
        return list(dict.fromkeys([*(self.settings.get("regions") or []), self.region]))

    def created_in(self) -> list[str]:
        """Regions orch has created instances in (remembered in orch's home), which may lie outside
        ``regions``: an instance is made where its offer is (``--offer us-west-2:g5.xlarge``), and a
        listing that skipped them would never see, nor adopt, what is there. Listing, lookup and
        adoption look there too."""
        if not self.home:
            return []
        try:
            found = json.loads((Path(self.home) / REGIONS_FILE).read_text())
        except (OSError, ValueError):
            return []
        return [r for r in found if isinstance(r, str) and REGION.fullmatch(r)] if isinstance(found, list) else []

    def remember_region(self, region: str) -> None:
        """Written before the create (intent first): a crash right after it still leaves the region known.

        A group's nodes, and other orch processes, write at the same moment: the file is read and
        written again under an exclusive lock (``flock`` on a lock file beside it, one open file per
        caller, so threads of one process exclude each other too), through a temporary file of the
        caller's own, renamed over it (atomic: a reader sees the old list or the new one, never none)."""
        if not self.home or region in self.regions or region in self.created_in():
            return
        import fcntl
        import tempfile

        path = Path(self.home) / REGIONS_FILE
        with open(path.with_name(f".{REGIONS_FILE}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = self.created_in()
            if region in known:
                return
            fd, tmp = tempfile.mkstemp(prefix=f".{REGIONS_FILE}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(sorted({*known, region})))
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    @property
    def listed_regions(self) -> list[str]:
        """Where ``list`` looks: the configured regions and every one orch has created in."""
        return list(dict.fromkeys([*self.regions, *self.created_in()]))
