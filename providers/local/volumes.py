"""The local provider's volumes: a folder of this machine that outlives its instances.

A volume is ``$ORCH_HOME/volumes/NAME/`` (what is written there), beside ``NAME.orch.json`` (orch's
tag: its provider-side name ``model.volume_label``, size, creation time) and
``.attached/NAME/<instance>`` (one empty file per instance that mounted it). An instance mounts it
at a path inside its own home (``~/data``): the create links that path to the folder, so whatever
the instance writes there lands in the volume and stays when the instance is destroyed (a destroy
removes the link, never what it points to). Any other path is refused before anything is made:
an instance's home is all a local instance has of its own. Every instance of this machine can
reach the folder, so several may mount one volume at once (a group's shared cache).

Size: a folder has none. The size given is recorded, and costed at ``volume_price_gb_month``
(``[providers.local]``, default 0), so the cost arithmetic can be tried here.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import time
from pathlib import Path

from orchestrator.errors import ProviderError, UsageError
from orchestrator.provider.features import HasVolumes
from orchestrator.provider.model import Mount, Offer, Request, Volume, parse_volume_label, volume_label

PLACE = "this machine"


class LocalVolumes(HasVolumes):
    """The ``HasVolumes`` half of ``LocalProvider`` (its ``home`` and ``settings``)."""

    volume_place = "folder"
    shared_volumes = True  # a folder: every local instance can link to it
    min_volume_gb = 1
    max_volume_gb = 65536

    @property
    def volumes_root(self) -> Path:
        return Path(self.home) / "volumes"  # type: ignore[attr-defined]

    def _meta_path(self, name: str) -> Path:
        return self.volumes_root / f"{name}.orch.json"

    def _volume(self, meta: dict) -> Volume:
        name = meta["name"]
        marks = self.volumes_root / ".attached" / name
        try:
            seen = sorted(os.listdir(marks))
        except FileNotFoundError:
            seen = []
        # An instance whose folder is gone (destroyed) holds it no more.
        held = tuple(pid for pid in seen if (Path(self.home) / "local" / pid).is_dir())  # type: ignore[attr-defined]
        return Volume(name=name, provider="local", volume_id=str(self.volumes_root / name), where=PLACE,
                      size_gb=int(meta.get("size_gb") or 0), price_gb_month=self._price(), attached_to=held,
                      created_at=meta.get("created_at"), raw=dict(meta))

    def _price(self) -> float:
        return float(self.settings.get("volume_price_gb_month", 0.0))  # type: ignore[attr-defined]

    # -- HasVolumes ------------------------------------------------------------------------------
    def create_volume(self, name: str, size_gb: int, where: str | None) -> Volume:
        if where not in (None, "", PLACE):
            raise UsageError(f"a local volume is a folder of this machine: it takes no region or zone ({where!r})")
        label = volume_label(name)
        if parse_volume_label(label) != name:
            raise UsageError(f"{name!r} is no volume name (lowercase letters, digits and '-')")
        meta_path = self._meta_path(name)
        try:
            self.volumes_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            if meta_path.exists():  # made before (a create whose answer was lost): the same volume
                return self._volume(json.loads(meta_path.read_text()))
            (self.volumes_root / name).mkdir(exist_ok=True)
            meta = {"label": label, "name": name, "size_gb": int(size_gb), "created_at": time.time()}
            tmp = meta_path.with_name(f".{meta_path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(meta))
            os.replace(tmp, meta_path)
        except OSError as e:
            raise ProviderError(f"cannot make the local volume {name} in {self.volumes_root}: {e}") from None
        return self._volume(meta)

    def list_volumes(self) -> list[Volume]:
        try:
            names = sorted(os.listdir(self.volumes_root)) if self.volumes_root.is_dir() else []
            metas = [json.loads((self.volumes_root / n).read_text()) for n in names if n.endswith(".orch.json")]
        except (OSError, ValueError) as e:
            raise ProviderError(f"cannot list the local volumes in {self.volumes_root}: {e}") from None
        return [self._volume(m) for m in metas if isinstance(m, dict) and parse_volume_label(m.get("label")) == m.get("name")]

    def delete_volume(self, volume: Volume) -> None:
        try:
            shutil.rmtree(self.volumes_root / volume.name, ignore_errors=False)
        except FileNotFoundError:
            pass  # already gone
        except OSError as e:
            raise ProviderError(f"cannot delete the local volume {volume.name}: {e}") from None
        shutil.rmtree(self.volumes_root / ".attached" / volume.name, ignore_errors=True)
        self._meta_path(volume.name).unlink(missing_ok=True)

    def offer_reaches(self, offer: Offer, volume: Volume) -> bool:
        return offer.provider == "local" and volume.provider == "local"

    def mount_steps(self, mounts) -> list:
        """Nothing to run as root: the create linked each path into the instance's home (the core
        checks each one as the login user)."""
        return []

    def mount_path_problem(self, path: str) -> str | None:
        return None if inside_home(path) else (
            f"a local instance mounts a volume inside its own home: write the path as ~/SOMETHING, not {path!r}")

    # -- what the create does with ``Request.mounts`` -----------------------------------------------
    def check_mounts(self, request: Request) -> None:
        """Refuse a mount the create could not make, before anything is made."""
        for mount in request.mounts:
            problem = self.mount_path_problem(mount.path)
            if problem:
                raise UsageError(problem)
            if mount.volume.provider != "local":
                raise UsageError(f"volume {mount.volume.name} is on {mount.volume.provider}: a local instance "
                                 "cannot mount it")
            if not (self.volumes_root / mount.volume.name).is_dir():
                raise UsageError(f"the local volume {mount.volume.name} has no folder in {self.volumes_root} "
                                 "(deleted by hand?): `orch volume rm` it and make it again")

    def link_mounts(self, provider_id: str, home: Path, mounts: tuple[Mount, ...]) -> None:
        """Each mount's path in the instance's ``home``, a link to its volume's folder."""
        for mount in mounts:
            rel = inside_home(mount.path)
            target = self.volumes_root / mount.volume.name
            link = home / rel
            try:
                link.parent.mkdir(parents=True, exist_ok=True)
                if link.is_symlink() and os.readlink(link) == str(target):
                    pass  # made by an earlier try of this create
                elif link.exists() or link.is_symlink():
                    raise ProviderError(f"{mount.path} already exists on the instance: not hidden behind volume "
                                        f"{mount.volume.name}")
                else:
                    link.symlink_to(target, target_is_directory=True)
                marks = self.volumes_root / ".attached" / mount.volume.name
                marks.mkdir(parents=True, exist_ok=True)
                (marks / provider_id).touch()
            except OSError as e:
                raise ProviderError(f"cannot mount volume {mount.volume.name} at {mount.path}: {e}") from None


def inside_home(path: str) -> str | None:
    """``~/a/b`` as ``a/b`` (a plain path that stays inside the home), else None."""
    if not isinstance(path, str) or not path.startswith("~/") or "\0" in path:
        return None
    rel = posixpath.normpath(path[2:])
    if rel in (".", "") or rel.startswith(("/", "../")) or rel == ".." or any(not c.isprintable() for c in rel):
        return None
    return rel
