"""Volumes on an instance: what makes each mount of a job ready at its path before anything else
runs there, over SSH, as root (or through passwordless sudo: the AMIs' and Lambda Stack's login
has it).

A provider says what each mount needs (``HasVolumes.mount_steps``), one step per mount:

- ``Present``: the provider mounted it at the path itself (a RunPod network volume, a Vast.ai
  volume, a Lambda filesystem mounted where it was asked): only checked.
- ``Link``: the provider mounted it elsewhere (Lambda's ``/lambda/nfs/NAME``, where the path asked
  for is outside the folders Lambda mounts under): the path becomes a symbolic link to it.
- ``Block``: a block device (an EBS volume) that must be found by its volume id, formatted when it
  is blank (never otherwise), and mounted at the path, with an ``/etc/fstab`` line (``nofail``)
  that mounts it again after a reboot (EC2 User Guide, "Make an Amazon EBS volume available for
  use": ``file -s``/``blkid`` to tell a blank volume, ``mkfs -t ext4``, the fstab entry by UUID).

``prepare`` runs them all in one script and checks, as the login user, that every path is a
directory it can write. It is idempotent: run it after every (re)start too.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from orchestrator.ssh import remote
from orchestrator.errors import OrchError

MARK = "ORCH_MOUNT "  # one line per path: what the script did there
DEVICE_WAIT_S = 120  # an attached EBS volume's device shows within seconds; a minute or two at worst


@dataclass(frozen=True)
class Present:
    """Mounted at ``path`` by the provider: checked only."""

    path: str


@dataclass(frozen=True)
class Link:
    """Mounted at ``source`` by the provider: ``path`` becomes a symbolic link to it."""

    path: str
    source: str


@dataclass(frozen=True)
class Block:
    """A block device, the first of ``devices`` that exists (waited for): formatted ext4 when
    blank (labelled ``label``), mounted at ``path``."""

    path: str
    devices: tuple[str, ...]
    label: str = "orch"


Step = Present | Link | Block


def _check(path: str) -> str:
    """A path the core accepts (``volume_uses.check_path``): absolute, printable, no quotes or ``$``."""
    parts = path.split("/")
    if not path.startswith("/") or path.rstrip("/") == "" or ".." in parts or len(path) > 255 \
            or any(not c.isprintable() or c in "\\\"'`$" for c in path):
        raise OrchError(f"{path!r} is no mount path orch uses (an absolute path, not /)")
    return path


def _say(what: str, *args: str) -> str:
    """A line on stderr, its arguments quoted (a path may hold spaces)."""
    return f"printf '{what}\\n' {' '.join(args)} >&2"


def _done(path: str, did: str) -> str:
    return f"printf '{MARK}%s %s\\n' {path} {did}"


def _block(step: Block) -> str:
    q, path = shlex.quote, shlex.quote(_check(step.path))
    devices = " ".join(q(d) for d in step.devices)
    label = q(re.sub(r"[^A-Za-z0-9_-]", "", step.label)[:16] or "orch")
    in_fstab = q(step.path.replace(" ", "\\040").replace("\t", "\\011"))  # fstab(5): blanks escaped in octal
    return f"""
dev=""; waited=0
while [ -z "$dev" ]; do
  for d in {devices}; do if [ -b "$d" ]; then dev=$(readlink -f "$d"); break; fi; done
  if [ -z "$dev" ]; then
    if [ "$waited" -ge {DEVICE_WAIT_S} ]; then
      {_say(f"no block device for %s after {DEVICE_WAIT_S} s (looked for %s)", path, q(" ".join(step.devices)))}; exit 3
    fi
    sleep 1; waited=$((waited + 1))
  fi
done
did=mounted
if mountpoint -q {path}; then
  if [ "$(readlink -f "$(findmnt -n -o SOURCE --target {path})")" != "$dev" ]; then
    {_say("%s is already the mount point of another device", path)}; exit 3
  fi
  did=present
else
  kind=$(blkid -p -o value -s TYPE "$dev" 2>/dev/null || true)
  if [ -z "$kind" ]; then
    if blkid -p "$dev" >/dev/null 2>&1; then
      {_say("%s holds something that is no filesystem (a partition table?): orch formats only a blank volume",
            '"$dev"')}; exit 3
    fi
    mkfs.ext4 -q -L {label} "$dev"; did=formatted
  fi
  mkdir -p {path} && mount "$dev" {path}
  if [ "$did" = formatted ]; then chown "$OWNER" {path}; fi
fi
uuid=$(blkid -o value -s UUID "$dev" || true)
if [ -n "$uuid" ] && ! grep -q "^UUID=$uuid " /etc/fstab 2>/dev/null; then
  printf 'UUID=%s %s auto defaults,nofail 0 2\\n' "$uuid" {in_fstab} >> /etc/fstab
fi
{_done(path, '"$did"')}
"""


def _link(step: Link) -> str:
    path, source = shlex.quote(_check(step.path)), shlex.quote(_check(step.source))
    return f"""
if [ ! -d {source} ]; then {_say("%s is not there: the provider did not mount the volume", source)}; exit 3; fi
if [ -L {path} ]; then ln -sfn {source} {path}
elif [ -d {path} ] && [ -z "$(ls -A {path})" ]; then rmdir {path} && ln -s {source} {path}
elif [ -e {path} ]; then {_say("%s exists and is not empty: orch will not hide it behind a volume", path)}; exit 3
else mkdir -p "$(dirname {path})" && ln -s {source} {path}
fi
{_done(path, "linked")}
"""


def _present(step: Present) -> str:
    path = shlex.quote(_check(step.path))
    return f"""
if [ ! -d {path} ]; then {_say("%s is not there: the provider did not mount the volume", path)}; exit 3; fi
{_done(path, "present")}
"""


def script(steps: list[Step] | tuple[Step, ...]) -> str:
    """The root part: one POSIX shell script for every step. Its one argument (uid:gid) is the
    login user's, who owns a freshly formatted volume."""
    parts = {Block: _block, Link: _link, Present: _present}
    return 'set -eu\nOWNER="$1"\n' + "".join(parts[type(s)](s) for s in steps)


def prepare(c, steps: list[Step] | tuple[Step, ...]) -> dict[str, str]:
    """Make every mount ready on the instance behind connection ``c``; {path: what was done}
    ("formatted", "mounted", "linked", "present"). Raises ``OrchError`` with the instance's own
    words when one cannot be made ready, or is not writable by the login user."""
    if not steps:
        return {}
    q = shlex.quote
    path = remote.put_text(c, script(steps), ".orch/mount-volumes.sh", 0o600)
    out = c.run(f'o="$(id -u):$(id -g)"; if [ "$(id -u)" = 0 ]; then sh {q(path)} "$o"; '
                f'else sudo -n sh {q(path)} "$o"; fi; s=$?; rm -f {q(path)}; exit $s',
                hide=True, warn=True, in_stream=False)
    if not out.ok:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        raise OrchError(f"the volumes could not be mounted on the instance: {tail or f'exit {out.exited}'}")
    done = {}
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            where, _, what = line[len(MARK):].rpartition(" ")
            done[where] = what
    # As the login user: what the job will run as must be able to write there.
    probe = " && ".join(f"test -w {q(s.path)}/." for s in steps)
    if remote.run(c, f"{probe} && echo ok", check=False).strip() != "ok":
        raise OrchError(f"a volume is mounted but the login user cannot write to it ({', '.join(done) or 'none'})")
    return done
