"""A task's workdir: the local folder a command runs in on the instance, packed for the upload.

What is left out follows the folder's own ``.gitignore`` and ``.orchignore`` (the patterns git
users already keep: ``name``, ``*.ext``, ``dir/``, ``/rooted``, ``**``; ``!`` re-includes), and
``.git`` always, at any depth, whatever a ``!`` pattern says. Links are not followed (one pointing
outside would carry files the user never meant to send); a file with several hard links is sent
as the regular file it is. The size cap (``workdir_max_mb``) is checked on what would be sent,
before anything is rented: a workdir is code and small files, a dataset goes another way.

The packed tar is named by its content and lives in orch's cache; a job keeps that name, and a
later launch sends that very content (``ready``): a workdir that changed since is refused.

What is never a workdir (``guard``, before anything is measured, packed or rented): your home or a
folder that holds it, ``$ORCH_HOME`` (the ledger, the keys the reaper runs with, the packs being
written) and a folder of credentials (``~/.ssh``, ``~/.aws``, ...), whether the workdir is one of
them, sits inside one or holds one. A task file downloaded from elsewhere says ``workdir: "~"`` as
easily as ``workdir: .``; everything in the folder is uploaded to a machine someone else owns.
``$ORCH_HOME`` is left out of any pack, whatever the folder.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import tarfile
from pathlib import Path

from orchestrator import config
from orchestrator.errors import UsageError

# Under your home, what holds credentials: keys, tokens, the cloud CLIs' and the registries' logins
# (the Vast CLI's legacy key file, RunPod's config, Hugging Face's token in its cache). A workdir is
# none of them, inside none, and holds none.
CREDENTIALS = (".ssh", ".aws", ".config", ".gnupg", ".docker", ".kube", ".netrc", ".azure", ".git-credentials",
               ".pgpass", ".npmrc", ".pypirc", ".password-store", ".vast_api_key", ".runpod", ".sky", ".dstack",
               ".kaggle", ".huggingface", ".cache/huggingface", ".local/share/keyrings", ".terraform.d", ".boto",
               ".s3cfg")
IGNORE_FILES = (".gitignore", ".orchignore")
TAR = re.compile(r"workdir-[0-9a-f]{16}\.tar")  # what ``pack`` names a tar: its own content's hash
NEVER = ".git"  # a repository's history and config (its remotes' tokens too): never sent, at any depth


def patterns(root: Path) -> list[str]:
    found = []
    for name in IGNORE_FILES:
        try:
            text = (root / name).read_text(errors="replace")
        except OSError:
            continue
        found += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return found


def _matches(pattern: str, rel: str, is_dir: bool) -> bool:
    if pattern.endswith("/"):
        if not is_dir:
            return False
        pattern = pattern.rstrip("/")
    rooted = pattern.startswith("/") or "/" in pattern
    pattern = pattern.lstrip("/")
    if rooted:
        return fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(rel, pattern.replace("**/", ""))
    return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern)


def excluded(rel: str, is_dir: bool, pats: list[str]) -> bool:
    if NEVER in rel.split("/"):  # before any pattern: no "!" brings it back
        return True
    out = False
    for p in pats:  # the last matching pattern decides, as in git
        neg = p.startswith("!")
        if _matches(p[1:] if neg else p, rel, is_dir):
            out = not neg
    return out


def _real(path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def private() -> list[tuple[str, str]]:
    """(real path, what it is) of every folder a workdir may not be, sit in, or hold but your home:
    orch's own, and each credentials folder of yours."""
    home = _real(Path.home())
    found = [(_real(config.home()), "orch's own folder ($ORCH_HOME: the ledger, the keys the reaper runs with)")]
    found += [(os.path.join(home, name), f"~/{name}, which holds credentials") for name in CREDENTIALS]
    if os.environ.get("XDG_CONFIG_HOME"):
        found.append((_real(os.environ["XDG_CONFIG_HOME"]), "$XDG_CONFIG_HOME, which holds credentials"))
    return found


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def guard(root: Path, where: str) -> None:
    """Refused in one line where ``root`` is your home or holds it, or is, sits inside or holds
    ``$ORCH_HOME`` or a credentials folder: all of it would be uploaded to the rented machine."""
    path, home = _real(root), _real(Path.home())
    what = None
    if home != os.sep and _inside(home, path):
        what = "is your home folder" if path == home else f"holds your home folder ({home})"
    for folder, name in private():
        if what is None and (_inside(path, folder) or _inside(folder, path)):
            what = ("is " if path == folder else "sits inside " if _inside(path, folder) else "holds ") + name
    if what:
        raise UsageError(f"{where}: workdir {path} {what}: everything in it would be uploaded to the rented "
                         "machine; name a project folder (e.g. ~/code/proj)")


