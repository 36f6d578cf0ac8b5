"""A Vast.ai instance row as orch sees it: one ``Status``, what it bills, and its SSH routes."""

from __future__ import annotations

from orchestrator.errors import ProviderError
from orchestrator.provider import Endpoint, Remote, Status, stopped_rate
from providers.vastai.offers import VAST_HOURS_PER_MONTH, number

# actual_status values of an instance that will not run by itself and may bill as running (Vast.ai
# docs, CLI reference "show instance"; the SDK's SKILL.md: "If actual_status becomes exited, unknown,
# or offline it will never reach running"; its status table: frozen "Paused with memory — GPU charges apply").
_BROKEN = {"exited": "exited: the container's process died",
           "offline": "offline: its host dropped off Vast.ai",
           "unknown": "unknown: no heartbeat from its host",
           "frozen": "frozen: paused with its memory kept, GPU charges apply"}
# The direct SSH route (``public_ipaddr`` + ``ports["22/tcp"]``) is often firewalled while the proxy
# (``ssh_host``/``ssh_port``) works (SkyPilot's Vast provisioner connects through ``ssh_port``:
# github.com/skypilot-org/skypilot, sky/provision/vast/utils.py): ``remote`` offers both routes, the
# direct one with a short grace, and ``orchestrator.ssh.reach`` takes the first that answers. Said when the
# proxy answers where the direct route (often firewalled: it accepts and never speaks) did not within
# its grace.
PROXY_NOTE = "the direct SSH route does not answer: using Vast.ai's SSH proxy"


def vast_id(provider_id: str) -> int:
    try:
        return int(provider_id)
    except (TypeError, ValueError):
        raise ProviderError(f"{provider_id!r} is not a Vast.ai instance id") from None


def remote(row: dict, user: str, direct_grace: float) -> Remote:
    """The instance in ``row``; running, its routes are the direct one (given ``direct_grace`` to say
    its SSH banner) then Vast's SSH proxy. Nothing is kept: the ledger keeps the route that answered."""
    status, detail = _status(row)
    routes = []
    if status == Status.RUNNING:
        routes = [r for r in (_direct(row, user, direct_grace), _proxy(row, user)) if r]
    return Remote(
        provider_id=str(row["id"]), label=row.get("label") or "", status=status, detail=detail,
        endpoint=routes[0] if routes else None, routes=routes,
        price_hr=row.get("dph_total"), stopped_price_hr=_storage_hr(row),
        gpu_name=row.get("gpu_name"), gpus=int(row.get("num_gpus") or 0), spot=bool(row.get("is_bid")),
        # The user's environment (tokens, perhaps) stays out of anything orch might record.
        raw={k: v for k, v in row.items() if k not in ("extra_env", "onstart")},
    )


def _status(row: dict) -> tuple[Status, str]:
    """Vast's three status fields as one ``Status`` and the word for it (Vast.ai docs, CLI reference
    "show instance"): ``actual_status`` the container, ``intended_status`` what was asked for,
    ``cur_state`` the machine contract (``unloaded`` once destroyed)."""
    actual, intended, contract = row.get("actual_status"), row.get("intended_status"), row.get("cur_state")
    if contract == "unloaded":
        return Status.GONE, "unloaded"
    if intended == "stopped":
        # Stopped by someone, or outbid (dstack: cur_state, intended_status and next_state all
        # stopped), whatever the container reads (SkyPilot takes exited for stopped too).
        if actual == "running":
            return Status.PENDING, "stopping"
        return Status.STOPPED, actual or "stopped"
    if actual in _BROKEN or intended == "frozen":
        return Status.BROKEN, _BROKEN.get(actual, _BROKEN["frozen"])
    if actual == "running":
        return Status.RUNNING, "running"
    if actual == "scheduling" or (contract == "stopped" and actual in (None, "stopped", "created")):
        # A start accepted and no machine allocated yet: it waits for its host to free the GPU
        # (Vast.ai docs, CLI reference "start instance": the "scheduling" state).
        return Status.SCHEDULING, "scheduling: waits for its host to free a GPU"
    return Status.PENDING, actual or "provisioning"  # created, loading, rebooting, or null


def _storage_hr(row: dict) -> float | None:
    """What the instance bills stopped: its own storage_total_cost where given, else its disk over
    Vast's 720-hour month."""
    given = number(row.get("storage_total_cost"))
    if given is not None:
        return given
    disk, per_gb = number(row.get("disk_space")), number(row.get("storage_cost"))
    return stopped_rate(disk, per_gb, VAST_HOURS_PER_MONTH) if disk is not None and per_gb is not None else None


def _direct(row: dict, user: str, grace: float) -> Endpoint | None:
    ip = (row.get("public_ipaddr") or "").strip()
    try:
        port = int(((row.get("ports") or {}).get("22/tcp") or [{}])[0]["HostPort"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return Endpoint(ip, port, user, grace=grace) if ip else None


def _proxy(row: dict, user: str) -> Endpoint | None:
    host, port = (row.get("ssh_host") or "").strip(), row.get("ssh_port")
    return Endpoint(host, int(port), user, fallback_note=PROXY_NOTE) if host and port else None
