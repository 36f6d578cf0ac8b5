"""`orch exec NAME -- CMD` and `orch exec NAME -f task.yaml`: a command on a machine of yours that
is up, with no new rental: its output printed, its exit code returned, its workdir and setup
reused, its log and outputs home, its secrets hidden; the machine left up. A machine a job holds,
or one still running a command, is refused."""

from __future__ import annotations

import json
import secrets
import textwrap
from pathlib import Path

import pytest

from tests.clouds import arrange, local_billing, open_orch, wait_for
from tests.conftest import run_orch


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def machines() -> list[tuple[str, str]]:
    return [(i.name, i.state) for i in open_orch().ledger.instances()]


def run_state(name: str) -> str | None:
    data = json.loads(run_orch("status", name, "--json", check=0).stdout)
    return (data.get("run") or {}).get("state")


@pytest.mark.long(weight=2)
def test_exec_runs_commands_on_a_ready_machine_with_no_new_rental_and_leaves_it_up(orch_home, tmp_path):
    arrange(open_orch(), "box")
    token = "tok-" + secrets.token_hex(12)

    # A command: its output as it comes, the variables every node finds, its exit code.
    proc = run_orch("exec", "box", "--secret", "EXEC_TOKEN", "--", "sh", "-c",
                    'echo "out rank=$ORCH_NODE_RANK sky=$SKYPILOT_NODE_RANK procs=$ORCH_PROCS_PER_NODE"; '
                    'echo "token=$EXEC_TOKEN"; exit 3', env={"EXEC_TOKEN": token}, check=3)
    assert "out rank=0 sky=0 procs=1" in proc.stdout, proc.stdout + proc.stderr
    assert "token=" in proc.stdout and token not in proc.stdout + proc.stderr, "a secret is hidden in what is shown"
    assert "exit code 3" in proc.stderr and "the machine stays up" in proc.stderr
    assert machines() == [("box", "ready")], "no new rental, the machine kept"
    assert "out rank=0" in (orch_home / "runs" / "box" / "train.log").read_text(), "its log came home"

    # A task file: its workdir up, its outputs home; its setup only when asked, and once.
    write(tmp_path / "work" / "make.py", """
        import os, pathlib
        count = pathlib.Path(os.environ["HOME"], "setup-count")
        runs = count.read_text().count("x") if count.exists() else 0
        pathlib.Path("out").mkdir(exist_ok=True)
        pathlib.Path("out/result.txt").write_text(f"greeting={os.environ['GREETING']} setup_runs={runs}")
        print(f"made setup_runs={runs}")
        """)
    task = write(tmp_path / "task.yaml", """
        name: whatever
        resources: {gpu: H100, gpus: 8}
        workdir: work
        setup: echo -n x >> "$HOME/setup-count"
        run: python3 make.py
        env: {GREETING: hi}
        outputs: [out/result.txt]
        """)
    proc = run_orch("exec", "box", "-f", task, check=0)
    assert "made setup_runs=0" in proc.stdout, "setup is not run unless asked"
    assert "not used on a machine that is up: resources" in proc.stderr
    result = orch_home / "runs" / "box" / "out" / "result.txt"
    assert result.read_text() == "greeting=hi setup_runs=0"
    for _ in range(2):
        proc = run_orch("exec", "box", "-f", task, "--setup", check=0)
        assert "made setup_runs=1" in proc.stdout, "--setup runs it, once per machine"
    assert result.read_text() == "greeting=hi setup_runs=1"

    # Detached: it returns at once; a second command waits for the first to end; without a
    # workdir the command runs in the one the last command left.
    proc = run_orch("exec", "box", "--detach", "--", "sh", "-c", "sleep 8; echo later > later.txt", check=0)
    assert "started" in proc.stdout and "orch logs box -f" in proc.stdout
    busy = run_orch("exec", "box", "--", "true", check=2).stderr
    assert busy.count("\n") == 1 and "box still runs" in busy, busy
    wait_for(lambda: run_state("box") == "completed", 60, "the detached command to end")
    proc = run_orch("exec", "box", "--", "sh", "-c", "cat later.txt; ls make.py", check=0)
    assert "later" in proc.stdout and "make.py" in proc.stdout, proc.stdout
    assert machines() == [("box", "ready")]
    run_orch("down", "box", "--yes", check=0)
    assert local_billing(orch_home) == set()


def test_exec_refuses_what_it_cannot_run_on_in_one_line(orch_home, tmp_path):
    from orchestrator.jobs import RUNNING

    orch = open_orch()
    inst = arrange(orch, "held")
    job = orch.ledger.create_job([RUNNING], name="trainer", state=RUNNING, spec="{}")
    orch.ledger.add_attempt(job_id=job.id, number=1, instance_name="held", instance_id=inst.id, provider="local",
                            state="running")
    cases = [(("exec", "held", "--", "true"), "held runs job trainer"),
             (("exec", "nobox", "--", "true"), "no live instance named 'nobox'"),
             (("exec", "held"), "nothing to run"),
             (("exec", "Bad_Name", "--", "true"), "invalid name")]
    cases += [(("exec", "held", "--output", "../etc/passwd", "--", "true"), "--output: output '../etc/passwd' leaves"),
              (("exec", "held", "--detach", "--output", "a.txt", "--", "true"), "--output brings files home")]
    for args, says in cases:
        err = run_orch(*args, check=2).stderr
        assert err.count("\n") == 1 and says in err, (args, err)
    assert machines() == [("held", "ready")] and orch.ledger.latest_run(inst.id) is None, "nothing was started"
    orch.down(inst, "test over")


def test_exec_output_brings_files_home_verified_without_a_task_file(orch_home):
    """`orch exec NAME --output PATH` (repeatable): no task file needed to bring a file home (issue 55, 8)."""
    import hashlib

    arrange(open_orch(), "box")
    proc = run_orch("exec", "box", "--output", "report.txt", "--output", "plots", "--output", "never.txt", "--",
                    "sh", "-c", "echo findings > report.txt; mkdir -p plots; head -c 4096 /dev/urandom > plots/a.bin; "
                    "sha256sum plots/a.bin", check=0)
    home = orch_home / "runs" / "box"
    assert (home / "report.txt").read_text() == "findings\n"
    [digest] = [w for line in proc.stdout.splitlines() if line.endswith("plots/a.bin") for w in line.split()[:1]]
    assert hashlib.sha256((home / "plots" / "a.bin").read_bytes()).hexdigest() == digest, "the very bytes"
    assert "output(s) not found on box: never.txt" in proc.stderr, proc.stderr
    assert f"its log and report.txt, plots are in {home}" in proc.stderr, "it says where they went: " + proc.stderr
    assert machines() == [("box", "ready")]
