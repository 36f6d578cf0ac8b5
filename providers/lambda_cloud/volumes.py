"""Lambda Cloud filesystems as orch's volumes: made, listed and deleted through Lambda's API v1, and
attached to an instance at its launch.

What Lambda is here comes from its OpenAPI description (https://cloud.lambda.ai/api/v1/openapi.json,
v1.10.0, "Filesystems" and ``launchInstance``):

- ``GET /file-systems`` lists them, ``POST /filesystems {name, region}`` makes one (its name
  ``^[a-zA-Z]+[0-9a-zA-Z-]*$``, at most 60 characters, unique: a second one answers
  ``global/duplicate``), ``DELETE /filesystems/{id}`` deletes one that no running instance mounts
  (else ``filesystems/filesystem-in-use``). A filesystem carries no tags: orch's is its name
  (``model.volume_label``).
- A filesystem is attached at launch only, in its own region
  (``instance-operations/launch/file-system-in-wrong-region``), through ``file_system_names``;
  ``file_system_mounts: [{mount_point, file_system_id}]`` mounts it where asked, but only under
  ``/home``, ``/lambda/nfs`` or ``/data`` (its pattern ``^(/home|/lambda/nfs|/data)[//a-zA-Z0-9-]*$``).
  Elsewhere it is mounted at its default ``mount_point`` (``/lambda/nfs/NAME``), and orch makes the
  path asked a symbolic link to it before anything runs there (``mount_steps``: a
  ``playbooks.volumes.Link``).
- Several instances of the region may mount one at once (it is a network filesystem): a group's
  nodes can share one cache.
- It has no size: it grows, and bills per GB used, $0.20 per GB-month (Lambda's pricing page,
  lambda.ai/pricing, "Persistent storage"; Lambda docs, "Filesystems"). ``create_volume`` answers
  the size orch was asked (its estimate until the listing says more); a listing answers the GB used
  (``bytes_used``, which Lambda updates every few hours), rounded up.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import datetime
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.provider import http
from orchestrator.provider.model import Mount, Offer, Request, Volume, parse_volume_label, volume_label
from playbooks.volumes import Link, Present
from providers.lambda_cloud.api import NOT_FOUND, LambdaError, Session

GB_MONTH = 0.20
DUPLICATE = "global/duplicate"
IN_USE = "filesystems/filesystem-in-use"
MOUNTABLE = re.compile(r"(/home|/lambda/nfs|/data)[/a-zA-Z0-9-]*")  # file_system_mounts' mount_point
DEFAULT_MOUNT = "/lambda/nfs/{name}"


def volume(row: Any, attached: dict[str, list[str]] | None = None) -> Volume | None:
    """A ``/file-systems`` row as orch's ``Volume``; None when it is not orch's."""
    name = parse_volume_label(row.get("name")) if isinstance(row, dict) else None
    if name is None:
        return None
    region = row.get("region") if isinstance(row.get("region"), dict) else {}
    used = row.get("bytes_used")
    try:
        created = datetime.fromisoformat(str(row.get("created")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        created = None
    return Volume(name=name, provider="lambda", volume_id=str(row["id"]), where=str(region.get("name") or ""),
                  size_gb=math.ceil(used / 1e9) if isinstance(used, int) and used > 0 else 0,
                  price_gb_month=GB_MONTH, attached_to=tuple((attached or {}).get(str(row["name"]), ())),
                  created_at=created, raw=dict(row))


def create(api: Session, name: str, size_gb: int, region: str) -> Volume:
    """Make the filesystem. Names are unique at Lambda, so a POST whose answer was lost is safe to
    send again: it makes nothing more, and its ``global/duplicate`` means the first one made it."""
    label, tries = volume_label(name), 0

    def once() -> Any:
        nonlocal tries
        tries += 1
        try:
            return api.once("POST", "/filesystems", {"name": label, "region": region})
        except LambdaError as e:
            if e.code == DUPLICATE and tries > 1:
                return None  # made by the try whose answer was lost
            if e.code == DUPLICATE:
                raise LambdaError(f"Lambda Cloud already has a filesystem named {label}: `orch reconcile` adopts "
                                  "it, or delete it in the Lambda console", code=e.code, status=e.status) from None
            raise

    made = http.call(once, attempts=int(api.number("retries", 5)))
    found = volume(made) if made is not None else next((v for v in list_all(api) if v.name == name), None)
    if found is None:
        raise LambdaError(f"Lambda Cloud made filesystem {label} but does not show it: {str(made)[:200]}")
    return replace(found, size_gb=int(size_gb))


def list_all(api: Session) -> list[Volume]:
    rows = api.call("GET", "/file-systems")
    if not isinstance(rows, list):
        raise LambdaError(f"Lambda Cloud's filesystem listing came back without filesystems: {str(rows)[:200]}")
    instances = api.call("GET", "/instances")
    if not isinstance(instances, list):
        raise LambdaError(f"Lambda Cloud's instance listing came back without instances: {str(instances)[:200]}")
    attached: dict[str, list[str]] = {}
    for inst in instances:
        if isinstance(inst, dict) and inst.get("status") not in ("terminating", "terminated"):
            for fs in inst.get("file_system_names") or []:
                attached.setdefault(str(fs), []).append(str(inst.get("id")))
    return [v for v in (volume(r, attached) for r in rows) if v is not None]


def delete(api: Session, found: Volume) -> None:
    try:
        api.call("DELETE", f"/filesystems/{found.volume_id}")
    except LambdaError as e:
        if e.status == 404 and e.code == NOT_FOUND:
            return  # already gone
        if e.code == IN_USE:
            raise LambdaError(f"Lambda Cloud refuses to delete filesystem {volume_label(found.name)}: an instance "
                              "still mounts it (end that instance first)", code=e.code, status=e.status) from None
        raise


def default_region(types: dict[str, Any]) -> str:
    """Where a filesystem goes when no region is named: the region where most instance types have
    capacity now."""
    count: dict[str, int] = {}
    for item in types.values():
        for r in (item or {}).get("regions_with_capacity_available") or []:
            if isinstance(r, dict) and isinstance(r.get("name"), str):
                count[r["name"]] = count.get(r["name"], 0) + 1
    if not count:
        raise LambdaError("Lambda Cloud has capacity in no region now: name the region of the filesystem")
    return max(count, key=lambda r: (count[r], r))


def reaches(offer: Offer, found: Volume) -> bool:
    return offer.provider == "lambda" and found.where in (offer.raw.get("regions") or [])


def region(request: Request, wanted: str | None) -> str | None:
    """The one region a launch that mounts ``request.mounts`` may go to (their region), checked
    against the region the settings or the group already chose (``wanted``)."""
    regions = {m.volume.where for m in request.mounts}
    if not regions:
        return wanted
    for m in request.mounts:
        if m.volume.provider != "lambda":
            raise UsageError(f"volume {m.volume.name} is {m.volume.provider}'s: a Lambda instance cannot mount it")
    if len(regions) > 1 or (wanted and wanted not in regions):
        where = ", ".join(sorted(regions | ({wanted} if wanted else set())))
        raise UsageError(f"the volumes and the instance must share one Lambda region, not {where}")
    return regions.pop()


def launch_fields(mounts: tuple[Mount, ...]) -> dict[str, Any]:
    """The launch's ``file_system_names``, and ``file_system_mounts`` for the paths Lambda can mount at."""
    if not mounts:
        return {}
    direct = [{"mount_point": m.path, "file_system_id": m.volume.volume_id} for m in mounts
              if MOUNTABLE.fullmatch(m.path)]
    return {"file_system_names": [volume_label(m.volume.name) for m in mounts],
            **({"file_system_mounts": direct} if direct else {})}


def not_mounted(row: dict, mounts: tuple[Mount, ...]) -> list[str]:
    """The filesystems of ``mounts`` that the instance ``row`` (``GET /instances/{id}``) does not list
    in its ``file_system_names`` (Lambda's OpenAPI description, Instance: "The names of the
    filesystems mounted to the instance") while it lists others: another volume where this one was
    asked for. An empty list says nothing (the description does not say when a booting instance
    shows its mounts), so it is no evidence against the launch."""
    shown = row.get("file_system_names") if isinstance(row.get("file_system_names"), list) else []
    if not shown:
        return []
    return [volume_label(m.volume.name) for m in mounts if volume_label(m.volume.name) not in shown]


def mount_steps(mounts) -> list:
    """Mounted at its path where Lambda could; elsewhere a link from the path to its default mount."""
    return [Present(m.path) if MOUNTABLE.fullmatch(m.path) else
            Link(m.path, str(m.volume.raw.get("mount_point") or DEFAULT_MOUNT.format(name=volume_label(m.volume.name))))
            for m in mounts]

