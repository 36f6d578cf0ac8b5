"""What a provider is: a few verbs over one cloud, and an honest list of what it can do.

A provider never pretends. A listing that fails raises; ``destroy`` returns only once the
provider confirms the instance is gone; a capability it lacks is declared, so the CLI can say
"not supported by <provider>" instead of failing halfway.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from orchestrator.errors import SSHError, UsageError

TAG = "orch"
_LABEL = re.compile(rf"^{TAG}-(?P<id>[0-9a-f]{{12}})-(?P<name>.+)$")

# Volume and container storage bill per GB-month; a month is 730 hours for every provider here.
HOURS_PER_MONTH = 730.0


def label_for(instance_id: str, name: str) -> str:
    """The provider-side name of an instance: orch's tag, the ledger id, the user's name."""
    return f"{TAG}-{instance_id}-{name}"


def parse_label(label: str | None) -> tuple[str, str] | None:
    """(ledger id, name) from a provider-side label, or None when it is not orch's."""
    m = _LABEL.match(label or "")
    return (m["id"], m["name"]) if m else None


def stopped_rate(disk_gb: float, per_gb_month: float) -> float:
    """The seed's arithmetic: what a stopped machine's disk bills per hour."""
    return disk_gb * per_gb_month / HOURS_PER_MONTH


@dataclass(frozen=True)
class Capabilities:
    stop: bool = False
    spot: bool = False
    cpu_only: bool = False
    gpu: bool = True
    self_stop: bool = False
    self_destroy: bool = False
    volumes: bool = False
    # RunPod staff have said its spot mutation is being phased out: callers may want to know.
    spot_may_disappear: bool = False


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


# Normalised provider-side states.
PENDING, RUNNING, STOPPED, GONE = "pending", "running", "stopped", "gone"


@dataclass
class Remote:
    """One instance as its provider sees it right now."""

    provider_id: str
    label: str
    status: str  # PENDING, RUNNING, STOPPED or GONE
    endpoint: Endpoint | None = None
    price_hr: float | None = None
    stopped_price_hr: float | None = None
    gpu_name: str | None = None
    gpus: int = 0
    spot: bool = False
    raw: dict[str, Any] = field(default_factory=dict)


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
    # Whether price_hr / spot_hr already count the requested disk (Vast.ai) or leave it to be added
    # at disk_gb_month (RunPod bills its volume on top).
    disk_included: bool = True
    raw: dict[str, Any] = field(default_factory=dict)


Progress = Callable[[str], None]


class Provider:
    """Base class. Subclasses set ``name`` and ``capabilities`` and implement the verbs."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()
    ssh_user: ClassVar[str] = "root"
    # Settings that must be numbers, each with its least value: a typo in config.toml is refused
    # before anything is rented, not found by a crash halfway through.
    numeric_settings: ClassVar[dict[str, float]] = {}

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        self.settings = settings or {}
        self.home = home
        for key, least in self.numeric_settings.items():
            value = self.settings.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not least <= value < float("inf")):
                raise UsageError(f"[providers.{self.name}] {key} must be a number of at least {least:g}, "
                                 f"not {value!r}")

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
        raise UsageError(f"start is not supported by {self.name}")

    def destroy(self, provider_id: str) -> None:
        """Idempotent: an instance already gone is success. Returns once confirmed gone."""
        raise NotImplementedError

    def offers(self, request: Request) -> list[Offer]:
        return []

    # -- shared behaviour --------------------------------------------------------------
    def configured(self) -> bool:
        """Whether orch has what it needs to ask this provider anything (its credentials, say);
        ``orch reconcile`` lists every configured provider. Override where a key is needed."""
        return True

    def validate(self, request: Request) -> None:
        """Refuse what this provider cannot do, before anything is created."""
        caps = self.capabilities
        if request.cpu and not caps.cpu_only:
            raise UsageError(f"CPU-only instances are not supported by {self.name}")
        if not request.cpu and not caps.gpu:
            raise UsageError(f"{self.name} has no GPUs: use --cpu")
        if request.spot and not caps.spot:
            raise UsageError(f"spot instances are not supported by {self.name}")

    def find(self, label: str) -> Remote | None:
        """Look an instance up by its label (after a create that errored, or a crash)."""
        for remote in self.list():
            if remote.label == label and remote.status != GONE:
                return remote
        return None

    def wait_ssh(self, provider_id: str, timeout: float, progress: Progress | None = None,
                 interval: float = 2.0) -> Remote:
        """Poll until the provider shows an SSH endpoint that answers, bounded."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            remote = self.get(provider_id)
            if remote.status == GONE:
                raise SSHError(f"{self.name} instance {provider_id} disappeared while waiting for SSH")
            answering = self.reachable(remote, progress)
            if answering is not None:
                return answering
            note = f"waiting for SSH ({remote.status})"
            if progress and note != last:
                progress(note)
                last = note
            if time.monotonic() >= deadline:
                raise SSHError(f"SSH on {self.name} instance {provider_id} did not answer within {timeout:.0f} s")
            time.sleep(interval)

    def reachable(self, remote: Remote, progress: Progress | None = None) -> Remote | None:
        """The instance with an endpoint that answers now, else None. A provider with more than
        one route to its instances (Vast.ai's direct port and proxy) chooses here."""
        return remote if remote.endpoint and tcp_open(remote.endpoint) else None

    def prices(self, remote: Remote) -> tuple[float, float]:
        """(running $/hr, stopped $/hr for the disk it keeps)."""
        return (remote.price_hr or 0.0, remote.stopped_price_hr or 0.0)

    def remote_env(self, remote: Remote) -> dict[str, str]:
        """Environment the instance's own processes need (e.g. to stop themselves)."""
        return {}

    def self_stop_command(self, destroy: bool) -> str | None:
        """A POSIX shell snippet that, run on the instance, stops (or destroys) it through the
        provider's API with the instance's own credentials from its environment. None where the
        provider offers no way to do that (``capabilities.self_stop`` says so too)."""
        return None


def tcp_open(endpoint: Endpoint, timeout: float = 2.0) -> bool:
    import socket

    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH")
    except OSError:
        return False
