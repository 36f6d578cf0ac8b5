"""What a user meets first: shell completion, a first `orch up NAME` without flags, help without markup."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from orchestrator import states
from tests.clouds import open_orch
from tests.conftest import ROOT, run_orch


def has_local_gpu() -> bool:
    from providers.local import local_gpus

    return bool(local_gpus())


def complete(words: str, env=None) -> subprocess.CompletedProcess:
    """What bash's completion function (from `orch --show-completion bash`) runs on a Tab."""
    parts = words.split(" ")
    full = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1), "_ORCH_COMPLETE": "complete_bash",
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "orchestrator"], capture_output=True, text=True, env=full,
                          timeout=60, cwd=ROOT)


def test_show_completion_prints_a_bash_script(orch_home):
    proc = run_orch("--show-completion", "bash", check=0)
    assert "_ORCH_COMPLETE=complete_bash" in proc.stdout
    assert "complete -o default -F _orch_completion orch" in proc.stdout
    assert "--install-completion" in run_orch("--help", check=0).stdout


def test_completion_offers_instance_names_fast_and_without_sqlalchemy(orch_home):
    # Two instances in the ledger as `orch up` leaves them (completion reads names, not machines).
    ledger = open_orch().ledger
    for name in ("box1", "alpha"):
        inst = ledger.create_instance(name=name, provider="local", label="", cpu_only=True, gpus=0)
        for state in (states.PROVISIONING, states.READY):
            ledger.transition(inst.id, state, reason="test")
    # Through the script itself, as bash runs it: complete `orch ssh b<Tab>`.
    script = run_orch("--show-completion", "bash", check=0).stdout
    bash = (f"{script}\n"
            "COMP_WORDS=(orch ssh b); COMP_CWORD=2; _orch_completion orch; printf '%s\\n' \"${COMPREPLY[@]}\"")
    shim = orch_home.parent / "bin"
    shim.mkdir()
    (shim / "orch").write_text(f"#!/bin/sh\ncd {ROOT} && exec {sys.executable} -m orchestrator \"$@\"\n")
    (shim / "orch").chmod(0o755)
    out = subprocess.run(["bash", "-c", bash], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}).stdout
    assert out.split() == ["box1"]

    assert complete("orch stop ").stdout.split() == ["alpha", "box1"]
    assert complete("orch down a").stdout.split() == ["alpha"]
    assert complete("orch up b").stdout.split() == []  # `up` names a new instance
    assert "stop" in complete("orch st").stdout.split()

    start = time.monotonic()
    complete("orch ssh ")
    assert time.monotonic() - start < 3.0  # a Tab answers at once (interpreter start included)

    code = ("import os, sys\nos.environ.update(COMP_WORDS='orch ssh ', COMP_CWORD='2', _ORCH_COMPLETE='complete_bash')\n"
            "sys.argv = ['orch']\nfrom orchestrator.cli.main import main\ntry: main()\nexcept SystemExit: pass\n"
            "print('HEAVY', [m for m in ('sqlalchemy', 'alembic', 'fabric', 'paramiko', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip().splitlines()[-1] == "HEAVY []"
    assert out.split()[:2] == ["alpha", "box1"]


def test_completion_offers_names_to_every_command_that_takes_one(orch_home, tmp_path):
    """`exec`, `jobs show/logs/cancel/rm`, `schedule rm/pause/resume/run`, `volume rm` (issue 55, 8)."""
    from orchestrator.volumes import ledger_volumes

    ledger = open_orch().ledger
    inst = ledger.create_instance(name="box1", provider="local", label="", cpu_only=True, gpus=0)
    for state in (states.PROVISIONING, states.READY):
        ledger.transition(inst.id, state, reason="test")
    for name in ("tiny-ft", "tiny-ft2", "other"):
        ledger.create_job(("planned", "running", "recovering"), name=name, state="completed")
    ledger_volumes.create(ledger, name="hfc", provider="local", size_gb=1)
    task = tmp_path / "task.yaml"
    task.write_text("name: nightly\nresources: {cpu: true}\nrun: echo hi\n")
    run_orch("schedule", "add", "-f", task, "--cron", "0 2 * * *", check=0)

    assert complete("orch exec ").stdout.split() == ["box1"]
    for verb in ("show", "logs", "cancel", "rm"):
        assert complete(f"orch jobs {verb} tiny").stdout.split() == ["tiny-ft", "tiny-ft2"], verb
    for verb in ("rm", "pause", "resume", "run"):
        assert complete(f"orch schedule {verb} ").stdout.split() == ["nightly"], verb
    assert complete("orch volume rm ").stdout.split() == ["hfc"]
    assert complete("orch volume create ").stdout.split() == [], "create names a new one"


def test_completion_without_a_ledger_offers_nothing_and_makes_nothing(orch_home):
    proc = complete("orch ssh ")
    assert proc.returncode == 0 and proc.stdout.split() == [] and proc.stderr == ""
    assert not (orch_home / "ledger.db").exists()


@pytest.mark.skipif(has_local_gpu(), reason="on a machine with a GPU the first run makes a GPU instance")
def test_first_run_without_flags_is_a_cpu_instance_on_the_local_provider(orch_home):
    proc = run_orch("up", "box1", check=0)
    said = [line for line in proc.stderr.splitlines() if "CPU instance" in line]
    assert len(said) == 1 and "local" in said[0] and "no GPU" in said[0], proc.stderr
    [row] = json.loads(run_orch("status", "--json", check=0).stdout)
    assert (row["name"], row["provider"], row["state"], row["cpu_only"]) == ("box1", "local", "ready", True)
    run_orch("down", "box1", check=0)


@pytest.mark.skipif(has_local_gpu(), reason="the local provider has a GPU on this machine")
def test_an_explicit_gpu_on_a_machine_without_one_is_still_refused(orch_home):
    proc = run_orch("up", "box2", "--gpu", "RTX 4090")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--cpu" in proc.stderr
    assert json.loads(run_orch("status", "--all", "--json", check=0).stdout) == []


def test_help_texts_have_no_restructuredtext_markup():
    import click
    import typer

    from orchestrator.cli.app import app
    from orchestrator.cli import (check, dashboard, data, db, demo, instances, jobs, offers, reaper,  # noqa: F401
                                  reconcile, sshconfig)

    root = typer.main.get_command(app)
    seen = []

    def walk(cmd, ctx):
        text = cmd.get_help(ctx)
        seen.append(ctx.command_path)
        assert "``" not in text, f"{ctx.command_path} --help:\n{text}"
        assert not re.search(r"^\s*\.\. \w+::|:\w+:`", text, re.M), ctx.command_path  # directives, roles
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, click.Context(sub, info_name=name, parent=ctx))

    walk(root, click.Context(root, info_name="orch"))
    assert {"orch ssh", "orch ssh-config", "orch dashboard", "orch jobs"} <= set(seen)


