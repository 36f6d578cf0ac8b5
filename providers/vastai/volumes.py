"""Vast.ai local volumes as orch's volumes: rented from a volume offer on one machine, listed and
deleted through the ``vastai`` SDK, linked to an instance when it is created on that machine.

What Vast is here (Vast.ai docs, "Volumes", docs.vast.ai/guides/instances/storage/volumes; its API
reference, "search volumes" ``POST /api/v0/volumes/search/``, "rent volume" ``PUT /api/v0/volumes/``,
"list volumes" ``GET /api/v0/volumes/``, "delete volume" ``DELETE /api/v0/volumes/``; "create
instance"'s ``volume_info``):

- A volume is local to the physical machine it was made on: only an instance on that same machine
  can mount it, so the offers for such an instance are searched on that machine only
  (``on_machine``). If the machine is full or offline, the volume's data is out of reach there.
- It is made from a volume offer of that machine (``search volumes``, filtered on ``machine_id``),
  its size fixed at creation; the answer names it ``V.<id>``. Its name is letters, digits and
  underscores (at most 64): orch's label with each hyphen written as an underscore.
- An instance links it at creation (``volume_info {create_new: false, volume_id, mount_path}``; the
  SDK's ``link_volume`` and ``mount_path``), one volume per instance, mounted at the path asked.
- It is deleted only once no instance uses it (destroyed, not stopped).
- Price: the host's ``storage_cost`` per GB-month of Vast's 720-hour month; a listed volume carries
  its ``storage_total_cost`` per hour, from which orch gives $/GB-month over its own 730-hour month.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from orchestrator.errors import AuthError, ProviderError, UsageError
from orchestrator.provider.model import HOURS_PER_MONTH, Offer, Request, Volume, parse_volume_label, volume_label
from providers.vastai.api import VastError

VAST_HOURS_PER_MONTH = 720.0
GONE = "no_such_volume"
_NAMED = re.compile(r"V\.(\d+)")


def label(name: str) -> str:
    """Vast's name for orch's volume ``name`` (Vast's names have no hyphens)."""
    return volume_label(name).replace("-", "_")


def volume(row: Any) -> Volume | None:
    """A ``show volumes`` row as orch's ``Volume``; None when it is not orch's."""
    name = parse_volume_label(str(row.get("label") or "").replace("_", "-")) if isinstance(row, dict) else None
    if name is None:
        return None
    size = float(row.get("disk_space") or 0)
    per_hour = row.get("storage_total_cost")
    price = (float(per_hour) * HOURS_PER_MONTH / size if isinstance(per_hour, (int, float)) and size else None)
    users = tuple(str(i.get("id") if isinstance(i, dict) else i) for i in row.get("instances") or [])
    return Volume(name=name, provider="vastai", volume_id=str(row["id"]), where=str(row.get("machine_id") or ""),
                  size_gb=int(round(size)), price_gb_month=round(price, 6) if price is not None else None,
                  attached_to=users, created_at=row.get("start_date"), raw=dict(row))


Call = Callable[[Callable[[], Any], str], Any]


def create(sdk, call: Call, once: Call, name: str, size_gb: int, where: str | None) -> Volume:
    """Rent the cheapest volume offer on machine ``where`` big enough for ``size_gb``. The rent is
    sent once (``once``: a rent sent again could rent twice); after any error the volume is looked
    for by its name before the error stands."""
    if where is None or not str(where).isdigit():
        raise UsageError("a Vast.ai volume lives on one machine: name it (the machine_id of an offer, shown by "
                         "`vastai search offers`), e.g. --region 12345")
    query = {"machine_id": {"eq": int(where)}, "disk_space": {"gte": float(size_gb)}}
    offers = call(lambda: sdk.search_volumes(query=query, order=[["storage_cost", "asc"]], storage=float(size_gb)),
                  "volume offer search")
    if not isinstance(offers, list):
        raise VastError(f"Vast.ai's volume offer search answered {type(offers).__name__}, not a list")
    if not offers:
        raise ProviderError(f"Vast.ai machine {where} offers no volume of {size_gb} GB now (full, offline or "
                            "unverified): choose another machine")
    try:
        answer = once(lambda: sdk.create_volume(int(offers[0]["id"]), size=size_gb, name=label(name)), "volume rent")
    except AuthError:
        raise
    except ProviderError as e:
        found = next((v for v in list_all(sdk, call) if v.name == name), None)
        if found is None:
            raise e from None
        return found
    made = _NAMED.fullmatch(str((answer or {}).get("volume_name") or "")) if isinstance(answer, dict) else None
    found = next((v for v in list_all(sdk, call) if (made and v.volume_id == made[1]) or v.name == name), None)
    if found is None:
        raise VastError(f"Vast.ai rented volume {label(name)} but does not list it: {str(answer)[:200]}")
    return found


def list_all(sdk, call: Call) -> list[Volume]:
    rows = call(lambda: sdk.show_volumes(type="local"), "volume listing")
    if not isinstance(rows, list):
        raise VastError(f"Vast.ai's volume listing answered {type(rows).__name__}, not a list")
    return [v for v in (volume(r) for r in rows) if v is not None]


def delete(sdk, call: Call, found: Volume) -> None:
    try:
        call(lambda: sdk.delete_volume(int(found.volume_id)), f"delete of volume {found.volume_id}")
    except VastError as e:
        if e.code == GONE or e.status == 404:
            return  # already gone
        raise


def reaches(offer: Offer, found: Volume) -> bool:
    return offer.provider == "vastai" and str(offer.raw.get("machine_id")) == found.where


def on_machine(args: dict, request: Request) -> dict:
    """The offer search's arguments, kept to the machine the request's volume is on."""
    if request.mounts:
        args["query"] = {**args["query"], "machine_id": {"eq": int(_one(request).volume.where)}}
    return args


def create_args(request: Request) -> dict[str, Any]:
    """What ``create_instance`` gains to link the request's volume at its path."""
    if not request.mounts:
        return {}
    mount = _one(request)
    return {"link_volume": int(mount.volume.volume_id), "mount_path": mount.path}


def _one(request: Request):
    if len(request.mounts) > 1:
        raise UsageError("a Vast.ai instance links one volume: name one volume")
    mount = request.mounts[0]
    if mount.volume.provider != "vastai":
        raise UsageError(f"volume {mount.volume.name} is {mount.volume.provider}'s: a Vast.ai instance cannot mount it")
    return mount
