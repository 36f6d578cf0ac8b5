"""RunPod network volumes through REST API v2: made, listed and deleted (``/v2/network-volumes``),
and mounted on a pod when it is created (``mounts.network``).

- A network volume lives in one data center; a pod that mounts it runs there, on Secure Cloud
  (RunPod docs, "Network volumes", docs.runpod.io/storage/network-volumes; NetworkMount: "ID of an
  existing NetworkVolume in the same data center as the pod"). It takes the place of the pod's
  volume disk (``mounts``: persistent and network are mutually exclusive) at the path given (v2
  NetworkMount.path: "No default; must be specified explicitly"). One per pod (``network`` has
  ``maxItems`` 1).
- ``POST /v2/network-volumes {name, size, dataCenter}``: size 10 to 4096 GB (v2 OpenAPI,
  CreateNetworkVolumeRequest; GraphQL took 1 GB, v2 does not); ``GET /v2/network-volumes`` (wrapped:
  ``{"networkVolumes": [...]}``), ``DELETE /v2/network-volumes/{id}``. Names are "not required to be
  unique" (NetworkVolume.name), and a volume carries no tags: orch's is its name
  (``model.volume_label``). So a create is never sent twice blindly: a name already listed is that
  volume; a create whose answer was lost is looked for by its name before anything else.
- A volume's listing names no pod: the pods that mount it are those whose ``mounts.network`` names
  it (``GET /v2/pods``), and ``attached_to`` is read from there.
- Which data centers hold network volumes: ``GET /v2/catalog/datacenters`` (``networkVolumeTypes``
  non-empty); which GPU types are in stock there: the catalog (``offers``).
- Price: $0.07 per GB-month for the first TB, $0.05 above it (RunPod docs, "Network volumes",
  Pricing; "Storage options": network volume $0.07/GB/month).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.errors import ProviderError, UsageError
from orchestrator.provider.model import Offer, Request, Volume, parse_volume_label, volume_label
from providers.runpod.api import NotFound, Rest, create_once, path_id

GB_MONTH_FIRST_TB = 0.07
GB_MONTH_ABOVE = 0.05
MIN_GB = 10  # v2 CreateNetworkVolumeRequest.size: minimum 10
MAX_GB = 4096  # v2 CreateNetworkVolumeRequest.size: maximum 4096
CENTERS_SECONDS = 60.0  # how long one answer of the data centers stands (one plan's worth)
LOOKUP_SECONDS = 30.0  # how long a volume whose create answer was lost is looked for


def price_gb_month(size_gb: int) -> float:
    """The volume's $/GB-month, its first TB at one price and the rest at the other."""
    first = min(size_gb, 1000)
    return round((first * GB_MONTH_FIRST_TB + max(size_gb - 1000, 0) * GB_MONTH_ABOVE) / max(size_gb, 1), 6)


def volume(row: dict, attached: dict[str, list[str]] | None = None) -> Volume | None:
    """A v2 network volume as orch's ``Volume``; None when it is not orch's. (``dataCenterId``: a
    ledger row from GraphQL days.)"""
    name = parse_volume_label(row.get("name")) if isinstance(row, dict) else None
    if name is None:
        return None
    size = int(row.get("size") or 0)
    vid = str(row["id"])
    return Volume(name=name, provider="runpod", volume_id=vid,
                  where=str(row.get("dataCenter") or row.get("dataCenterId") or ""), size_gb=size,
                  price_gb_month=price_gb_month(size), attached_to=tuple((attached or {}).get(vid, ())), raw=dict(row))


def mounted_by(pods: list[dict]) -> dict[str, list[str]]:
    """Volume id -> the pods whose ``mounts.network`` names it."""
    found: dict[str, list[str]] = {}
    for pod in pods:
        mounts = pod.get("mounts") if isinstance(pod, dict) and isinstance(pod.get("mounts"), dict) else {}
        for m in mounts.get("network") or []:
            if isinstance(m, dict) and m.get("volumeId") and pod.get("status") != "TERMINATED":
                found.setdefault(str(m["volumeId"]), []).append(str(pod.get("id")))
    return found


