"""An instance row of Lambda's API (``GET /instances``, ``/instances/{id}``) as orch's ``Remote``."""

from __future__ import annotations

from orchestrator.provider import Endpoint, Remote, Status
from providers.lambda_cloud.offers import gpu_from_description

# Instance fields that are a login to the instance (Lambda's OpenAPI description, Instance: "the
# secret token used to log into the JupyterLab server"): never kept.
SECRET_FIELDS = ("jupyter_token", "jupyter_url")
# Lambda's InstanceStatus (OpenAPI description: booting, active, unhealthy, terminated, terminating,
# preempted). "unhealthy" is decided by ``health.Unhealthy`` (wait, one restart, then broken).
# "preempted" (taken back by Lambda) will not run again, but it is not gone until Lambda says
# ``terminated``: until then it is listed, and it may bill. So it is broken (``Remote.preempted``
# says why): the reaper destroys a broken instance, and its row ends only once the terminate is
# confirmed (``GET /instances/{id}`` no longer knows it).
STATES = {"booting": Status.PENDING, "active": Status.RUNNING, "unhealthy": Status.PENDING,
          "terminating": Status.PENDING, "terminated": Status.GONE, "preempted": Status.BROKEN}


def remote_from(row: dict, status: Status, detail: str, user: str) -> Remote:
    """The instance ``row`` shows, seen as ``status`` (``detail``: the word for it); its secrets dropped."""
    itype = row.get("instance_type") if isinstance(row.get("instance_type"), dict) else {}
    gpu, _ = gpu_from_description(str(itype.get("gpu_description") or ""))
    cents = itype.get("price_cents_per_hour")
    ip = row.get("ip") if isinstance(row.get("ip"), str) else None
    endpoint = Endpoint(ip.strip(), 22, user) if status == Status.RUNNING and ip and ip.strip() else None
    label = row.get("name") if isinstance(row.get("name"), str) else ""
    region = row.get("region") if isinstance(row.get("region"), dict) else {}
    return Remote(
        provider_id=str(row.get("id")), label=label, status=status, endpoint=endpoint,
        price_hr=cents / 100 if isinstance(cents, (int, float)) else None, stopped_price_hr=None,
        gpu_name=gpu if itype else None, gpus=int((itype.get("specs") or {}).get("gpus") or 0),
        # Lambda sells no spot, yet lists "preempted" among an instance's states: taken back by Lambda.
        preempted=row.get("status") == "preempted",
        private_ip=row.get("private_ip") if isinstance(row.get("private_ip"), str) else None,
        detail=detail + (f" in {region.get('name')}" if region.get("name") else ""),
        raw={k: v for k, v in row.items() if k not in SECRET_FIELDS},
    )
