"""What a task asks to mount: a volume's name and the path it is mounted at, checked as written.

Two ways to write it, both checked here before anything is opened:

- a task file's ``volumes:``, SkyPilot's shape (``volumes: {/mnt/data: NAME}``; SkyPilot's "Volumes",
  docs.skypilot.co/en/latest/reference/volumes/volumes.html), or per path a mapping
  ``{name: NAME, per_node: true}``;
- ``--volume NAME:PATH`` on ``orch up`` and ``orch run`` (dstack's ``NAME:PATH`` short form,
  dstack.ai/docs/concepts/volumes), ``--volume NAME:PATH:per-node`` for one volume per node.

**Groups.** A volume is mounted by every node of a group, shared, where its provider lets several
instances mount one at once (``HasVolumes.shared_volumes``: Lambda's filesystems, RunPod's network
volumes, the local provider's folders). ``per_node`` asks for one volume per node instead, named by
rank as dstack names them (``NAME-0``, ``NAME-1``, ...; dstack's "Distributed tasks" volumes,
``name: data-${{ dstack.node_rank }}``): node R mounts ``NAME-R``, made beforehand with ``orch volume
create``. A lone instance with ``per_node`` mounts ``NAME-0``.

Which provider, place and instance can mount a volume is ``volume_mounts``'s (it needs the ledger);
here only the words: a plain name, a path that is absolute (``/data``) or in the instance's home
(``~/data``; the provider says which it takes), no volume named twice, no path twice or inside another.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import asdict, dataclass

from orchestrator.errors import UsageError

# orch's name for a volume: its provider-side name is ``orch-vol-NAME`` (``provider.model.volume_label``).
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
PER_NODE = "per-node"
MAX_VOLUMES = 8
ENV_NAME = re.compile(r"[^A-Za-z0-9]")
# What a mount path may hold: what every provider's mount takes (``playbooks.volumes``), and ``~``.
PATH_CHARS = re.compile(r"~?[A-Za-z0-9._/-]+")


@dataclass(frozen=True)
class Use:
    """Mount volume ``name`` (node R of a group: ``name-R`` when ``per_node``) at ``path``."""

    name: str
    path: str
    per_node: bool = False

    def volume(self, rank: int) -> str:
        """The volume node ``rank`` mounts."""
        return f"{self.name}-{rank}" if self.per_node else self.name

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Use":
        return cls(str(d["name"]), str(d["path"]), bool(d.get("per_node")))


def check_name(name: str, where: str = "--volume") -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"{where}: {name!r} is no volume name: 1-40 lowercase letters, digits and '-', starting "
                         "with a letter or digit")
    return name


def check_path(path: str, where: str = "--volume") -> str:
    """The path, normalised: absolute (``/data``) or in the instance's home (``~/data``)."""
    text = path.strip() if isinstance(path, str) else ""
    if not text or len(text) > 255 or not PATH_CHARS.fullmatch(text):
        raise UsageError(f"{where}: {path!r} is no mount path: write /data or ~/data (letters, digits and . _ - /)")
    home = text.startswith("~/")
    body = posixpath.normpath(text[1:] if home else text)
    if not (home or text.startswith("/")) or body in ("/", "//") or ".." in text.split("/"):
        raise UsageError(f"{where}: {path!r} is no mount path: an absolute path such as /data, or one inside the "
                         "instance's home such as ~/data (not the home or / itself)")
    if hides_login(body, home):
        raise UsageError(f"{where}: {path!r} would hide the login's home or its SSH keys: a volume mounted there covers "
                         "what orch logs in with (authorized_keys, the workdir), and the machine is lost to it; mount "
                         "at /data or ~/data")
    return ("~" + body) if home else body


# Where a mount would cover what a login needs: the homes (``/home/ubuntu`` on Lambda's images,
# ``/root`` on RunPod's and vast's), the folders above them, and sshd's own keys and configuration.
HIDDEN = re.compile(r"/(home(/[^/]+)?|root|etc(/ssh)?)")


def hides_login(body: str, in_home: bool) -> bool:
    """Whether a mount at ``body`` (normalised; ``in_home``: below ``~``) hides a login's home or keys:
    a home or a folder above one, ``/etc/ssh``, or any ``.ssh`` folder or path inside one."""
    return ".ssh" in body.split("/") or (not in_home and bool(HIDDEN.fullmatch(body)))


def check_volume_name(name: str, per_node: bool, where: str) -> None:
    """The name, with room for the rank where each node gets its own (``NAME-63``)."""
    check_name(name, where)
    if per_node and len(name) > 37:
        raise UsageError(f"{where}: a per-node volume's name has at most 37 characters (node R mounts "
                         f"{name}-R), not {len(name)}")


def parse_flag(text: str) -> Use:
    """``NAME:PATH`` or ``NAME:PATH:per-node``."""
    name, sep, rest = (text or "").partition(":")
    if not sep:
        raise UsageError(f"--volume takes NAME:PATH (e.g. data:/data, or data:~/data on the local provider), "
                         f"not {text!r}")
    per_node = rest.endswith(":" + PER_NODE)
    path = rest[: -len(PER_NODE) - 1] if per_node else rest
    check_volume_name(name, per_node, f"--volume {text}")
    return Use(name, check_path(path, f"--volume {text}"), per_node)


def check_uses(uses: list[Use], where: str = "--volume") -> list[Use]:
    """No volume named twice, no path twice or inside another, at most MAX_VOLUMES."""
    if len(uses) > MAX_VOLUMES:
        raise UsageError(f"{where}: at most {MAX_VOLUMES} volumes per task, not {len(uses)}")
    seen: dict[str, Use] = {}
    for use in uses:
        for other in seen.values():
            if other.name == use.name:
                raise UsageError(f"{where}: volume {use.name} is named twice ({other.path} and {use.path}): a volume "
                                 "is mounted at one path")
            a, b = sorted((other.path.rstrip("/") + "/", use.path.rstrip("/") + "/"), key=len)
            if b.startswith(a):
                raise UsageError(f"{where}: {use.path} and {other.path} overlap: each volume gets a path of its own")
        seen[use.path] = use
    return uses


def flags(values: list[str] | None) -> list[Use]:
    """Every ``--volume`` given, checked together."""
    return check_uses([parse_flag(v) for v in values or []])


def env_name(use_name: str) -> str:
    """``ORCH_VOLUME_<NAME>``: the name upper-cased, '-' as '_' (``data-set`` -> ``ORCH_VOLUME_DATA_SET``)."""
    return "ORCH_VOLUME_" + ENV_NAME.sub("_", use_name).upper()
