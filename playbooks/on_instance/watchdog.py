"""Runs ON the instance (standard library only): stops the instance once it is idle, by itself.

The controller starts it detached (``orch up``; ``orch reap`` re-arms one that died) with a JSON
config it uploads over SFTP, and may rewrite that config at any time (``orch protect``): it is
re-read on every check. Every few seconds the watchdog looks at what says the instance is in use:

- a training process alive: orch's ``train_entry.py``, or a run whose ``status.json`` names a
  live pid (the process, never a log line);
- an interactive SSH session: a login shell that leads its own session on a pseudo-terminal and
  whose parent is sshd. orch's own commands and SFTP run without a pty and are not counted;
- the GPUs busy, where ``nvidia-smi`` exists.

It writes what it saw and decided to ``watchdog.json`` *before* acting. Idle for
``idle_minutes`` (since the last activity, or since it started), or past the ``max_hours``
deadline, it runs its provider's self-stop command, whose keys come from the environment. It
destroys only when the weights were pulled since they last changed (else it stops: the disk
keeps them).

**Spot notices.** Where the config names a metadata service (``notice_url``: EC2's, for a spot
instance), each check asks it, IMDSv2 style: a session token first (``PUT /latest/api/token``),
then ``GET /latest/meta-data/spot/instance-action`` (404 until EC2 will interrupt the instance,
two minutes ahead; AWS suggests asking every 5 s) and ``events/recommendations/rebalance`` (404
until the risk of an interruption rises). On a notice it writes ``preempt.json`` in the work dir
(``ORCH_PREEMPT_FILE`` of every command), which the controller reads at its next look and answers
with a checkpoint copy at once; on the interruption notice itself it also signals each run once: a
command's process group with the signal its task chose (``preempt_signal``, TERM by default), a
LibreYOLO training's process with SIGTERM (``train_entry`` finishes and saves its epoch, then ends).
Sources: EC2 User Guide, "Spot Instance interruption notices", "EC2 instance rebalance
recommendations" and "Use the Instance Metadata Service to access instance metadata".

    python watchdog.py run CONFIG     the daemon (one per instance: a second one exits at once)
    python watchdog.py probe WORKDIR  one look, printed as an ``ORCH_RESULT {json}`` line
"""

import fcntl
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

GPU_BUSY = 10.0  # % utilisation at or above which a GPU counts as in use (the reaper's too)
RETRY_S = 60.0  # a self-stop that failed, or that has not taken effect, is tried again after this
DEFAULT_INTERVAL = 5.0
PTY_MAJORS = range(136, 144)  # Unix98 pseudo-terminals (/dev/pts/N)
PREEMPT_FILE = "preempt.json"  # in the work dir: ORCH_PREEMPT_FILE (command_entry.py, run_status.py)
TOKEN_TTL_S = 21600  # IMDSv2's session token: the longest it may live (six hours)
IMDS_TIMEOUT_S = 2.0
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "HUP": signal.SIGHUP, "USR1": signal.SIGUSR1,
           "USR2": signal.SIGUSR2}


# -- what the instance is doing -----------------------------------------------------------------
def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def processes():
    """{pid: (comm, ppid, session id, tty_nr)} for every process we can see."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if not stat or ") " not in stat:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(") ", 1)[1].split()
        if fields[0] == "Z":
            continue
        out[int(entry)] = (comm, int(fields[1]), int(fields[3]), int(fields[4]))
    return out


def _in_scope(pid, scope):
    """On hosts that share one machine (the local provider), only this instance's processes count."""
    if not scope:
        return True
    env = _read(f"/proc/{pid}/environ", "rb") or b""
    return f"ORCH_INSTANCE_ID={scope}".encode() in env.split(b"\0")


def sessions(procs, scope=None):
    """Interactive SSH sessions: session leaders on a pty whose parent is sshd."""
    n = 0
    for pid, (_comm, ppid, sid, tty) in procs.items():
        if pid != sid or not tty or (tty >> 8) & 0xFFF not in PTY_MAJORS:
            continue
        parent = procs.get(ppid)
        if parent and parent[0] in ("sshd", "sshd-session") and _in_scope(pid, scope):
            n += 1
    return n


def _cmdline(pid):
    return (_read(f"/proc/{pid}/cmdline", "rb") or b"").replace(b"\0", b" ")


