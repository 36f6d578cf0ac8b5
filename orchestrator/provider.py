"""What a provider is: a few verbs over one cloud, and an honest list of what it can do.

A provider never pretends. A listing that fails raises; ``destroy`` is idempotent and returns only
once the provider confirms the instance is gone; a capability it lacks is declared, so the CLI can
say "not supported by <provider>" instead of failing halfway. Whatever differs between providers
is a method or a declared attribute here, so the core never names one: a new provider is one file.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Callable, ClassVar

from orchestrator.errors import SSHError, UsageError

TAG = "orch"
# The whole label: fullmatch, so a name with a trailing newline never passes.
_LABEL = re.compile(rf"{TAG}-(?P<id>[0-9a-f]{{12}})-(?P<name>[a-z0-9][a-z0-9-]{{0,39}})")

# Volume and container storage bill per GB-month; orch counts a month as 730 hours (365 × 24 / 12),
# the figure the stop-vs-destroy arithmetic is written in. A provider that divides by another month
# (Vast.ai: 720 h) says so through its own prices.
HOURS_PER_MONTH = 730.0


def label_for(instance_id: str, name: str) -> str:
    """The provider-side name of an instance: orch's tag, the ledger id, the user's name."""
    return f"{TAG}-{instance_id}-{name}"


def parse_label(label: str | None) -> tuple[str, str] | None:
    """(ledger id, name) from a provider-side label, or None when it is not orch's."""
    m = _LABEL.fullmatch(label or "")
    return (m["id"], m["name"]) if m else None


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
    stop: bool = False
    spot: bool = False
    cpu_only: bool = False
    gpu: bool = True
    self_stop: bool = False     # the instance can stop itself (the watchdog's way out)
    self_destroy: bool = False
    # The image makes new SSH host keys at every start (RunPod's images do): right after a start
    # that orch asked for and the provider confirmed, orch pins the new key instead of refusing it.
    new_host_key_on_start: bool = False
    # It can rent a group of instances that reach each other on a private network, on every TCP
    # port (`--nodes N`: a rendezvous and the collective traffic of a multi-node training).
    groups: bool = False


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str = "root"


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
    # A node of a group (`--nodes N`): the group's key (``group_key``: shared resources a provider
    # makes for it, such as a security group rule or a placement group, are named and tagged with
    # it), this node's rank and the group's size. None/0/1: a lone instance.
    group: str | None = None
    node_rank: int = 0
    nodes: int = 1


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


Progress = Callable[[str], None]


