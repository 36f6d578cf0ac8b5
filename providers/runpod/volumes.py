"""RunPod network volumes: made, listed and deleted through RunPod's GraphQL API (the runpod SDK has
no call for them; the queries go through the same session as the pods', ``api.GraphQL``), and
attached to a pod when it is deployed.

- A network volume lives in one data center; a pod that mounts it is deployed there, on Secure
  Cloud, with ``networkVolumeId`` and ``dataCenterId``; it takes the place of the pod's volume
  disk (RunPod docs, "Storage options", docs.runpod.io/pods/storage/types: "Network volume ...
  /workspace (replaces volume disk)"; "Network volumes", docs.runpod.io/storage/network-volumes).
  The mount path is always sent (``volumeMountPath``): left out, the runpod SDK's
  ``create_pod`` mounts a network volume at ``/runpod-volume``, not at ``/workspace``.
- One network volume per pod (the deploy input takes one ``networkVolumeId``).
- GraphQL: ``createNetworkVolume(input: {name, size, dataCenterId})``, ``deleteNetworkVolume(input:
  {id})``, ``myself { networkVolumes { id name size dataCenterId } }`` (dstack's RunPod client,
  src/dstack/_internal/core/backends/runpod/api_client.py, sends the same three); which data
  centers hold network storage and which GPU types are in stock there: ``dataCenters { id name
  storageSupport gpuAvailability { gpuTypeId stockStatus } }``.
- A volume carries no tags: orch's is its name (``model.volume_label``).
- Price: $0.07 per GB-month for the first TB, $0.05 above it (RunPod docs, "Network volumes",
  Pricing; "Storage options": network volume $0.07/GB/month).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.errors import AuthError, ProviderError, UsageError
from orchestrator.provider import http
from orchestrator.provider.model import Offer, Request, Volume, parse_volume_label, volume_label
from providers.runpod.api import GraphQL, GraphQLEnum, MaybeMade, literal

GB_MONTH_FIRST_TB = 0.07
GB_MONTH_ABOVE = 0.05
MIN_GB = 10  # SkyPilot's minimum (sky/provision/runpod/volume.py)
MAX_GB = 4000  # RunPod REST v1 ``POST /networkvolumes``: size at most 4000 GB
VOLUME_FIELDS = "id name size dataCenterId"
LISTING = f"query {{ myself {{ networkVolumes {{ {VOLUME_FIELDS} }} }} }}"
DATA_CENTERS = "query { dataCenters { id name storageSupport gpuAvailability { gpuTypeId stockStatus } } }"
STOCK_SECONDS = 60.0  # how long one answer of ``dataCenters`` stands for the stock (one plan's worth)


def price_gb_month(size_gb: int) -> float:
    """The volume's $/GB-month, its first TB at one price and the rest at the other."""
    first = min(size_gb, 1000)
    return round((first * GB_MONTH_FIRST_TB + max(size_gb - 1000, 0) * GB_MONTH_ABOVE) / max(size_gb, 1), 6)


def volume(row: dict) -> Volume | None:
    """A ``networkVolumes`` row as orch's ``Volume``; None when it is not orch's."""
    name = parse_volume_label(row.get("name")) if isinstance(row, dict) else None
    if name is None:
        return None
    size = int(row.get("size") or 0)
    return Volume(name=name, provider="runpod", volume_id=str(row["id"]), where=str(row.get("dataCenterId") or ""),
                  size_gb=size, price_gb_month=price_gb_month(size), raw=dict(row))