def files(root: Path, pats: list[str]) -> list[tuple[str, int]]:
    """(relative path, size) of every regular file that would be sent, in a stable order
    (``$ORCH_HOME`` never, wherever it is)."""
    root = Path(root)
    out = []
    own = _real(config.home())
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                             and not excluded(rel_dir + d, True, pats) and _real(os.path.join(dirpath, d)) != own)
        for f in sorted(filenames):
            full = os.path.join(dirpath, f)
            if os.path.islink(full) or not os.path.isfile(full) or excluded(rel_dir + f, False, pats):
                continue
            out.append((rel_dir + f, os.path.getsize(full)))
    return out


def measure(root: Path, max_mb: float, where: str) -> tuple[int, int]:
    """(bytes, files) the workdir would send; refused over its cap, or when it is not a folder."""
    root = Path(root)
    guard(root, where)
    if not root.is_dir():
        raise UsageError(f"{where}: workdir {str(root)!r} is not a folder")
    listed = files(root, patterns(root))
    total = sum(size for _, size in listed)
    if total > max_mb * 1e6:
        biggest = sorted(listed, key=lambda x: -x[1])[:3]
        raise UsageError(f"{where}: workdir {root} is {total / 1e6:.1f} MB to send, over its cap of {max_mb:g} MB "
                         f"(largest: {', '.join(f'{r} {s / 1e6:.1f} MB' for r, s in biggest)}): list what stays "
                         "home in .orchignore, or raise workdir_max_mb")
    return total, len(listed)


def pack(root: Path, cache: Path) -> tuple[Path, int]:
    """The workdir as a plain tar in orch's cache, named by its content; (path, bytes)."""
    root = Path(root)
    guard(root, "workdir")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"workdir-{os.getpid()}.tar"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel, _ in files(root, patterns(root)):
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            if info.islnk():  # a second name of a file already in: sent whole (the instance takes only regular files)
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", os.stat(root / rel).st_size
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(root / rel, "rb") as f:
                tar.addfile(info, f)
    final = cache / _hash_name(tmp)
    os.replace(tmp, final)
    return final, final.stat().st_size


def _hash_name(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"workdir-{h.hexdigest()[:16]}.tar"


def folder(base: Path, given: str, where: str, within: bool = False) -> Path:
    """The workdir a task names (relative to ``base``, ``~`` expanded), absolute; refused in one line
    when no folder can have that name (a NUL, a ``~user`` with no home). ``within`` (a task file's
    own ``workdir:``): it must be ``base`` or inside it, as the file's readers take it; a folder
    elsewhere (absolute, ``~``, a ``..`` or a link that leaves it) is named with ``--workdir``."""
    try:
        path = (Path(base) / Path(given).expanduser()).resolve()
    except (RuntimeError, ValueError, OSError) as e:
        raise UsageError(f"{where}: workdir {given!r} is no folder orch can read ({e})") from None
    if "\0" in str(path):
        raise UsageError(f"{where}: workdir {given!r} is no folder orch can read")
    if within and not _inside(str(path), _real(base)):
        raise UsageError(f"{where}: workdir {given!r} leaves the task file's folder ({_real(base)}): a task file "
                         "names a folder beside it (workdir: . or a subfolder); a folder elsewhere is given with "
                         "--workdir on the command line")
    return path


def ready(cmd, cache: Path, say):
    """A command's workdir packed in orch's cache, as its job recorded it (``cmd``: the
    command kind's ``CommandSpec``): the first time, packed; after that, the cached tar when its content
    still gives its name, else the folder packed again, which must give that same tar. A job runs
    the files it was made with, and a row that names another folder sends nothing."""
    if not cmd.workdir:
        return cmd
    want = Path(cmd.workdir_tar).name if cmd.workdir_tar else None
    if want is not None:
        cached = Path(cache) / want
        if cached.is_file() and not cached.is_symlink() and _hash_name(cached) == want:
            cmd.workdir_tar = str(cached)
            return cmd
    total, count = measure(Path(cmd.workdir), cmd.workdir_max_mb, "workdir")
    tar, size = pack(Path(cmd.workdir), Path(cache))
    if want is not None and tar.name != want:
        tar.unlink(missing_ok=True)  # packed only to be compared: no copy of that folder is kept
        raise UsageError(f"the workdir {cmd.workdir} is not what the job was made with (its packed copy {want} is "
                         f"gone from orch's cache, and the folder packs to {tar.name} now): a job runs the files "
                         "it was made with; submit a new job to run these")
    cmd.workdir_tar, cmd.workdir_bytes = str(tar), size
    say(f"      workdir: {count} file(s), {total / 1e6:.2f} MB from {cmd.workdir}")
    return cmd
