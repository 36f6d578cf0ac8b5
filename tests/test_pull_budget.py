"""A job's pulls are bounded (issue 42, item 4): one budget in bytes and in files for everything that
comes home into the job's folder, over every look (not a fresh cap at each pull); a look over
thousands of files costs in proportion to them; and a file this machine cannot hold under its name
is that file's failure, never an error that stops the job's looks.

The host is a real local instance (sshd in a container) whose outputs the tests arrange as a
hostile host would: a new sparse file at each look (free for it), thousands of small files, a name
over 255 bytes in its listing, a file that later becomes a folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import OrchError
from orchestrator.jobs.kinds import CommandSpec
from tests.clouds import arrange, open_orch

OUTPUTS = CommandSpec(run="true", outputs=["out"])


@pytest.fixture
def box(orch_home):
    """(orch, a ready local instance, its task folder's out/ as this machine sees it, the job's folder at home)."""
    orch = open_orch()
    inst = arrange(orch, "box")
    work = next((orch_home / "local").glob("orch-*-box")) / "home" / "orch"
    out = work / "task" / "out"
    out.mkdir(parents=True)
    return orch, inst, out, orch_home / "runs" / "job"


def _look(box, strict=False):
    """One look's pull of the job's outputs, as the engine makes it (``CommandKind``'s outputs)."""
    from orchestrator.jobs.kinds.command import pull_outputs

    orch, inst, _, home = box
    return pull_outputs(orch, inst, OUTPUTS, home, strict=strict)[0]


def _at_home(home: Path) -> tuple[int, int]:
    """(bytes, files) the job's folder holds, its pull records included."""
    files = [p for p in home.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len([p for p in files if not p.name.startswith(".orch-pull")])


def test_a_new_sparse_file_at_each_look_never_takes_the_job_past_its_budget(box, monkeypatch):
    """The red team's host offered a new 200 MB sparse file at each look (the old one gone from its
    listing) and 201, 401, 601 MB piled up at home under a 0.25 GB cap; scaled down here."""
    _, _, out, home = box
    monkeypatch.setenv("ORCH_PULL_MAX_GB", "0.025")  # 25.6 MB
    for look in range(1, 4):
        for old in out.iterdir():
            old.unlink()
        with open(out / f"big{look}", "wb") as f:
            f.truncate(15 << 20)  # 15 MB of nothing: free for the host
        _look(box)
        held, _ = _at_home(home)
        assert held <= 0.025 * (1 << 30), f"look {look}: {held} bytes at home"
    assert (home / "out" / "big1").stat().st_size == 15 << 20
    assert not (home / "out" / "big2").exists() and not (home / "out" / "big3").exists()
    # The final pull (strict: before a destroy) says what the budget leaves behind, and how to raise it.
    with pytest.raises(OrchError, match="ORCH_PULL_MAX_GB"):
        _look(box, strict=True)
    monkeypatch.setenv("ORCH_PULL_MAX_GB", "0.05")  # raised: it comes home
    assert _look(box, strict=True) == ["out/big3"]


def test_the_files_a_job_brings_home_are_counted_over_every_look(box, monkeypatch):
    _, _, out, home = box
    monkeypatch.setenv("ORCH_PULL_MAX_FILES", "50")
    for look in range(3):
        for old in out.iterdir():
            old.unlink()
        for n in range(30):
            (out / f"f{look}-{n}").write_text("x")
        _look(box)
        assert _at_home(home)[1] <= 50, f"look {look}: {_at_home(home)[1]} files at home"
    assert _at_home(home)[1] == 50
    with pytest.raises(OrchError, match="ORCH_PULL_MAX_FILES"):
        _look(box, strict=True)


# The host lists (and vouches for) an output whose name is over 255 bytes: no file system here holds it.
LONG = "out/" + "n" * 300
NAMES_A_LONG_FILE = f'''#!{sys.executable}
import hashlib, json, subprocess, sys
done = subprocess.run([{sys.executable!r}, *sys.argv[1:]], capture_output=True, text=True)
script = sys.argv[1]
if not script.endswith(("tree.py", "checksum.py")):
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    sys.exit(done.returncode)
data = json.loads([line for line in done.stdout.splitlines() if line.startswith("ORCH_RESULT ")][-1][12:])
if script.endswith("tree.py") and sys.argv[2] == "list":
    data["files"].append([{LONG!r}, 5, 1.0])
elif script.endswith("checksum.py") and {LONG!r} in sys.argv:
    data[{LONG!r}] = [5, 1.0, hashlib.sha256(b"12345").hexdigest(), 0]
print("ORCH_RESULT " + json.dumps(data))
'''


def test_a_name_this_machine_cannot_hold_is_that_file_s_failure_and_the_looks_go_on(box, orch_home):
    """`out/c` a file, then `out/c/d` (and the other way round), and a name over 255 bytes: each
    raised OSError at every look (`orch: internal error`, `--wait` stopped, the machine billed on).
    Now the file is left on the instance and said; the others come home, strict or not."""
    from playbooks import command as commands
    from playbooks import pull as pulling

    orch, inst, out, home = box
    (out / "c").write_text("a file first")
    (out / "e" / "f").parent.mkdir()
    (out / "e" / "f").write_text("under a folder first")
    assert sorted(_look(box)) == ["out/c", "out/e/f"]
    (out / "c").unlink()
    (out / "c").mkdir()
    (out / "c" / "d").write_text("then a folder")
    shutil.rmtree(out / "e")
    (out / "e").write_text("then a file")
    (out / "ok").write_text("fine")
    work = out.parent.parent
    liar = work / "bin" / "long-names-python"
    liar.parent.mkdir(parents=True, exist_ok=True)
    liar.write_text(NAMES_A_LONG_FILE)
    liar.chmod(0o755)
    (work / "python").write_text(f"{liar}\n")
    assert _look(box) == ["out/ok"]
    assert _look(box, strict=True) == [], "nothing new, and no error: no look could bring them"
    said = []
    with orch.connect(inst) as c:
        root = commands.task_dir(c)
        from orchestrator.jobs.kinds.command import listed

        files = listed(commands.listing(c, root, ["out"]).get("files"), ["out"])
        assert {f.rel for f in files} >= {"out/c/d", "out/e", LONG}
        pulling.pull(c, root, files, home, log=said.append, strict=True)
    left = " ".join(said)
    assert "left on the instance" in left and "out/c/d" in left and "out/e" in left and "n" * 100 in left, said
    assert (home / "out" / "c").read_text() == "a file first" and (home / "out" / "ok").read_text() == "fine"


@pytest.mark.long
def test_a_look_over_4000_files_costs_in_proportion_to_them(box):
    """The manifest was rewritten after each file: 2,000 files took 38 s and 8,000 took 478 s. This
    process's CPU time for a look over 4,000 files is compared with one over 500, eight times fewer
    (CPU, not the clock: the machine is shared; the round trips per file are the same either way).
    A cost that grows with the square of the files would be 64 times the smaller look's."""
    from orchestrator.jobs.kinds.command import pull_outputs

    orch, inst, out, home = box

    def look(count: int, name: str) -> tuple[float, float]:
        shutil.rmtree(out)
        out.mkdir()
        for n in range(count):
            (out / f"f{n:05d}").write_bytes(b"%d" % n)
        cpu, wall = time.process_time(), time.monotonic()
        got, _ = pull_outputs(orch, inst, OUTPUTS, home.with_name(name), strict=True)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        assert len(got) == count
        manifest = json.loads((home.with_name(name) / ".orch-pull.json").read_text())
        assert len([k for k in manifest if k.startswith("out/")]) == count
        return cpu, wall

    small = look(500, "small")
    big = look(4000, "big")
    print(f"\n500 files: {small[0]:.1f} s CPU, {small[1]:.1f} s; 4,000 files: {big[0]:.1f} s CPU, {big[1]:.1f} s")
    assert big[0] < 2.5 * 8 * small[0], "a look's cost grows faster than its files"
    assert (home.with_name("big") / "out" / "f03999").read_bytes() == b"3999"
    assert hashlib.sha256((home.with_name("big") / "out" / "f00042").read_bytes()).hexdigest() == \
        hashlib.sha256(b"42").hexdigest()
