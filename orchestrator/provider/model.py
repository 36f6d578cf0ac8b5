"""The words a provider and the core share: what is asked (``Request``), what is shown
(``Remote``, ``Status``, ``Endpoint``), what is offered (``Offer``), and orch's tag."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

TAG = "orch"
# The whole label: fullmatch, so a name with a trailing newline never passes.
_LABEL = re.compile(rf"{TAG}-(?P<id>[0-9a-f]{{12}})-(?P<name>[a-z0-9][a-z0-9-]{{0,39}})")

# Volume and container storage bill per GB-month; orch counts a month as 730 hours (365 × 24 / 12),
# the figure the stop-vs-destroy arithmetic is written in. A provider that divides by another month
# (Vast.ai: 720 h) says so through its own prices.
HOURS_PER_MONTH = 730.0

Progress = Callable[[str], None]


def label_for(instance_id: str, name: str) -> str:
    """The provider-side name of an instance: orch's tag, the ledger id, the user's name."""
    return f"{TAG}-{instance_id}-{name}"


def parse_label(label: str | None) -> tuple[str, str] | None:
    """(ledger id, name) from a provider-side label, or None when it is not orch's."""
    m = _LABEL.fullmatch(label or "")
    return (m["id"], m["name"]) if m else None


# A volume's provider-side name: orch's tag, "vol", orch's name for it (what ``orch volume create``
# was given). Names at the providers are letters, digits and hyphens (Lambda's filesystems:
# ``^[a-zA-Z]+[0-9a-zA-Z-]*$``, at most 60); Vast.ai's are letters, digits and underscores, and its
# provider writes each hyphen as an underscore (``providers/vastai/volumes``).
_VOLUME = re.compile(rf"{TAG}-vol-(?P<name>[a-z0-9][a-z0-9-]{{0,39}})")


def volume_label(name: str) -> str:
    """The provider-side name of orch's volume ``name``."""
    return f"{TAG}-vol-{name}"


def parse_volume_label(label: str | None) -> str | None:
    """orch's name of a volume from its provider-side name, or None when it is not orch's."""
    m = _VOLUME.fullmatch(label or "")
    return m["name"] if m else None


def key_name(public_key: str) -> str:
    """The name orch gives its SSH key in a provider account that holds keys: ``orch-`` and its
    fingerprint, so another key never collides with it."""
    import base64
    import hashlib

    try:
        blob = base64.b64decode(public_key.split()[1])
    except (IndexError, ValueError):
        blob = public_key.encode()
    return "orch-" + hashlib.sha256(blob).hexdigest()[:12]


def stopped_rate(disk_gb: float, per_gb_month: float, hours_per_month: float = HOURS_PER_MONTH) -> float:
    """What a stopped machine's disk bills per hour: GB × $/GB-month / hours in a month."""
    return disk_gb * per_gb_month / hours_per_month


def bid_with_margin(minimum_per_gpu: float, margin: float) -> float:
    """A spot bid per GPU: the live minimum plus ``margin``, rounded up to a tenth of a cent so the
    margin never rounds below the minimum (the inner round drops float noise: 0.40 × 1.05 × 1000
    is 420.00000000000006)."""
    return math.ceil(round(minimum_per_gpu * (1 + margin) * 1000, 6)) / 1000


class Status(Enum):
    """What a provider says of an instance right now. Not a ledger state (``states``): ``sync``
    turns one into the other, and an Enum never compares equal to a state's string by accident."""

    PENDING = "pending"        # being made or booting
    RUNNING = "running"
    SCHEDULING = "scheduling"  # a start was accepted; the host has no GPU free for it yet
    STOPPED = "stopped"
    BROKEN = "broken"          # the container exited or the host dropped: it will not run by itself
    GONE = "gone"


@dataclass(frozen=True)
class Capabilities:
    """What can be rented there. What a provider can *do* to an instance (stop it, let it end
    itself, rent a group) is a feature it implements (``provider.features``), not a flag."""

    spot: bool = False
    cpu_only: bool = False
    gpu: bool = True
    image: bool = True  # boots the image or container that --image names


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str = "root"
    # How long this route may take to say its SSH banner before the next route is tried, and what
    # to tell the user when a later route answers instead (Vast.ai: a direct port, then its proxy).
    grace: float = field(default=2.0, compare=False)
    fallback_note: str = field(default="", compare=False)