class Provider:
    """Base class. Subclasses set ``name`` and ``capabilities`` and implement the verbs."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()
    login: ClassVar[str] = "root"  # the image's SSH user, when ``ssh_user`` in the settings does not say
    embedded: ClassVar[bool] = False  # needs no account and no network: the default provider
    # Environment variables that say how to reach this provider (its key, its API address): the
    # scheduled reaper carries them, and they key the offers cache.
    env_keys: ClassVar[tuple[str, ...]] = ()
    # What to set when ``configured()`` says no (its variable, its config.toml key), named in the one
    # line that refuses to rent and in every list of providers skipped for want of a key.
    credentials: ClassVar[str] = ""
    # Settings that must be numbers, each with its least value: a typo in config.toml is refused
    # before anything is rented, not found by a crash halfway through.
    numeric_settings: ClassVar[dict[str, float]] = {}
    # Why this provider cannot rent a group (`--nodes N`), said up front when its capabilities lack
    # ``groups``: the user learns what to do instead, and nothing is rented.
    groups_refused: ClassVar[str] = "it declares no private network between its instances"
    # Whether --offer names a CPU instance type too (AWS: region:m6i.large); elsewhere an offer is a GPU's.
    cpu_offers: ClassVar[bool] = False

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        self.settings = settings or {}
        self.home = home
        for key, least in self.numeric_settings.items():
            value = self.settings.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not least <= value < float("inf")):
                raise UsageError(f"[providers.{self.name}] {key} must be a number of at least {least:g}, "
                                 f"not {value!r}")

    # -- settings ----------------------------------------------------------------------
    def setting(self, key: str, default: Any = None) -> Any:
        """``key`` from ``[providers.NAME]`` in config.toml; ``default`` when absent or empty."""
        value = self.settings.get(key)
        return default if value is None or value == "" else value

    def number(self, key: str, default: float) -> float:
        """A numeric setting (``numeric_settings`` checked its type and range when it was read)."""
        return float(self.setting(key, default))

    @property
    def ssh_user(self) -> str:
        return str(self.setting("ssh_user", self.login))

    # -- the verbs ---------------------------------------------------------------------
    def create(self, request: Request, label: str, public_key: str) -> Remote:
        """Start renting; returns quickly, the endpoint may come later."""
        raise NotImplementedError

    def get(self, provider_id: str) -> Remote:
        """The instance now; status GONE when the provider no longer has it."""
        raise NotImplementedError

    def list(self) -> list[Remote]:
        """Every instance carrying orch's tag. A failed listing raises, never returns []."""
        raise NotImplementedError

    def stop(self, provider_id: str) -> None:
        raise UsageError(f"stop is not supported by {self.name}")

    def start(self, provider_id: str) -> Remote:
        """Ask for a start and return at once: the caller waits (bounded) for it to run."""
        raise UsageError(f"start is not supported by {self.name}")

    def destroy(self, provider_id: str) -> None:
        """Idempotent: an instance already gone is success. Returns once confirmed gone."""
        raise NotImplementedError

    def offers(self, request: Request) -> list[Offer] | None:
        """Live offers for ``request``; None where this provider is no source of offers (here)."""
        return None

    # -- shared behaviour --------------------------------------------------------------
    @property
    def poll_seconds(self) -> float:
        """How often orch asks this provider while it waits for something (setting ``poll_seconds``)."""
        value = self.settings.get("poll_seconds")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 2.0

    def configured(self) -> bool:
        """Whether orch has what it needs to ask this provider anything (its credentials, say);
        ``orch reconcile`` lists every configured provider. Override where a key is needed."""
        return True

    def missing_credentials(self) -> str | None:
        """None when orch can ask this provider; else what to set, for the user."""
        if self.configured():
            return None
        return self.credentials or f"the credentials of {self.name}"

    def require_credentials(self) -> None:
        """Refuse (exit 2) before anything is created or rented when the key is not there: a create
        without one fails halfway, and whether something was made is then unknown."""
        missing = self.missing_credentials()
        if missing:
            raise UsageError(f"no {self.name} credentials: set {missing} (`orch check {self.name}` tries them)")

    def capabilities_for(self, spot: bool) -> Capabilities:
        """What an instance rented this way can do (a one-time spot instance may not stop)."""
        return self.capabilities

    def validate(self, request: Request) -> None:
        """Refuse what this provider cannot do, before anything is created."""
        caps = self.capabilities
        if request.cpu and not caps.cpu_only:
            raise UsageError(f"CPU-only instances are not supported by {self.name}")
        if not request.cpu and not caps.gpu:
            raise UsageError(f"{self.name} has no GPUs: use --cpu")
        if request.spot and not caps.spot:
            raise UsageError(f"spot instances are not supported by {self.name}")
        if request.cpu and request.offer and not self.cpu_offers:
            raise UsageError(f"--offer picks a GPU offer (`orch offers`): a --cpu instance on {self.name} takes none")
        if request.bid is not None and not request.spot:
            raise UsageError("--bid is a spot price: add --spot")

    def validate_group(self, nodes: int, request: Request) -> None:
        """Refuse a group this provider cannot rent, before anything is created."""
        if nodes > 1 and not self.capabilities.groups:
            raise UsageError(f"--nodes {nodes}: {self.name} cannot rent a group of instances ({self.groups_refused})")

    def open_group(self, group: str, request: Request) -> None:
        """Before a group's first node is created: what its nodes share at this provider (a rule
        that admits the group's members to each other, a placement group). Idempotent."""

    def close_group(self, group: str) -> None:
        """After every node of the group is gone: give back what ``open_group`` made. Idempotent."""

    def find(self, label: str) -> Remote | None:
        """Look an instance up by its label (after a create that errored, or a crash)."""
        for remote in self.list():
            if remote.label == label and remote.status != Status.GONE:
                return remote
        return None

    def made(self, provider_id: str) -> None:
        """Note that this process has just created ``provider_id`` (see ``unseen``)."""
        self.__dict__.setdefault("_made", {})[str(provider_id)] = time.monotonic()

    def seen(self, provider_id: str) -> None:
        """The provider has shown ``provider_id``: from now on, not showing it means gone."""
        self.__dict__.get("_made", {}).pop(str(provider_id), None)

    def unseen(self, provider_id: str, grace: float) -> Remote | None:
        """What to say of an instance the provider does not show: pending, not gone, within ``grace``
        seconds of this process's own create of it, until the provider first shows it (lookups and
        listings lag a create: EC2's eventual consistency, RunPod's and Lambda's listings); None
        otherwise (it is gone)."""
        at = self.__dict__.get("_made", {}).get(str(provider_id))
        if at is None or time.monotonic() - at >= grace:
            return None
        return Remote(provider_id=str(provider_id), label="", status=Status.PENDING,
                      detail="not visible yet (just created)")

    def wait_ssh(self, provider_id: str, timeout: float, progress: Progress | None = None,
                 interval: float = 2.0) -> Remote:
        """Poll until the instance runs and one of its routes answers SSH, bounded. An instance
        that can no longer get there (gone, broken, stopped) fails at once."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            remote = self.get(provider_id)
            if remote.status in (Status.GONE, Status.BROKEN, Status.STOPPED):
                what = f"{remote.status.value}" + (f" ({remote.detail})" if remote.detail else "")
                raise SSHError(f"{self.name} instance {provider_id} is {what} while waiting for SSH")
            answering = self.reachable(remote, progress)
            if answering is not None:
                return answering
            note = f"waiting for SSH ({remote.detail or remote.status.value})"
            if progress and note != last:
                progress(note)
                last = note
            if time.monotonic() >= deadline:
                raise SSHError(f"SSH on {self.name} instance {provider_id} did not answer within {timeout:.0f} s")
            time.sleep(interval)

    def reachable(self, remote: Remote, progress: Progress | None = None) -> Remote | None:
        """The instance with ``endpoint`` set to a route that answers now, else None (its routes are
        tried in the provider's order: Vast.ai offers a direct port and a proxy)."""
        if remote.status != Status.RUNNING:
            return None
        for route in remote.routes:
            if tcp_open(route):
                return replace(remote, endpoint=route)
        return None

    def prices(self, remote: Remote) -> tuple[float, float]:
        """(running $/hr, stopped $/hr for the disk it keeps)."""
        return (remote.price_hr or 0.0, remote.stopped_price_hr or 0.0)

    def account_key(self, public_key: str) -> str:
        """How orch's SSH key reaches this provider's instances, checked where the account holds
        keys (raise when it should and does not)."""
        return "passed to every instance orch creates"

    def vouched_host_key(self, provider_id: str) -> str | None:
        """The instance's SSH host key where the provider can vouch for it ('ssh-ed25519 AAAA...');
        None: orch pins the key the instance shows at first contact."""
        return None

    def self_stop_command(self, provider_id: str, destroy: bool) -> str | None:
        """A POSIX shell snippet that, run on the instance, stops (or destroys) it through the
        provider with the instance's own credentials (from its container's environment, never
        a command line). None where the provider offers no way (``capabilities`` says so too)."""
        return None


def tcp_open(endpoint: Endpoint, timeout: float = 2.0) -> bool:
    """Whether an SSH server answers there: its banner, not just an open port."""
    import socket

    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH")
    except OSError:
        return False