def training(procs, work, scope=None):
    """Live training pids: orch's entry point, or a run's status.json pid that still runs."""
    alive = set()
    for pid in procs:
        if b"train_entry.py" in _cmdline(pid) and _in_scope(pid, scope):
            alive.add(pid)
    for path in glob.glob(os.path.join(work, "runs", "*", "status.json")):
        try:
            with open(path) as f:
                st = json.load(f)
        except (OSError, ValueError):
            continue
        pid = st.get("pid") if isinstance(st, dict) else None
        if st.get("state") in ("running", "starting") and isinstance(pid, int) and pid in procs:
            cmd = _cmdline(pid)
            if (b"python" in cmd or b"libreyolo" in cmd) and _in_scope(pid, scope):
                alive.add(pid)
    return sorted(alive)


def last_run_write(work):
    """When any run last wrote its status.json (LibreYOLO rewrites it at every epoch and at the end)."""
    times = [os.stat(p).st_mtime for p in glob.glob(os.path.join(work, "runs", "*", "status.json"))]
    return max(times) if times else None


def gpu_util():
    """The busiest GPU's utilisation in %, or None where there is no nvidia-smi (or it fails)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = []
    for line in out.stdout.splitlines():
        try:
            values.append(float(line.strip()))
        except ValueError:
            continue
    return max(values) if out.returncode == 0 and values else None


def weights_safe(work):
    """True when no run has weights newer than the controller's last full pull (``pulled.json``)."""
    newest = max((os.stat(p).st_mtime for p in glob.glob(os.path.join(work, "runs", "*", "weights", "*"))),
                 default=None)
    if newest is None:
        return True
    try:
        return os.stat(os.path.join(work, "pulled.json")).st_mtime >= newest
    except OSError:
        return False


def look(work, gpu=True, scope=None):
    procs = processes()
    return {"training": training(procs, work, scope), "sessions": sessions(procs, scope),
            "gpu_util": gpu_util() if gpu else None}


# -- deciding -------------------------------------------------------------------------------------
def busy_reasons(training_pids, sessions, gpu_util):
    """Why the instance is in use, or [] when it is idle: the one definition the watchdog and the
    controller's reaper share. ``training_pids``: live training processes (or a description)."""
    busy = []
    if training_pids:
        busy.append(training_pids if isinstance(training_pids, str) else
                    "training pid " + ",".join(map(str, training_pids)))
    if sessions:
        busy.append(f"{sessions} interactive SSH session(s)")
    if gpu_util is not None and gpu_util >= GPU_BUSY:
        busy.append(f"GPU {gpu_util:.0f}% busy")
    return busy


def step(cfg, mem, seen, now, last_write=None, safe=True):
    """One check, pure: (cfg, what we remember, what we see now) -> (memory, decision, reason, action).

    ``mem`` holds ``started_at``, ``last_active_at`` and ``was_training``. ``action`` is "stop",
    "destroy" or None; ``decision`` is keep, stop, destroy or report (protected, or no command).
    """
    mem = dict(mem)
    busy = busy_reasons(seen["training"], seen["sessions"], seen.get("gpu_util"))
    if busy:
        mem["last_active_at"] = now
    elif mem.get("was_training"):
        # It ended between two checks: status.json's last write dates a clean end exactly; a crash
        # is dated when first seen dead, so the idle time is never cut short.
        prev = mem.get("last_active_at") or mem["started_at"]
        mem["last_active_at"] = last_write if last_write and prev < last_write <= now else now
    mem["was_training"] = bool(seen["training"])
    since = max(mem["started_at"], mem.get("last_active_at") or 0)
    idle_s = mem["idle_s"] = 0.0 if busy else now - since
    deadline = cfg["first_ready_at"] + cfg["max_hours"] * 3600 if cfg.get("max_hours") else None
    want = None
    if deadline and now >= deadline:
        want, reason = cfg["deadline_action"], f"max runtime {cfg['max_hours']:g} h reached"
    elif not busy and idle_s >= cfg["idle_minutes"] * 60:
        want, reason = cfg["idle_action"], (f"idle {idle_s / 60:.1f} min (limit {cfg['idle_minutes']:g}): "
                                            "no training, no interactive SSH session"
                                            + (", GPU idle" if seen.get("gpu_util") is not None else ""))
    elif busy:
        return mem, "keep", "busy: " + "; ".join(busy), None
    else:
        return mem, "keep", f"idle {idle_s / 60:.1f} of {cfg['idle_minutes']:g} min", None
    commands = cfg.get("commands") or {}
    if want == "destroy" and not safe:
        want = "stop" if "stop" in commands else None
        reason += "; weights changed since the last pull: " + (
            "stopping instead of destroying (the disk keeps them)" if want else "not destroying")
        if want is None:
            return mem, "report", reason, None
    if cfg.get("protected"):
        return mem, "report", f"protected: would {want} ({reason})", None
    if want not in commands:
        return mem, "report", f"would {want} ({reason}) but this provider gave no self-{want} command", None
    return mem, want, reason, want