@dataclass
class Request:
    """What the user asked for; providers turn it into their own create call."""

    name: str
    gpu: str | None = None
    gpus: int = 1
    cpu: bool = False
    disk_gb: int = 20
    image: str | None = None
    spot: bool = False
    bid: float | None = None
    offer: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # A node of a group (`--nodes N`): the group's key (shared resources a provider makes for it,
    # such as a security group rule or a placement group, are named and tagged with it), this
    # node's rank and the group's size. None/0/1: a lone instance.
    group: str | None = None
    node_rank: int = 0
    nodes: int = 1
    # The live offer a plan chose (its id is ``offer``): the create rents it as it was listed,
    # without listing the provider's offers again. Never stored.
    quote: Offer | None = None
    # Volumes to mount on the machine before anything runs on it (`--volume NAME:PATH`, a task's
    # ``volumes:``); the create attaches them where the provider attaches at launch.
    mounts: tuple["Mount", ...] = ()
    # A group's nodes, rank order, where each mounts volumes of its own (one per node, ``NAME-R``):
    # ``groups`` gives node R ``node_mounts[R]`` as its ``mounts``. Empty: every node mounts ``mounts``.
    node_mounts: tuple[tuple["Mount", ...], ...] = ()


@dataclass
class Remote:
    """One instance as its provider sees it right now."""

    provider_id: str
    label: str
    status: Status
    endpoint: Endpoint | None = None  # the route the provider prefers
    routes: list[Endpoint] = field(default_factory=list)  # every route it offers, preferred first
    price_hr: float | None = None
    stopped_price_hr: float | None = None
    gpu_name: str | None = None
    gpus: int = 0
    spot: bool = False
    preempted: bool = False  # stopped or ended by the provider's spot market, not by anyone's request
    detail: str = ""  # the provider's own word for its state ("exited", "offline", ...)
    # What the instance's own watchdog told the provider as it stopped or ended it (its reason),
    # where the provider keeps such a word; "" otherwise. Only this (or the watchdog's state file
    # read by orch) lets the ledger blame the watchdog: a stop is never inferred to be its.
    ended_by: str = ""
    since: float | None = None  # when it entered that state, epoch seconds, where the provider says
    private_ip: str | None = None  # where the other nodes of its group reach it (a private network)
    raw: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.endpoint and self.endpoint not in self.routes:
            self.routes = [self.endpoint, *self.routes]


@dataclass
class Offer:
    provider: str
    offer_id: str
    gpu_name: str
    gpus: int
    vram_gb: float
    price_hr: float | None  # on-demand, whole machine
    spot_hr: float | None = None  # live minimum bid, whole machine
    disk_gb_month: float | None = None
    reliability: float | None = None
    location: str | None = None
    stock: str | None = None
    # Whether price_hr / spot_hr already count the requested disk, or leave it to be added at
    # disk_gb_month (RunPod bills its volume on top).
    disk_included: bool = True
    disk_gb_month_stopped: float | None = None  # $/GB-month while stopped, where it differs (RunPod: twice)
    stopped_hr: float | None = None  # a flat stopped $/hr, where the provider sets one (the local provider)
    min_bid_per_gpu: float | None = None  # the live minimum spot bid per GPU, where the market has bids
    note: str | None = None  # what a user should know of this price (a table's date, say)
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Volume:
    """A provider's persistent volume that orch made (tagged with orch's tag and its name)."""

    name: str  # orch's name for it, unique in the ledger
    provider: str
    volume_id: str  # the provider's own id
    where: str  # where it lives, in the provider's terms: a data center, a region, a zone, a machine
    size_gb: int
    price_gb_month: float | None = None
    attached_to: tuple[str, ...] = ()  # provider ids of the instances it is attached to now
    created_at: float | None = None  # epoch seconds, where the provider says
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Mount:
    """A volume and the path it is mounted at on the instance: absolute, or ``~/...`` in the
    instance's home where the provider takes one there (``HasVolumes.mount_path_problem``)."""

    volume: Volume
    path: str
    as_name: str = ""  # the name the task used for it (a per-node volume's base name); "": the volume's own