class NetworkVolumes:
    """One account's network volumes, and the stock of its data centers (read at most once a minute)."""

    def __init__(self, api: GraphQL):
        self.api = api
        self._centers: tuple[float, list[dict]] | None = None

    def data_centers(self) -> list[dict]:
        if self._centers is None or time.monotonic() - self._centers[0] > STOCK_SECONDS:
            found = self.api.query(DATA_CENTERS).get("dataCenters")
            if not isinstance(found, list):
                raise ProviderError(f"RunPod's data centers came back as {type(found).__name__}")
            self._centers = (time.monotonic(), [c for c in found if isinstance(c, dict)])
        return self._centers[1]

    def place(self, where: str | None) -> str:
        """The data center a new volume goes to: ``where`` when it holds network storage; else the
        one with network storage that has the most GPU types in stock now."""
        storage = [c for c in self.data_centers() if c.get("storageSupport")]
        if where is not None:
            if not any(c.get("id") == where for c in storage):
                names = ", ".join(sorted(str(c.get("id")) for c in storage)) or "none"
                raise UsageError(f"RunPod has no data center {where!r} with network volumes (those that have "
                                 f"them: {names})")
            return where
        if not storage:
            raise ProviderError("RunPod lists no data center with network volumes")
        return str(max(storage, key=lambda c: (len(_stocked(c)), str(c.get("id"))))["id"])

    def stocked(self, data_center: str, gpu_type: str) -> bool:
        """Whether ``gpu_type`` is in stock in ``data_center`` now."""
        return any(c.get("id") == data_center and gpu_type in _stocked(c) for c in self.data_centers())

    def create(self, name: str, size_gb: int, where: str | None) -> Volume:
        label = volume_label(name)
        center = self.place(where)
        given = literal({"name": label, "size": int(size_gb), "dataCenterId": center})
        mutation = f"mutation {{ createNetworkVolume(input: {given}) {{ {VOLUME_FIELDS} }} }}"

        def once() -> dict | Volume:
            try:
                return self.api.once(mutation)["data"]["createNetworkVolume"]
            except AuthError:
                raise
            except ProviderError as e:
                if not isinstance(e, MaybeMade):
                    raise  # a refusal, or a failure that made nothing (retried when it is transient)
                found = self.find(name)  # RunPod may have made it all the same
                if found is None:
                    raise ProviderError(f"creating RunPod network volume {label} failed ({e}) and it is not "
                                        "listed: orch sends no second create; look in the RunPod console "
                                        "before trying again") from None
                return found

        made = http.call(once, attempts=self.api.attempts, base=self.api.base)
        if isinstance(made, Volume):
            return made
        found = volume(made or {})
        if found is None:
            raise ProviderError(f"RunPod's createNetworkVolume answered without the volume: {str(made)[:200]}")
        return found

    def list(self) -> list[Volume]:
        answer = self.api.query(LISTING)
        rows = (answer.get("myself") or {}).get("networkVolumes") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(f"RunPod's network volume listing came back without volumes: {str(answer)[:200]}")
        return [v for v in (volume(r) for r in rows) if v is not None]

    def find(self, name: str) -> Volume | None:
        return next((v for v in self.list() if v.name == name), None)

    def delete(self, found: Volume) -> None:
        mutation = f"mutation {{ deleteNetworkVolume(input: {{id: {literal(found.volume_id)}}}) }}"
        try:
            self.api.query(mutation)
        except AuthError:
            raise
        except ProviderError:
            if any(v.volume_id == found.volume_id for v in self.list()):
                raise
            # already gone: deleting it again is no error


def _stocked(center: dict) -> set[str]:
    return {str(g.get("gpuTypeId")) for g in center.get("gpuAvailability") or []
            if isinstance(g, dict) and g.get("stockStatus") not in (None, "", "None")}


def reaches(volumes: NetworkVolumes, offer: Offer, found: Volume) -> bool:
    """An offer (a GPU type, listed for no data center) reaches the volume when that type is in
    stock in the volume's data center now."""
    if offer.provider != "runpod":
        return False
    if offer.location:
        return offer.location == found.where
    return volumes.stocked(found.where, offer.offer_id)


def deploy_fields(request: Request) -> dict[str, Any]:
    """What a pod's deploy input gains to mount ``request.mounts`` (at most one network volume):
    the volume, its data center, Secure Cloud, the mount path. Empty without mounts."""
    if not request.mounts:
        return {}
    if len(request.mounts) > 1:
        raise UsageError("a RunPod pod mounts one network volume: name one volume")
    mount = request.mounts[0]
    if mount.volume.provider != "runpod":
        raise UsageError(f"volume {mount.volume.name} is {mount.volume.provider}'s: a RunPod pod cannot mount it")
    # Network volumes are Secure Cloud only (RunPod docs, "Network volumes").
    return {"networkVolumeId": mount.volume.volume_id, "dataCenterId": mount.volume.where,
            "volumeMountPath": mount.path, "cloudType": GraphQLEnum("SECURE")}
