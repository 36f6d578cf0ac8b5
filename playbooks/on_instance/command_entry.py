"""Run on the instance (standard library only): a task's command, detached, its end written down.

    python command_entry.py SPEC.json

SPEC names the run folder (where ``status.json`` is written, as a LibreYOLO run writes its own, so
the controller, the watchdog and the reaper read a command the way they read a training), the
working directory, and the ``setup`` and ``run`` scripts. ``setup`` runs once per instance: its
marker lives on the instance's own disk (``$HOME``), so a restart that wiped that disk runs it
again. Each script runs as ``bash FILE`` (never its text on a command line), in the workdir, with
the job's environment; the secrets came in this process's environment, never in SPEC.

status.json: ``state`` running / completed (exit 0) / failed (with ``exit_code`` and the
``phase``, setup or run, that failed), ``pid`` (this process: alive while the command runs),
``started_at``, ``updated_at`` (a heartbeat every minute), ``ended_at``; ``preempt_signal``, what
the watchdog sends this process group on a spot interruption notice, which it writes to
``ORCH_PREEMPT_FILE`` (the work dir's ``preempt.json``) first; ``preempted`` once a command that
had the notice ended on a failure (the controller then relaunches it, rather than failing the job).
"""
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys

HEARTBEAT_S = 60.0
PREEMPT_FILE = "preempt.json"  # in the work dir, the run folder's grandparent (watchdog.py writes it)


def now():
    """UTC, to the millisecond: the controller takes a run's end from ``updated_at``, and a time cut
    to the second made a 1.6 s command look 0.9 s long."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def write(run_dir, status):
    status["updated_at"] = now()
    tmp = os.path.join(run_dir, f".status.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, os.path.join(run_dir, "status.json"))


def run_script(path, cwd, env, status, run_dir):
    """bash PATH, its output in this process's (the log); returns its exit code (128+N for a signal)."""
    print(f"[orch] {status['phase']}: bash {os.path.basename(path)} in {cwd}", flush=True)
    child = subprocess.Popen(["bash", path], cwd=cwd, env=env, stdin=subprocess.DEVNULL)

    def forward(sig, _frame):
        try:
            child.send_signal(sig)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            write(run_dir, status)
    return 128 - code if code < 0 else code


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    run_dir, cwd = spec["run_dir"], spec["cwd"]
    os.makedirs(run_dir, exist_ok=True)
    os.makedirs(cwd, exist_ok=True)
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    preempt_file = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(run_dir))), PREEMPT_FILE)
    env["ORCH_PREEMPT_FILE"] = preempt_file
    status = {"state": "running", "phase": "setup", "pid": os.getpid(), "kind": "command",
              "started_at": now(), "exit_code": None, "preempt_signal": spec.get("preempt_signal") or "TERM"}
    setup = spec.get("setup")
    if setup:
        digest = hashlib.sha256(open(setup, "rb").read()).hexdigest()[:16]
        marker = os.path.join(os.path.expanduser("~"), ".orch-setup", f"{digest}.done")
        if os.path.exists(marker):
            print("[orch] setup: already ran on this instance", flush=True)
        else:
            write(run_dir, status)
            code = run_script(setup, cwd, env, status, run_dir)
            if code != 0:
                status.update(state="failed", exit_code=code, ended_at=now())
                write(run_dir, status)
                print(f"[orch] setup exited {code}", flush=True)
                return code
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
    status["phase"] = "run"
    write(run_dir, status)
    code = run_script(spec["run"], cwd, env, status, run_dir)
    status.update(state="completed" if code == 0 else "failed", exit_code=code, ended_at=now())
    if code != 0 and os.path.exists(preempt_file):
        status["preempted"] = True
    write(run_dir, status)
    print(f"[orch] run exited {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
