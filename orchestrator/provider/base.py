"""``Provider``: the verbs every provider has, and what it declares instead of pretending."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from orchestrator import config
from orchestrator.errors import ProviderError, UsageError
from orchestrator.text import nearest
from orchestrator.provider.model import Capabilities, Offer, Remote, Request, Status
from orchestrator import parallel as par


# What every provider reads from its settings (``ssh_user``, ``poll_seconds``, below).
COMMON_SETTINGS = ("ssh_user", "poll_seconds")


class Provider(ABC):
    """A cloud, as orch needs it: a handful of verbs. What it can do beyond them is a feature it
    implements (``orchestrator.provider.features``); what it cannot rent is in ``capabilities``."""

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
    # Every other key this provider reads from ``[providers.NAME]``: a key that is neither here, in
    # ``numeric_settings`` nor in ``COMMON_SETTINGS`` is refused by name with the nearest known one
    # (a ``prise_per_hour`` would otherwise price everything at $0, and the budget would trust it).
    other_settings: ClassVar[tuple[str, ...]] = ()
    # Why this provider rents no group (`--nodes N`), said up front where it is no ``RentsGroups``.
    groups_refused: ClassVar[str] = "it declares no private network between its instances"
    # Whether --offer names a CPU instance type too (AWS: region:m6i.large); elsewhere an offer is a GPU's.
    cpu_offers: ClassVar[bool] = False

    def __init__(self, settings: dict[str, Any] | None = None, home=None):
        self.settings = settings or {}
        self.home = home
        known = self.known_settings()
        for key in self.settings:
            if key not in known:
                near = nearest(key, known) or f" (known: {', '.join(sorted(known))})"
                raise UsageError(f"{config.home() / 'config.toml'}: unknown setting {key!r} under "
                                 f"[providers.{self.name}]{near}")
        for key, least in self.numeric_settings.items():
            value = self.settings.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not least <= value < float("inf")):
                raise UsageError(f"[providers.{self.name}] {key} must be a number of at least {least:g}, "
                                 f"not {value!r}")

    @classmethod
    def known_settings(cls) -> set[str]:
        """Every key ``[providers.NAME]`` may hold, as the provider declares them."""
        return {*COMMON_SETTINGS, *cls.numeric_settings, *cls.other_settings}

    # -- the verbs ---------------------------------------------------------------------
    @abstractmethod
    def create(self, request: Request, label: str, public_key: str) -> Remote:
        """Start renting; returns quickly, the endpoint may come later. ``request.quote``, where a
        plan chose the offer, is rented as listed: no second listing."""

    @abstractmethod
    def get(self, provider_id: str) -> Remote:
        """The instance now; status GONE when the provider no longer has it."""

    @abstractmethod
    def list(self) -> list[Remote]:
        """Every instance carrying orch's tag. A failed listing raises, never returns []."""

    @abstractmethod
    def destroy(self, provider_id: str) -> None:
        """Idempotent: an instance already gone is success. Returns once confirmed gone."""

    @abstractmethod
    def offers(self, request: Request) -> list[Offer] | None:
        """Live offers for ``request``; None where this provider is no source of offers (here)."""

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

    @property
    def poll_seconds(self) -> float:
        """How often orch asks this provider while it waits for something (setting ``poll_seconds``)."""
        value = self.settings.get("poll_seconds")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 2.0

    # -- credentials -------------------------------------------------------------------
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

    # -- declarations with a default ---------------------------------------------------
    def validate(self, request: Request) -> None:
        """Refuse what this provider cannot rent, before anything is created."""
        caps = self.capabilities
        if request.cpu and not caps.cpu_only:
            raise UsageError(f"CPU-only instances are not supported by {self.name}")
        if not request.cpu and not caps.gpu:
            raise UsageError(f"{self.name} has no GPUs: use --cpu")
        if request.spot and not caps.spot:
            raise UsageError(f"spot instances are not supported by {self.name}")
        if request.image is not None and not caps.image:
            raise UsageError(f"--image is not supported by {self.name}: its instances run the system they are given")
        if request.cpu and request.offer and not self.cpu_offers:
            raise UsageError(f"--offer picks a GPU offer (`orch offers`): a --cpu instance on {self.name} takes none")
        if request.bid is not None and not request.spot:
            raise UsageError("--bid is a spot price: add --spot")

    def find(self, label: str) -> Remote | None:
        """Look an instance up by its label (after a create that errored, or a crash)."""
        for remote in self.list():
            if remote.label == label and remote.status != Status.GONE:
                return remote
        return None

    def find_within(self, label: str, seconds: float) -> tuple[Remote | None, Exception | None]:
        """An instance by its label, looked for up to ``seconds`` (after a create whose answer was
        lost: a new instance may be missing from a listing for a while). (what was found, None), or
        (None, the last listing's error when it failed, else None)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                found, failed = self.find(label), None
            except ProviderError as e:
                found, failed = None, e
            if found or time.monotonic() >= deadline:
                return found, failed
            par.nap(max(self.poll_seconds, 0.05))

    def never_answers(self, remote: Remote, waited: float) -> str | None:
        """Why an instance seen so, ``waited`` seconds into the wait for SSH, will never answer
        (the wait then fails at once, and ``orch up`` destroys it); None: keep waiting."""
        return None

    def notice_url(self, spot: bool) -> str | None:
        """The instance metadata service where an instance of this provider reads a spot
        interruption notice (the on-instance watchdog polls it, ``playbooks/on_instance/watchdog.py``);
        None where none is given: RunPod and Vast.ai stop an instance without notice."""
        return None

    def known_price_hr(self, request: Request) -> float | None:
        """$/hr of what ``request`` rents where it is known before the create without asking (a
        fixed price of this provider's, e.g. the one config.toml sets): what a plan shows and holds
        against --max-price for a CPU instance or a hand-picked offer, and what a budget checks.
        None: known once rented."""
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