def test_install_completion_puts_the_script_where_bash_reads_it(orch_home):
    from pathlib import Path

    proc = run_orch("--install-completion", "bash", check=0)
    assert "installed" in proc.stdout + proc.stderr
    home = Path.home()
    assert "orch.sh" in (home / ".bashrc").read_text()
    shown = subprocess.run(["bash", "-c", "source ~/.bashrc && complete -p orch"], capture_output=True, text=True,
                           env={**os.environ, "HOME": str(home)}, timeout=30).stdout
    assert "_orch_completion" in shown


def test_an_orch_process_ends_with_its_ledger_closed_and_a_reader_that_left_said_once(orch_home, tmp_path):
    """``orch`` ends its own process (``cli.main.entry``) without the interpreter's teardown of every
    module: what that teardown did that a user can see must still happen. A fresh interpreter here,
    not the tests' fork server: the console script's and ``python -m orchestrator``'s own end."""
    def orch(*args, **kw):
        return subprocess.run([sys.executable, "-m", "orchestrator", *args], text=True, cwd=ROOT, timeout=60, **kw)

    task = tmp_path / "task.yaml"
    task.write_text("name: nightly\nresources: {cpu: true}\nrun: echo hi\n")
    made = orch("schedule", "add", "-f", str(task), "--cron", "0 2 * * *", capture_output=True)
    assert made.returncode == 0, made.stderr
    listed = orch("schedule", "ls", "--json", capture_output=True)
    assert listed.returncode == 0 and [s["name"] for s in json.loads(listed.stdout)] == ["nightly"]
    # The ledger's connections were closed as the process ended: SQLite checkpointed its WAL into
    # ledger.db and removed the -wal file, as at an exit through the interpreter's teardown.
    assert (orch_home / "ledger.db").exists() and not (orch_home / "ledger.db-wal").exists()
    # A reader that leaves before orch writes (`orch schedule ls --json | head -c0`): exit 1, the
    # output cut short, and no "Exception ignored ... BrokenPipeError" from a last flush.
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "w") as gone:
        cut = orch("schedule", "ls", "--json", stdout=gone, stderr=subprocess.PIPE)
    assert cut.returncode == 1 and cut.stderr == "", cut.stderr
    # A usage error still exits 2 with one line, through the same end.
    bad = orch("schedule", "add", "-f", str(task), "--cron", "not a cron", capture_output=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_wait_looks_again_soon_at_first_and_a_long_wait_still_looks_once_per_interval():
    """`orch run --wait` and `orch up --wait` (``runs.pause``): a job or run of a couple of seconds
    is seen ending within a couple of seconds, not at the next 5-second look; a wait of an hour
    asks the ledger and the instance no more often than every 5 seconds once past its first looks."""
    from orchestrator.runs import runs

    for _ in range(20):  # the schedule has jitter: every draw keeps both promises
        waits = [runs.pause(n, 5.0) for n in range(1, 800)]
        at = [sum(waits[:n]) for n in range(1, len(waits) + 1)]  # when each look after the first happens
        assert waits[0] < 1.0
        assert next(t for t in at if t >= 2.0) < 5.0  # a job ending 2 s in is seen before the old first look
        assert max(waits) == 5.0 and waits[-1] == 5.0  # the cap is the interval asked for, no less
        assert sum(1 for t in at if t <= 3600) <= 3600 / 5 + 5  # an hour: about one look per 5 s
