"""Task files and commands (`orch run -f task.yaml`, `orch run NAME -- CMD`): refused whole before
anything is rented, run on the local provider to their exit code with their outputs home, their
secrets nowhere but in the command, relaunched with their checkpoint folder after a lost pod on
the fake RunPod, and every example of examples/ exercised.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.clouds import local_billing, open_orch, runpod, wait_for  # noqa: F401  (runpod: the fake RunPod fixture)
from tests.conftest import ROOT, on_instance, run_orch, skip_without

EXAMPLES = ROOT / "examples"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def job_json(name: str, env=None) -> dict:
    return json.loads(run_orch("jobs", "show", name, "--json", env=env, check=0).stdout)


def live_instances() -> list:
    return [i for i in open_orch().ledger.instances() if i.state not in ("destroyed", "failed", "lost")]


def nothing_created(orch_home: Path) -> None:
    assert not (orch_home / "runs").exists() or not any((orch_home / "runs").iterdir())
    assert local_billing(orch_home) == set()
    if (orch_home / "ledger.db").exists():
        assert open_orch().ledger.jobs() == [] and open_orch().ledger.instances() == []


# -- refusals: one line with the file and line, exit 2, nothing rented or created ------------------
REFUSALS = {
    "typo": ("""
        name: t
        resources:
          cpu: true
        run: echo hi
        ouptuts: [a.txt]
        """, 5, "unknown key 'ouptuts' (did you mean 'outputs'?)"),
    "nested typo": ("""
        name: t
        resources:
          cpu: true
          dsik: 40
        run: echo hi
        """, 4, "unknown key 'dsik' (did you mean 'disk'?)"),
    "wrong type": ("""
        name: t
        resources:
          cpu: true
          gpus: two
        run: echo hi
        """, 4, "resources.gpus: expected an integer, not 'two'"),
    "run and train": ("""
        name: t
        run: echo hi
        train:
          data: ./ds
        """, 3, "give run: (a command) or train: (a LibreYOLO training), not both"),
    "output leaving the workdir": ("""
        name: t
        resources:
          cpu: true
        run: echo hi
        outputs:
          - out/ok.txt
          - ../../etc/passwd
        """, 7, "output '../../etc/passwd' leaves the workdir"),
    "missing secret": ("""
        name: t
        resources:
          cpu: true
        run: echo hi
        secrets:
          - TASK_TEST_ABSENT_TOKEN
        """, 6, "secret TASK_TEST_ABSENT_TOKEN is not set in this environment"),
    "workdir over its cap": ("""
        name: t
        resources:
          cpu: true
        workdir: big
        workdir_max_mb: 1
        run: echo hi
        """, 4, "over its cap of 1 MB"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_bad_task_file_is_one_line_with_its_file_and_line_exit_2_and_creates_nothing(orch_home, tmp_path, case):
    text, line, says = REFUSALS[case]
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob.bin").write_bytes(os.urandom(1_500_000))
    (tmp_path / "big" / "small.txt").write_text("kept\n")
    task = write(tmp_path / "task.yaml", text)
    proc = run_orch("run", "-f", task, check=2)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"orch: error: {task}:{line}: ") and says in proc.stderr, proc.stderr
    nothing_created(orch_home)


def test_a_workdir_under_its_cap_leaves_out_what_orchignore_names(orch_home, tmp_path):
    """The same folder passes once its big file is listed in .orchignore: the cap counts what is sent."""
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob.bin").write_bytes(os.urandom(1_500_000))
    (tmp_path / "big" / ".orchignore").write_text("*.bin\n")
    task = write(tmp_path / "task.yaml", """
        name: t
        resources:
          cpu: true
        workdir: big
        workdir_max_mb: 1
        run: echo hi
        """)
    proc = run_orch("run", "-f", task, "--dry-run", check=0)
    assert "workdir" in proc.stdout and "1 file(s)" in proc.stdout, proc.stdout
    assert "nothing rented" in proc.stdout
    nothing_created(orch_home)


@pytest.mark.parametrize("args, says", [
    (("run", "c", "--cpu", "--secret", "TASK_TEST_ABSENT_TOKEN", "--", "true"), "secret TASK_TEST_ABSENT_TOKEN"),
    (("run", "c", "--cpu", "--env", "1BAD=x", "--", "true"), "--env takes NAME=VALUE"),
    (("run", "c", "--cpu", "--epochs", "3", "--", "true"), "--epochs: for a train: job"),
    (("run", "--cpu", "--env", "A=b"), "nothing to run"),
])
def test_a_bad_command_line_task_is_one_line_exit_2(orch_home, args, says):
    proc = run_orch(*args, check=2)
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    nothing_created(orch_home)


# -- issue 53: a task file never ships your home, and never hands over orch's own keys ------------
HOSTILE_WORKDIRS = {  # as a task file downloaded into ~/Downloads says them
    "orch ~": ("task.yaml", 'name: t\nresources: {cpu: true}\nworkdir: "~"\nrun: cat .ssh/id_ed25519\n', 3),
    "orch ~/.ssh": ("task.yaml", "name: t\nresources: {cpu: true}\nworkdir: ~/.ssh\nrun: cat id_ed25519\n", 3),
    "orch ..": ("task.yaml", "name: t\nresources: {cpu: true}\nworkdir: ..\nrun: ls -aR\n", 3),
    "skypilot ..": ("sky.yaml", "name: t\nnum_nodes: 1\nworkdir: ..\nrun: tar c . | base64\n", 3),
    "skypilot ~/": ("sky.yaml", 'name: t\nnum_nodes: 1\nworkdir: "~/"\nrun: ls -aR\n', 3),
    "dstack ~/.ssh": (".dstack.yml", "type: task\nname: t\nrepos: [~/.ssh]\ncommands: [cat id_ed25519]\n", 3),
    "dstack ..": (".dstack.yml", "type: task\nname: t\nrepos: [..]\ncommands: [ls -aR]\n", 3),
}


def home_with_keys(tmp_path: Path) -> Path:
    """The test's $HOME (conftest's) with a private key in it; where a downloaded file lands."""
    home = tmp_path / "user"
    write(home / ".ssh" / "id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nmine\n")
    write(home / ".aws" / "credentials", "[default]\naws_secret_access_key = mine\n")
    (home / "Downloads").mkdir(exist_ok=True)
    return home


@pytest.mark.parametrize("case", sorted(HOSTILE_WORKDIRS))
def test_a_task_files_workdir_never_packs_your_home_or_your_keys(orch_home, tmp_path, case):
    """Finding 1 of issue 53: `workdir: "~"` (or `..` from ~/Downloads, or ~/.ssh) in a SkyPilot, dstack
    or orch task file packed the user's home, keys and $ORCH_HOME, and uploaded them to the rented
    machine. A task file's workdir is read beside the file and may not leave it: refused in one
    line, exit 2, nothing packed, recorded or rented."""
    name, text, line = HOSTILE_WORKDIRS[case]
    task = write(home_with_keys(tmp_path) / "Downloads" / name, text)
    proc = run_orch("run", "-f", task, "--provider", "local", "--cpu", check=2)
    refusal = proc.stderr.strip().splitlines()[-1]
    assert refusal.startswith(f"orch: error: {task}:{line}: workdir ") and "leaves the task file's folder" in refusal
    assert "--workdir" in refusal, refusal
    nothing_created(orch_home)
    assert not list(orch_home.rglob("workdir-*.tar")), "nothing was packed"


@pytest.mark.parametrize("folder, says", [
    ("user", "is your home folder"), (".", "holds your home folder"),
    ("user/.ssh", "is ~/.ssh, which holds credentials"),
    ("user/.aws/sub", "sits inside ~/.aws"), ("orch", "is orch's own folder ($ORCH_HOME"),
    ("orch/cache", "sits inside orch's own folder"),
])
def test_a_workdir_given_on_the_command_line_is_never_your_home_orch_home_or_a_key_folder(orch_home, tmp_path, folder,
                                                                                          says):
    home_with_keys(tmp_path)
    (tmp_path / "user" / ".aws" / "sub").mkdir()
    (orch_home / "cache").mkdir(parents=True, exist_ok=True)
    task = write(tmp_path / "user" / "code" / "proj" / "task.yaml", "name: t\nresources: {cpu: true}\nrun: ls\n")
    proc = run_orch("run", "-f", task, "--provider", "local", "--workdir", str((tmp_path / folder).resolve()), check=2)
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("orch: error: --workdir: workdir ")
    assert says in proc.stderr, proc.stderr
    assert open_orch().ledger.jobs() == [] and local_billing(orch_home) == set()
    assert not list(orch_home.rglob("workdir-*.tar")), "nothing was packed"


def test_a_project_folder_under_your_home_is_a_workdir_as_before(orch_home, tmp_path):
    home = home_with_keys(tmp_path)
    write(home / "code" / "proj" / "train.py", "print('hi')\n")
    task = write(home / "code" / "proj" / "task.yaml", "name: t\nresources: {cpu: true}\nworkdir: .\nrun: ls\n")
    proc = run_orch("run", "-f", task, "--provider", "local", "--dry-run", check=0)
    assert f"2 file(s), 0.00 MB from {(home / 'code' / 'proj').resolve()}" in proc.stdout + proc.stderr
    elsewhere = run_orch("run", "-f", write(tmp_path / "t2.yaml", "name: t\nresources: {cpu: true}\nrun: ls\n"),
                         "--provider", "local", "--dry-run", "--workdir", str(home / "code" / "proj"), check=0)
    assert "nothing rented" in elsewhere.stdout


def test_orch_home_is_never_in_a_pack_whatever_the_folder(orch_home, tmp_path, monkeypatch):
    """$ORCH_HOME (the ledger, reaper.env with the provider keys) is left out of any folder's list of
    what to send, and a folder that holds it is refused before anything is packed."""
    from orchestrator.tasks import workdir
    from orchestrator.errors import UsageError

    proj = tmp_path / "proj"
    monkeypatch.setenv("ORCH_HOME", str(proj / ".orch"))
    write(proj / ".orch" / "reaper.env", "RUNPOD_API_KEY=mine\n")
    write(proj / "job.py", "print('hi')\n")
    listed = [rel for rel, _ in workdir.files(proj, [])]
    assert listed == ["job.py"], listed
    with pytest.raises(UsageError, match=r"holds orch's own folder"):
        workdir.pack(proj, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()


def test_a_task_file_may_lower_the_workdir_cap_and_only_a_flag_raises_it(orch_home, tmp_path):
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob.bin").write_bytes(os.urandom(1_500_000))
    task = write(tmp_path / "task.yaml", """
        name: t
        resources:
          cpu: true
        workdir: big
        workdir_max_mb: 100000
        run: echo hi
        """)
    proc = run_orch("run", "-f", task, "--dry-run", check=2)
    assert proc.stderr.startswith(f"orch: error: {task}:5: workdir_max_mb: 100000 is above orch's cap of 200 MB")
    assert "--workdir-max-mb 100000" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "over its cap of 1 MB" in run_orch("run", "-f", task, "--dry-run", "--workdir-max-mb", "1", check=2).stderr
    assert "nothing rented" in run_orch("run", "-f", task, "--dry-run", "--workdir-max-mb", "2", check=0).stdout
    nothing_created(orch_home)


HOSTILE_SECRETS = {  # each names one of orch's own credentials, exported in the user's shell
    "skypilot secrets": ("sky.yaml", "name: t\nnum_nodes: 1\nrun: echo $VAST_API_KEY\nsecrets:\n  VAST_API_KEY: null\n",
                         5, "VAST_API_KEY", "one of the vastai provider's own settings"),
    "skypilot envs": ("sky.yaml", "name: t\nnum_nodes: 1\nrun: echo $HF_TOKEN\nenvs:\n  HF_TOKEN:\n", 5, "HF_TOKEN",
                      "the Hugging Face token orch passes itself"),
    "dstack env": (".dstack.yml", "type: task\nname: t\nenv: [AWS_SECRET_ACCESS_KEY]\ncommands: [env]\n", 3,
                   "AWS_SECRET_ACCESS_KEY", "one of the aws provider's own settings"),
    "orch secrets": ("task.yaml",
                     "name: t\nresources: {cpu: true}\nrun: env\nsecrets: [WANDB_API_KEY, RUNPOD_API_KEY]\n", 4,
                     "RUNPOD_API_KEY", "one of the runpod provider's own settings"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SECRETS))
def test_a_task_file_naming_one_of_orchs_own_credentials_is_refused(orch_home, tmp_path, case):
    """Finding 2 of issue 53: `secrets: {VAST_API_KEY: null}` (or dstack's `env: [AWS_SECRET_ACCESS_KEY]`,
    or orch's `secrets: [RUNPOD_API_KEY]`) put the user's provider key into the rented machine's
    environment. Refused in one line naming the variable and why, nothing made."""
    name, text, line, var, why = HOSTILE_SECRETS[case]
    task = write(tmp_path / name, text)
    env = {k: "mine-" + secrets.token_hex(4) for k in ("VAST_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                                       "RUNPOD_API_KEY", "WANDB_API_KEY")}
    proc = run_orch("run", "-f", task, "--provider", "local", "--cpu", env=env, check=2)
    refusal = proc.stderr.strip().splitlines()[-1]
    assert refusal.startswith(f"orch: error: {task}:{line}: secret {var} is {why}"), refusal
    assert f"--allow-secret {var}" in refusal
    nothing_created(orch_home)


def test_orch_exec_refuses_a_provider_key_too(orch_home, tmp_path):
    proc = run_orch("exec", "box", "--secret", "VAST_API_KEY", "--", "env", env={"VAST_API_KEY": "mine"}, check=2)
    assert proc.stderr.startswith("orch: error: --secret: secret VAST_API_KEY is one of the vastai provider's own "
                                  "settings"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    nothing_created(orch_home)


def test_allow_secret_hands_a_provider_key_to_the_command_on_purpose(orch_home, tmp_path):
    """The one way a provider key reaches a job: said on the command line, name by name; the job's
    relaunches may read it (recorded at home, never in the ledger)."""
    key = "rpa_" + secrets.token_hex(16)
    task = write(tmp_path / "task.yaml", """
        name: handed
        resources: {cpu: true}
        run: printf %s "$RUNPOD_API_KEY" | sha256sum > out.txt
        secrets: [RUNPOD_API_KEY]
        outputs: [out.txt]
        """)
    proc = run_orch("run", "-f", task, "--provider", "local", "--allow-secret", "RUNPOD_API_KEY", "--wait", "--json",
                    env={"RUNPOD_API_KEY": key}, check=0)
    assert json.loads(proc.stdout)["state"] == "completed", proc.stdout[-2000:]
    out = (orch_home / "runs" / "handed" / "out.txt").read_text()
    assert out.split()[0] == hashlib.sha256(key.encode()).hexdigest()
    assert key.encode() not in b"".join(p.read_bytes() for p in orch_home.glob("ledger.db*"))
    assert not (orch_home / "jobs" / "handed").exists(), "the handover ends with the job"


# -- a command on the local provider ----------------------------------------------------------
JOB_PY = '''
import hashlib, json, os, sys, time
from pathlib import Path

out = Path("out")
(out / "extra").mkdir(parents=True, exist_ok=True)
time.sleep(1.5)  # long enough for the command lines to be sampled while it runs
result = {
    "argv": sys.argv[1:], "times": os.environ.get("GREETING_TIMES"), "cwd_has_job": Path("job.py").exists(),
    "token_sha": hashlib.sha256(os.environ["TASK_TEST_TOKEN"].encode()).hexdigest(),
    "rank": os.environ["ORCH_NODE_RANK"], "nodes": os.environ["ORCH_NUM_NODES"], "ips": os.environ["ORCH_NODE_IPS"],
    "master": os.environ["ORCH_MASTER_ADDR"], "gpus": os.environ["ORCH_GPUS_PER_NODE"],
    "setup_runs": Path("setup.log").read_text().count("SETUP-RAN"), "big_sent": Path("big.bin").exists(),
    "input": Path("data/in.txt").read_text(),
}
(out / "result.json").write_text(json.dumps(result))
(out / "extra" / "a.txt").write_text("a")
print("job done", flush=True)
'''


def test_a_command_task_runs_setup_once_brings_its_outputs_home_and_keeps_its_secret(orch_home, tmp_path):
    from tests.fakes.webhook import Hook
    from tests.test_notify import write_config
    from tests.test_secrets import CommandLines, leaks, scan_tree

    hook = Hook()
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["job"]\n\n'
                            '[providers.local]\nprice_per_hour = 3.6\n')
    token = "tok-" + secrets.token_hex(16)
    work = tmp_path / "work"
    write(work / "job.py", JOB_PY)
    write(work / "data" / "in.txt", "hello\n")
    (work / "big.bin").write_bytes(b"x" * 300_000)
    (work / ".orchignore").write_text("big.bin\n")
    task = write(tmp_path / "task.yaml", """
        name: cmd
        resources:
          cpu: true
        workdir: work
        setup: echo SETUP-RAN >> setup.log
        run: python job.py --greeting "hi there"
        env:
          GREETING_TIMES: 2
        secrets: [TASK_TEST_TOKEN]
        outputs:
          - out/result.json
          - out/extra
        """)
    env = {"TASK_TEST_TOKEN": token}
    with CommandLines() as ps:
        proc = run_orch("run", "-f", task, "--wait", "--json", env=env, check=0)
        reads = [run_orch(*args, env=env) for args in (("jobs", "show", "cmd"), ("jobs", "logs", "cmd"),
                                                        ("jobs", "--json"), ("status", "--json"))]
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["kind"] == "command", job["history"][-3:]
    assert job["exit_code"] == 0 and job["run_state"] == "completed" and job["elapsed_s"] >= 1
    assert [a["state"] for a in job["attempts"]] == ["completed"]
    assert job["attempts"][0]["instance_state"] == "destroyed" and live_instances() == []
    assert local_billing(orch_home) == set() and json.loads(reads[3].stdout) == []
    assert 0 < job["cost"]  # 3.6 $/hr for the seconds it ran
    folder = orch_home / "runs" / "cmd"
    result = json.loads((folder / "out" / "result.json").read_text())
    assert result["argv"] == ["--greeting", "hi there"] and result["times"] == "2" and result["cwd_has_job"]
    assert result["token_sha"] == hashlib.sha256(token.encode()).hexdigest(), "the secret reached the command"
    assert (result["rank"], result["nodes"], result["gpus"]) == ("0", "1", "0")
    assert result["master"] == result["ips"] and ipaddress.ip_address(result["master"])
    assert result["setup_runs"] == 1 and result["input"] == "hello\n"
    assert result["big_sent"] is False, ".orchignore keeps big.bin home"
    assert (folder / "out" / "extra" / "a.txt").read_text() == "a"
    manifest = json.loads((folder / ".orch-pull.json").read_text())
    assert manifest["out/result.json"][2] == hashlib.sha256((folder / "out" / "result.json").read_bytes()).hexdigest()
    shown = reads[0].stdout
    assert "exit code 0" in shown and "elapsed" in shown and "completed" in shown, shown
    assert "job done" in reads[1].stdout and "SETUP" not in reads[1].stdout.replace("[orch] setup", "")
    assert any("job cmd completed" in t for t in hook.texts())
    # The secret is in the command's environment only: not in the ledger, a log, an event, any file
    # orch keeps, anything it printed, a command line sampled on this machine (the local instance's
    # too), nor the webhook's payloads.
    values = {"TASK_TEST_TOKEN": token}
    problems = scan_tree(orch_home, values)
    problems += [f"output: {w}" for p in [proc, *reads] for w in leaks(p.stdout + p.stderr, values)]
    problems += [f"command line {line[:100]!r}" for line in ps.seen if token in line]
    problems += [f"webhook: {w}" for p in hook.posts for w in leaks(json.dumps(p), values)]
    hook.close()
    assert problems == [], problems
    assert any("job.py" in line for line in ps.seen), "the command lines were not sampled while it ran"


def test_a_failing_command_ends_the_job_failed_with_its_code_and_last_lines_and_nothing_left(orch_home):
    proc = run_orch("run", "boom", "--cpu", "--wait", "--", "bash", "-c",
                    "echo first words; echo last words >&2; exit 3", check=1)
    assert "exited 3" in proc.stdout and "last words" in proc.stdout, proc.stdout
    # a command job's machine is rented and reached over SSH, nothing more: its steps count two ("[2/4]" promised
    # a provisioning and a proof that never came)
    assert "[1/2] renting on local" in proc.stderr and "[2/2] waiting for SSH" in proc.stderr, proc.stderr
    assert "/4]" not in proc.stderr, proc.stderr
    job = job_json("boom")
    assert job["state"] == "failed" and job["exit_code"] == 3 and job["exit_phase"] == "run"
    assert "run exited 3" in job["reason"] and "last words" in job["reason"]
    assert len(job["attempts"]) == 1, "a command's own failure is not relaunched"
    assert job["attempts"][0]["instance_state"] == "destroyed"
    assert live_instances() == [] and local_billing(orch_home) == set()
    assert "exit 3" in run_orch("jobs", check=0).stdout
    assert "last words" in run_orch("jobs", "logs", "boom", check=0).stdout
    # `orch status boom` after `orch run boom` (its instance is boom-a1): pointed at the job, not "no instance"
    for verb, points_at in (("status", "orch jobs show boom"), ("logs", "orch jobs logs boom")):
        said = run_orch(verb, "boom", check=2).stderr
        assert said.count("\n") == 1 and "boom is a job, not an instance" in said and points_at in said, said


def test_the_watchdogs_deadline_from_max_cost_is_said_in_minutes_a_user_reads(orch_home):
    """--max-cost $0.10 at $1/hr leaves the machine six minutes: the line said 'past 0.0999047 h'."""
    import re

    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (orch_home / "config.toml").write_text("[providers.local]\nprice_per_hour = 1.0\n")
    proc = run_orch("run", "capped", "--cpu", "--max-cost", "0.1", "--wait", "--", "true", check=0)
    said = re.search(r"watchdog: idle \S+ min or past (\S+) (\S+) -> stop", proc.stderr)
    assert said, proc.stderr
    number, unit = said.groups()
    assert unit == "min" and 5.9 <= float(number) <= 6 and len(number.replace(".", "")) <= 3, said.group(0)
    assert live_instances() == [] and local_billing(orch_home) == set()


def test_a_failing_setup_ends_the_job_and_never_runs_the_command(orch_home, tmp_path):
    task = write(tmp_path / "task.yaml", """
        name: nosetup
        resources:
          cpu: true
        setup: |
          echo installing
          false
        run: echo RAN-$((6 * 7))
        """)
    proc = run_orch("run", "-f", task, "--wait", check=1)
    job = job_json("nosetup")
    assert job["state"] == "failed" and job["exit_code"] == 1 and job["exit_phase"] == "setup", job["reason"]
    assert "setup exited 1" in job["reason"] and "installing" in job["reason"]
    assert "RAN-42" not in proc.stdout + proc.stderr + (orch_home / "runs" / "nosetup" / "train.log").read_text()
    assert live_instances() == []


def test_the_watchdog_counts_a_running_command_as_busy_and_idle_after_it_ends(tmp_path):
    """The on-instance watchdog (and the reaper, through the same run_status) sees the command's
    process as a training: it does not stop the instance while the command runs."""
    watchdog = on_instance("watchdog")
    entry = Path(on_instance("command_entry").__file__)
    work = tmp_path / "orch"
    run_dir = work / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.sh").write_text("sleep 30\n")
    spec = run_dir / "command.json"
    spec.write_text(json.dumps({"run_dir": str(run_dir), "cwd": str(work / "task"), "env": {},
                                "run": str(run_dir / "run.sh"), "setup": None}))
    proc = subprocess.Popen([sys.executable, str(entry), str(spec)], stdout=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while not (run_dir / "status.json").exists() and time.monotonic() < end:
            time.sleep(0.05)
        assert json.loads((run_dir / "status.json").read_text())["state"] == "running"
        # (trainings elsewhere on this shared machine count too: train_entry.py anywhere is one)
        assert proc.pid in watchdog.training(watchdog.processes(), str(work))
        mem, action, reason, _ = watchdog.step({"idle_minutes": 0.001, "max_hours": 0, "first_ready_at": 0,
                                                "idle_action": "stop", "deadline_action": "stop",
                                                "protected": False},
                                               {"started_at": 0, "last_active_at": None, "was_training": False},
                                               watchdog.look(str(work), gpu=False), time.time())
        assert action == "keep" and "training pid" in reason and str(proc.pid) in reason, reason
    finally:
        for child in _children(proc.pid):
            os.kill(child, 15)
        proc.wait(timeout=30)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] == 128 + 15  # its command was signalled
    assert proc.pid not in watchdog.training(watchdog.processes(), str(work))


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(") ", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


# -- a lost pod: relaunched, its checkpoint folder restored, the command continues -------------
STEPS_PY = '''
"""Counts steps 1..N, one a second, its state in $ORCH_CHECKPOINT_DIR (written aside, then renamed)."""
import os, sys, time
from pathlib import Path

ckpt = Path(os.environ["ORCH_CHECKPOINT_DIR"])
state = ckpt / "step"
done = int(state.read_text()) if state.exists() else 0
print(f"starting after step {done}", flush=True)
for step in range(done + 1, int(sys.argv[1]) + 1):
    time.sleep(1)  # the workload's own pace (a step a second), not the test's synchronization
    with open(ckpt / "steps.txt", "a") as f:
        f.write(f"{step}\\n")
    (ckpt / ".step").write_text(str(step))
    os.replace(ckpt / ".step", state)
    print(f"step {step}", flush=True)
    if step == int(sys.argv[2]) and not done:
        # The first attempt waits here for its pod to be lost (the test terminates it), so that
        # what follows does not depend on how fast this machine is.
        time.sleep(3600)
Path("out").mkdir(exist_ok=True)
Path("out/steps.txt").write_text((ckpt / "steps.txt").read_text())
'''


def test_a_lost_pod_is_relaunched_by_the_reaper_and_the_command_resumes_from_its_checkpoint(orch_home, tmp_path,
                                                                                          runpod):
    fake, env = runpod
    steps, pause = 6, 3
    write(tmp_path / "work" / "steps.py", STEPS_PY)
    task = write(tmp_path / "task.yaml", f"""
        name: steps
        resources:
          provider: runpod
          cpu: true
        workdir: work
        run: python steps.py {steps} {pause}
        checkpoint: ckpt
        checkpoint_minutes: 0.001
        outputs: [out/steps.txt]
        secrets: [TASK_TEST_TOKEN]
        """)
    reaper_env = dict(env)  # a scheduled reaper, without the user's secrets
    env = {**env, "TASK_TEST_TOKEN": "tok-" + secrets.token_hex(8)}
    run_orch("run", "-f", task, env=env, check=0)
    copy = orch_home / "jobs" / "steps"

    def copied_at_pause() -> bool:
        return any((d / "step").is_file() and (d / "step").read_text() == str(pause) for d in copy.glob("ckpt-*"))

    end = time.monotonic() + 240
    while not copied_at_pause():  # reaper passes: each copies the checkpoint folder home when due
        assert time.monotonic() < end, job_json("steps", env)["history"][-3:]
        run_orch("reap", env=env, check=0)
    pod = next(p for p in fake.live() if "steps-a1" in p.name)
    with fake._lock:  # the host fails: RunPod's side terminates the pod, its disk with it
        fake._podTerminate(pod, {})
    # A reaper without the secret notes the loss but rents nothing it could not start.
    run_orch("reap", env=reaper_env, check=0)
    job = job_json("steps", reaper_env)
    assert job["state"] == "recovering" and "TASK_TEST_TOKEN" in job["reason"], job["reason"]
    assert fake.live() == [] and [a["state"] for a in job["attempts"]] == ["lost"]
    lost_at, again = time.monotonic(), None
    end = lost_at + 300
    while (job := job_json("steps", env))["state"] in ("planned", "running", "recovering"):
        assert time.monotonic() < end, job["history"][-3:]
        run_orch("reap", env=env, check=0)
        if again is None and len(job_json("steps", env)["attempts"]) == 2:
            again = time.monotonic() - lost_at
        time.sleep(1)  # pacing: the command takes a step a second (STEPS_PY); a pass is three orch processes
    assert job["state"] == "completed", job["history"][-5:]
    assert [a["state"] for a in job["attempts"]] == ["lost", "completed"], job["attempts"]
    assert "restored" in (job["attempts"][1]["resumed_from"] or ""), job["attempts"][1]
    done = (orch_home / "runs" / "steps" / "out" / "steps.txt").read_text().split()
    assert done == [str(i) for i in range(1, steps + 1)], f"each step once, resumed after {pause}: {done}"
    log = (orch_home / "runs" / "steps" / "train.log").read_text()
    assert f"starting after step {pause}" in log, log[-500:]
    assert fake.live() == [] and live_instances() == []
    print(f"\nfrom the reaper that has the secret to the command running again on a new pod: {again:.1f} s "
          f"(one `orch reap`); the job's record: recover {job['phases'].get('recover')} s")


# -- the examples -------------------------------------------------------------------------------
def test_the_examples_plan_with_dry_run_and_rent_nothing(orch_home, tmp_path, runpod):
    from orchestrator.tasks import dataset

    fake, env = runpod
    ds = dataset.synth(tmp_path / "ds", n_train=4, n_val=2, imgsz=64)
    plans = {
        "libreyolo": run_orch("run", "-f", EXAMPLES / "libreyolo" / "task.yaml", "--data", ds, "--provider", "runpod",
                              "--dry-run", env=env, check=0),
        "torchrun-2-nodes": run_orch("run", "-f", EXAMPLES / "torchrun-2-nodes" / "task.yaml", "--provider", "local",
                                     "--cpu", "--dry-run", env=env, check=0),
        "pytorch-checkpoint": run_orch("run", "-f", EXAMPLES / "pytorch-checkpoint" / "task.yaml", "--dry-run",
                                       env=env, check=0),
        "hf-accelerate": run_orch("run", "-f", EXAMPLES / "hf-accelerate" / "task.yaml", "--gpu", "RTX 4090",
                                  "--provider", "runpod", "--dry-run", env=env, check=0),
    }
    assert "RTX 4090" in plans["libreyolo"].stderr and "offers (on-demand, per job)" in plans["libreyolo"].stdout
    ddp = plans["torchrun-2-nodes"].stdout
    assert "2 node(s), CPU only" in ddp and "rented together" in ddp and "ORCH_MASTER_PORT" in ddp, ddp
    cpu = plans["pytorch-checkpoint"].stdout
    assert "CPU only" in cpu and "checkpoint ckpt" in cpu and "train.py" in cpu and "nothing rented" in cpu
    hf = plans["hf-accelerate"].stdout
    assert "1x RTX 4090" in hf and "accelerate launch" in hf and " 1. runpod RTX 4090" in hf, hf
    # Flags win over the file: --gpu replaced its cpu: true... and nothing was rented by any of them.
    assert fake.sent("POST", "/v2/pods") == [] and fake.live() == []
    assert open_orch().ledger.jobs() == [] and open_orch().ledger.instances() == []
    # On RunPod the 2-node task (`nodes: 2`) is one Instant Cluster of two pods, never single pods.
    proc = run_orch("run", "-f", EXAMPLES / "torchrun-2-nodes" / "task.yaml", "--provider", "runpod", env=env, check=0)
    assert proc.returncode == 0, proc.stderr
    [sent] = fake.sent("POST", "/v2/clusters")
    assert sent["compute"]["podCount"] == 2 and fake.sent("POST", "/v2/pods") == []
    run_orch("jobs", "cancel", "ddp", env=env, check=0)
    wait_for(lambda: fake.live_clusters() == [] and fake.live() == [], 120, "the cluster deleted")


@pytest.mark.long
def test_the_pytorch_checkpoint_example_runs_on_the_local_provider(orch_home):
    skip_without("torch")
    proc = run_orch("run", "-f", EXAMPLES / "pytorch-checkpoint" / "task.yaml", "--wait", "--json", check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["exit_code"] == 0, job["history"][-3:]
    folder = orch_home / "runs" / "regression"
    assert (folder / "out" / "steps.txt").read_text().split() == [str(i) for i in range(1, 21)]
    assert (folder / "out" / "model.pt").stat().st_size > 0 and live_instances() == []
    assert not (EXAMPLES / "pytorch-checkpoint" / "out").exists(), "it ran on the instance, not in examples/"


@pytest.mark.long(weight=2)
def test_the_hf_accelerate_example_fine_tunes_on_the_local_provider(orch_home):
    skip_without("transformers", "accelerate")
    proc = run_orch("run", "-f", EXAMPLES / "hf-accelerate" / "task.yaml", "--wait", "--json", check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["exit_code"] == 0, job["history"][-3:]
    folder = orch_home / "runs" / "tiny-gpt2"
    assert (folder / "out" / "steps.txt").read_text().strip() == "6"
    config = json.loads((folder / "out" / "model" / "config.json").read_text())
    assert config["n_layer"] == 2 and (folder / "out" / "model" / "model.safetensors").stat().st_size > 0
    assert live_instances() == []


# -- the rules on the instance's side, and the workdir's excludes -----------------------------------
def test_a_checkpoint_folder_that_changes_while_copied_is_not_kept_and_the_last_copy_stands(tmp_path, monkeypatch):
    tree = on_instance("tree")
    root = tmp_path / "task"
    write(root / "ckpt" / "state.bin", "step 1")
    write(root / "ckpt" / "sub" / "steps.txt", "1\n")
    snap = tmp_path / "snap"
    first = tree.snapshot(str(root), "ckpt", str(snap))
    assert sorted(f[0] for f in first["files"]) == ["state.bin", "sub/steps.txt"]
    real_copy = tree.shutil.copy2

    def copy_while_the_command_writes(src, dst):  # the command rewrites its state mid-copy
        real_copy(src, dst)
        (root / "ckpt" / "state.bin").write_text("step 2, longer")
    monkeypatch.setattr(tree.shutil, "copy2", copy_while_the_command_writes)
    assert tree.snapshot(str(root), "ckpt", str(snap)) == {"changed": True}
    assert (snap / "state.bin").read_text() == "step 1", "the last intact copy stands"
    monkeypatch.setattr(tree.shutil, "copy2", real_copy)
    assert tree.snapshot(str(root), "ckpt", str(snap))["files"] and (snap / "state.bin").read_text() == "step 2, longer"


def test_the_instance_lists_and_unpacks_nothing_outside_its_folder(tmp_path):
    import io
    import tarfile

    tree = on_instance("tree")
    root = tmp_path / "task"
    write(root / "out" / "a.txt", "a")
    write(tmp_path / "secret.txt", "not yours")
    (root / "out" / "link").symlink_to(tmp_path / "secret.txt")
    (root / "escape").symlink_to(tmp_path)
    listed = tree.listing(str(root), ["out", "escape/secret.txt", "../secret.txt", "missing"])
    assert [f[0] for f in listed["files"]] == ["out/a.txt"]
    assert set(listed["missing"]) == {"escape/secret.txt", "../secret.txt", "missing"}
    tar_path = tmp_path / "evil.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name in ("ok/file.txt", "../outside.txt", "/abs.txt"):
            data = b"x"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("ok/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    dest = tmp_path / "dest"
    assert tree.unpack(str(tar_path), str(dest)) == {"files": 1}
    assert [p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()] == ["ok/file.txt"]
    assert not (tmp_path / "outside.txt").exists() and not (dest / "ok" / "link").exists()


def test_the_workdir_leaves_out_what_gitignore_and_orchignore_name(tmp_path):
    from orchestrator.tasks import workdir

    root = tmp_path / "w"
    for rel in ("train.py", "src/model.py", "src/__pycache__/model.pyc", "data/big.bin", "data/keep.bin",
                "logs/today.log", ".git/HEAD", "notes.log", "deep/x/notes.log"):
        write(root / rel, "x")
    (root / ".gitignore").write_text("__pycache__/\n*.log\n/data/*.bin\n!/data/keep.bin\n")
    (root / ".orchignore").write_text("logs/\n")
    sent = sorted(rel for rel, _ in workdir.files(root, workdir.patterns(root)))
    assert sent == [".gitignore", ".orchignore", "data/keep.bin", "src/model.py", "train.py"]
    tar, size = workdir.pack(root, tmp_path / "cache")
    again, _ = workdir.pack(root, tmp_path / "cache")
    assert tar == again and size > 0, "the same content packs to the same tar"


# -- what a task file and a workdir may not smuggle ---------------------------------------------------
def _billion_laughs() -> str:
    """Nine lists of nine aliases each, nested nine deep: a billion strings in about 400 bytes."""
    rows = ['  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        rows.append(f"  {cur}: &{cur} [{','.join(['*' + prev] * 9)}]")
    return "name: t\nresources: {cpu: true}\nrun: echo hi\nenv:\n" + "\n".join(rows) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once(orch_home, tmp_path):
    """403 bytes of aliases took 10-35 s and 1.1 GB to read (issue 42): an alias is refused, so every
    value is read once; the refusal names its line, exit 2, nothing created."""
    from orchestrator.tasks import task
    from orchestrator.errors import UsageError

    text = _billion_laughs()
    assert len(text) < 500
    bomb = write(tmp_path / "bomb.yaml", text)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"bomb\.yaml:6: .*aliases"):
        task.load(bomb)
    assert time.monotonic() - t0 < 1.0
    proc = run_orch("run", "-f", bomb, check=2)
    assert "aliases (*name) are not accepted" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    nothing_created(orch_home)
    # Without aliases the same file reads as before.
    plain = write(tmp_path / "plain.yaml", 'name: t\nresources: {cpu: true}\nrun: echo hi\nenv: {A: "[1, 2]"}\n')
    assert task.load(plain)[0].env == {"A": "[1, 2]"}


def test_a_hard_linked_file_arrives_and_git_never_leaves(tmp_path):
    """A second name of a file was packed as a tar hard link, which the instance (regular files only)
    dropped without a word; `!.git/` in .orchignore sent .git, which never leaves."""
    from orchestrator.tasks import workdir

    tree = on_instance("tree")
    root = tmp_path / "w"
    write(root / "model.py", "weights = 1\n")
    os.link(root / "model.py", root / "model_link.py")
    write(root / "sub" / "cfg.yaml", "a: 1\n")
    os.link(root / "sub" / "cfg.yaml", root / "cfg_again.yaml")
    write(root / ".git" / "config", "[remote]\n url = https://token@example.invalid/x\n")
    write(root / "vendor" / "lib" / ".git" / "HEAD", "ref\n")
    (root / ".orchignore").write_text("!.git/\n!.git\n!vendor/lib/.git/\n")
    tar, _ = workdir.pack(root, tmp_path / "cache")
    dest = tmp_path / "instance"
    tree.unpack(str(tar), str(dest))
    arrived = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert arrived == [".orchignore", "cfg_again.yaml", "model.py", "model_link.py", "sub/cfg.yaml"], arrived
    assert (dest / "model_link.py").read_text() == "weights = 1\n" and (dest / "cfg_again.yaml").read_text() == "a: 1\n"