class NetworkVolumes:
    """One account's network volumes, and its data centers that hold them (read at most once a minute)."""

    def __init__(self, api: Rest, list_pods, lookup_seconds: float = LOOKUP_SECONDS, poll: float = 2.0):
        self.api, self.list_pods = api, list_pods  # list_pods: every pod's v2 answer, cluster members too
        self.lookup_seconds, self.poll = lookup_seconds, poll
        self._centers: tuple[float, list[dict]] | None = None

    def data_centers(self) -> list[dict]:
        if self._centers is None or time.monotonic() - self._centers[0] > CENTERS_SECONDS:
            found = self.api.call("GET", "/catalog/datacenters")
            rows = found.get("dataCenters") if isinstance(found, dict) else None
            if not isinstance(rows, list):
                raise ProviderError(f"RunPod's data centers came back without data centers: {str(found)[:200]}")
            self._centers = (time.monotonic(), [c for c in rows if isinstance(c, dict)])
        return self._centers[1]

    def place(self, where: str | None, stocked: dict[str, int] | None = None) -> str:
        """The data center a new volume goes to: ``where`` when it holds network volumes; else the one
        with network volumes where most GPU types are in stock now (``stocked``: id -> how many)."""
        storage = sorted(str(c.get("id")) for c in self.data_centers() if c.get("networkVolumeTypes"))
        if where is not None:
            if where not in storage:
                raise UsageError(f"RunPod has no data center {where!r} with network volumes (those that have "
                                 f"them: {', '.join(storage) or 'none'})")
            return where
        if not storage:
            raise ProviderError("RunPod lists no data center with network volumes")
        return max(storage, key=lambda c: ((stocked or {}).get(c, 0), c))

    def create(self, name: str, size_gb: int, center: str) -> Volume:
        """Made once: a volume of that name already listed is that one; a create whose answer is an
        error RunPod may have acted on is looked for by its name, never sent again blindly (issue:
        names are not unique at RunPod, and a second copy would bill unseen)."""
        label = volume_label(name)
        given = {"name": label, "size": int(size_gb), "dataCenter": center}
        already = self.find(name)
        if already is not None:
            return already

        made = create_once(lambda: self.api.once("POST", "/network-volumes", given),
                           lambda: self.find(name, with_pods=False), f"RunPod network volume {label}",
                           self.lookup_seconds, self.poll, self.api.attempts, self.api.base)
        if isinstance(made, Volume):
            return made
        found = volume(made or {})
        if found is None:
            raise ProviderError(f"RunPod's network volume create answered without the volume: {str(made)[:200]}")
        return found

    def list(self, with_pods: bool = True) -> list[Volume]:
        answer = self.api.call("GET", "/network-volumes")
        rows = answer.get("networkVolumes") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(f"RunPod's network volume listing came back without volumes: {str(answer)[:200]}")
        mine = [r for r in rows if isinstance(r, dict) and parse_volume_label(r.get("name")) is not None]
        attached = mounted_by(self.list_pods()) if with_pods and mine else {}
        return [v for v in (volume(r, attached) for r in mine) if v is not None]

    def find(self, name: str, with_pods: bool = True) -> Volume | None:
        return next((v for v in self.list(with_pods) if v.name == name), None)

    def delete(self, found: Volume) -> None:
        try:
            self.api.call("DELETE", f"/network-volumes/{path_id(found.volume_id)}")
        except NotFound:
            pass  # already gone: deleting it again is no error


def reaches(offer: Offer, found: Volume) -> bool:
    """An offer (a GPU type in one cloud, with the data centers that have it in stock) reaches the
    volume when it is a Secure Cloud offer in stock in the volume's data center: the pod will run
    there, at that price."""
    return (offer.provider == "runpod" and offer.raw.get("cloud") == "SECURE"
            and found.where in (offer.raw.get("dataCenters") or ()))


def network_mount(request: Request) -> dict[str, Any] | None:
    """v2's ``mounts.network`` entry for ``request.mounts`` (at most one network volume); None without."""
    if not request.mounts:
        return None
    if len(request.mounts) > 1:
        raise UsageError("a RunPod pod mounts one network volume: name one volume")
    mount = request.mounts[0]
    if mount.volume.provider != "runpod":
        raise UsageError(f"volume {mount.volume.name} is {mount.volume.provider}'s: a RunPod pod cannot mount it")
    return {"volumeId": mount.volume.volume_id, "path": mount.path}


def volume_center(request: Request) -> str | None:
    """The data center of the network volume ``request`` mounts (None without one)."""
    return request.mounts[0].volume.where if request.mounts else None