# -- spot notices ---------------------------------------------------------------------------------
class Metadata:
    """An instance metadata service asked the IMDSv2 way: a token, then GETs that carry it."""

    def __init__(self, url):
        self.url = url.rstrip("/")
        self.token, self.until = None, 0.0

    def _token(self):
        if self.token is None or time.time() >= self.until:
            req = urllib.request.Request(f"{self.url}/latest/api/token", method="PUT", data=b"",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            with urllib.request.urlopen(req, timeout=IMDS_TIMEOUT_S) as r:
                self.token = r.read(4096).decode().strip()
            self.until = time.time() + TOKEN_TTL_S - 60
        return self.token

    def get(self, path):
        """The JSON object at ``path``; None while it is not there (404)."""
        for attempt in (0, 1):
            req = urllib.request.Request(f"{self.url}/latest/meta-data/{path}",
                                         headers={"X-aws-ec2-metadata-token": self._token()})
            try:
                with urllib.request.urlopen(req, timeout=IMDS_TIMEOUT_S) as r:
                    data = json.loads(r.read(65536) or b"null")
                return data if isinstance(data, dict) else None
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 0:  # the token expired: a new one, once
                    self.token = None
                    continue
                raise
        return None


def notice(meta):
    """The notice the metadata service gives now: the interruption one first, else the rebalance
    recommendation; None when there is none, or the service does not answer."""
    try:
        action = meta.get("spot/instance-action")
        if action:
            return {"kind": "instance-action", "action": str(action.get("action"))[:20],
                    "time": str(action.get("time"))[:40]}
        rebalance = meta.get("events/recommendations/rebalance")
        if rebalance:
            return {"kind": "rebalance", "time": str(rebalance.get("noticeTime"))[:40]}
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return None


def runs_to_tell(work, procs, scope=None):
    """[(pid, signal name or None, whole group)] for each live run: a command (its status.json
    says ``kind: command`` and its ``preempt_signal``), signalled as a group; a training, its
    own process."""
    out = []
    for path in glob.glob(os.path.join(work, "runs", "*", "status.json")):
        st = _load(path)
        pid = st.get("pid") if isinstance(st, dict) else None
        if not isinstance(pid, int) or pid not in procs or st.get("state") not in ("running", "starting") \
                or not _in_scope(pid, scope):
            continue
        if st.get("kind") == "command":
            out.append((pid, st.get("preempt_signal", "TERM"), True))
        else:
            out.append((pid, "TERM", False))
    known = {pid for pid, _, _ in out}
    for pid in procs:  # a training that has not written its status.json yet
        if pid not in known and b"train_entry.py" in _cmdline(pid) and _in_scope(pid, scope):
            out.append((pid, "TERM", False))
    return out


def tell(work, found, told, scope=None):
    """The notice written to ``preempt.json`` (always the newest) and, on the interruption notice,
    each run signalled once (``told``: the pids already signalled). Returns what was signalled."""
    _write(os.path.join(work, PREEMPT_FILE), {**found, "seen_at": time.time()})
    done = []
    if found["kind"] != "instance-action":
        return done
    for pid, name, group in runs_to_tell(work, processes(), scope):
        sig = SIGNALS.get(name)
        if pid in told or sig is None:
            continue
        told.add(pid)
        try:
            if group:
                os.killpg(os.getpgid(pid), sig)
            else:
                os.kill(pid, sig)
            done.append(f"{pid}:{name}{' (group)' if group else ''}")
        except OSError:
            continue
    return done


# -- the daemon -----------------------------------------------------------------------------------
def _write(path, data):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def act(command, reason):
    """Run the self-stop command in a session of its own, without the instance's process tag
    (a local stop ends every tagged process, this watchdog included, and must outlive it)."""
    env = {k: v for k, v in os.environ.items() if k != "ORCH_INSTANCE_ID"}
    env["ORCH_WATCHDOG_REASON"] = reason
    try:
        out = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=300,
                             start_new_session=True, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return out.returncode, (out.stderr or out.stdout).strip()[-500:]


def run(config_path):
    cfg = _load(config_path)
    if not cfg:
        sys.exit(f"watchdog: cannot read {config_path}")
    work = cfg["work"]
    lock = open(os.path.join(work, "watchdog.lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("watchdog: another one watches this instance (it re-reads the config)", flush=True)
        return
    state_path = os.path.join(work, "watchdog.json")
    scope = os.environ.get("ORCH_INSTANCE_ID")
    mem = {"started_at": time.time(), "last_active_at": None, "was_training": False}
    history, last_action = [], None
    try:  # a notice of this instance's previous life (before a stop) says nothing of this one
        os.unlink(os.path.join(work, PREEMPT_FILE))
    except OSError:
        pass
    meta, told, last_notice = None, set(), None
    while True:
        cfg = _load(config_path) or cfg
        now = time.time()
        url = cfg.get("notice_url")
        if isinstance(url, str) and url.startswith("http://"):
            meta = meta if meta is not None and meta.url == url.rstrip("/") else Metadata(url)
            found = notice(meta)
            if found:
                signalled = tell(work, found, told, scope)
                if found != last_notice or signalled:
                    print(f"watchdog: spot notice {json.dumps(found)}; signalled {signalled or 'nothing'}", flush=True)
                last_notice = found
        seen = look(work, gpu=cfg.get("gpu", True), scope=scope)
        mem, decision, reason, action = step(cfg, mem, seen, now, last_run_write(work), weights_safe(work))
        state = {"pid": os.getpid(), "interval": cfg.get("interval", DEFAULT_INTERVAL), "checked_at": now,
                 "seen": seen, "decision": decision, "reason": reason, "protected": bool(cfg.get("protected")),
                 "history": history, "notice": last_notice, **mem}
        due = action and (last_action is None or now - last_action["at"] >= RETRY_S)
        if due:
            last_action = {"what": action, "at": now, "reason": reason, "rc": None, "error": None}
            history = (history + [last_action])[-10:]
            _write(state_path, {**state, "action": last_action, "history": history})
            rc, err = act(cfg["commands"][action], reason)
            last_action.update(rc=rc, error=None if rc == 0 else err or f"exit {rc}")
            print(f"watchdog: {action} ({reason}): rc {rc} {err}", flush=True)
        _write(state_path, {**state, "action": last_action, "history": history})
        pause = float(cfg.get("interval", DEFAULT_INTERVAL))
        if decision == "keep" and mem["idle_s"]:  # wake when the idle time is up, not a whole interval later
            pause = min(pause, max(cfg["idle_minutes"] * 60 - mem["idle_s"], 0.2))
        _sleep(pause, seen["training"])


def _sleep(seconds, pids):
    """Sleep, but wake as soon as the training ends: its end starts the idle clock."""
    deadline = time.time() + seconds
    while pids and time.time() < deadline - 0.5:
        time.sleep(0.5)
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            return
    time.sleep(max(deadline - time.time(), 0))


def probe(work):
    """What the controller's reaper needs in one round trip: activity now and the watchdog's state."""
    state = _load(os.path.join(work, "watchdog.json"))
    alive = False
    if state and isinstance(state.get("pid"), int):
        alive = b"watchdog.py" in _cmdline(state["pid"]) and os.path.exists(f"/proc/{state['pid']}")
    cfg = _load(os.path.join(work, "watchdog-config.json")) or {}
    seen = look(work, gpu=cfg.get("gpu", True), scope=os.environ.get("ORCH_INSTANCE_ID"))
    print("ORCH_RESULT " + json.dumps({**seen, "now": time.time(), "state": state, "alive": alive,
                                         "last_run_write": last_run_write(work)}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "probe":
        probe(sys.argv[2])
    else:
        sys.exit(__doc__)
