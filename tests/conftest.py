import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOWHERE = "http://127.0.0.1:9"
SECRET_ENV = ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN", "RUNPOD_API_BASE_URL", "VAST_URL", "HF_ENDPOINT")
# AWS and Lambda Cloud: credentials and where they live (HOME moves too, so ~/.aws is never read).
CLOUD_ENV = ("LAMBDA_API_KEY", "LAMBDA_API_BASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
             "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")


def pytest_configure(config):
    """Ctrl-C reaches the orch processes the tests start, as it reaches a command typed at a
    terminal. A suite started in the background of a script (``pytest ... &`` without job control,
    as POSIX shells start asynchronous commands) inherits SIGINT ignored, and an ignored signal
    stays ignored in every child across exec: each test that sends SIGINT to an orch then waited on
    an orch that never saw it. A handler (not SIG_IGN) is reset to the default at exec, so each
    child's Python installs its own KeyboardInterrupt as at any start."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Bytecode caches are kept (in __pycache__, ignored by git) even where the environment says not
    # to (PYTHONDONTWRITEBYTECODE=1, as on this project's machines): without them each pytest process
    # rewrote the asserts of every test module it collected (4 s of CPU per worker), and each Python
    # process the suite starts compiled what it imports from source.
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _weight(item) -> int:
    mark = item.get_closest_marker("long")
    if mark is not None:
        return int(mark.kwargs.get("weight", 1))
    return 1 if item.get_closest_marker("training") else 0


def pytest_collection_modifyitems(config, items):
    """In a parallel run, deal the long tests out so that each worker starts with its share of them,
    heaviest first. xdist's work stealing hands each worker an even, contiguous slice of this list
    and later moves tests from the end of a busy worker's queue: a long test left at the end of a
    slice starts last and the whole run waits for it, with the other workers idle."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or len(items) < workers:
        return
    heavy = sorted((i for i in items if _weight(i)), key=_weight, reverse=True)  # stable: file order kept
    if len(heavy) > len(items) // workers:
        return  # more long tests than one slice holds: the file order is as good as any
    light = iter([i for i in items if not _weight(i)])
    slices, left = [], len(items)
    for n in range(workers):  # the slice sizes xdist's worksteal scheduler cuts
        size = left // (workers - n)
        left -= size
        share = heavy[n::workers]
        slices.append(share + [next(light) for _ in range(size - len(share))])
    items[:] = [i for part in slices for i in part]


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """One XDG cache folder for the whole run, every worker's tests included: orch keeps there what
    holds for any ORCH_HOME (``libreyolo doctor``'s pass on a dataset's bytes), so the suite's many
    identical tiny datasets are checked by the doctor once, not once per test (3 s of CPU each).
    The session's own folder: nothing carries over from an earlier run. A network-namespace shard
    (a pytest of its own, started by a test of the run) shares its run's: the test that started
    it set XDG_CACHE_HOME to it."""
    from tests import netns

    if netns.inside() and os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"])
    base = tmp_path_factory.getbasetemp()
    # An xdist worker's folder is RUN/popen-gwN; a run of its own (-n 0, a network-namespace shard) is RUN.
    root = base.parent if base.name.startswith("popen-gw") else base
    return root / "xdg-cache"


@pytest.fixture(scope="session")
def ledger_seed(tmp_path_factory) -> Path:
    """A ledger orch's migrations built once in this test process: each test's fresh ledger takes
    its schema from it (``tests.ledger_seed``)."""
    from tests import ledger_seed

    ledger_seed.install()
    return ledger_seed.build(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def tiny_run(session_cache) -> Path:
    """A real LibreYOLO run, trained once for the whole run and shared by the tests that only read
    what it wrote (its ``last.pt``, ``best.pt``, ``status.json``): LibreYOLO's own CLI, one epoch on
    orch's synthetic dataset at 64 px. A training is 7-8 s of CPU, nearly all of it torch's import,
    whatever its size. The first worker to ask trains it under a lock; the others wait and read."""
    import fcntl

    root = session_cache.parent / "tiny-run"
    root.mkdir(parents=True, exist_ok=True)
    run, done = root / "runs" / "t", root / "trained"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, however this ends
        if not done.exists():
            from orchestrator.tasks import dataset

            ds = dataset.synth(root / "birds")
            # LibreYOLO's CLI as orch runs its doctor, the collector tuned: 7.1 -> 5.4 CPU-s, on the
            # run's critical path (the tests that read the run wait for it).
            cmd = [*dataset.LIBREYOLO_CLI, "train", f"data={ds / 'data.yaml'}",
                   "model=yolo9-t", "epochs=1", "batch=4", "imgsz=64", "device=cpu", "pretrained=false",
                   "workers=0", f"project={root / 'runs'}", "name=t", "exist_ok=true"]
            env = {**os.environ, "HOME": str(root), "OMP_NUM_THREADS": "1"}
            out = one_cpu(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root,
                                           env=env))
            log, _ = out.communicate(timeout=600)
            assert out.returncode == 0, log[-3000:]
            done.write_text("")
    return run


@pytest.fixture(autouse=True)
def orch_home(tmp_path, monkeypatch, session_cache, ledger_seed):
    """Every test gets its own ORCH_HOME (ledger, keys, local instances) and no cloud credentials."""
    home = tmp_path / "orch"
    monkeypatch.setenv("ORCH_HOME", str(home))
    monkeypatch.setenv("ORCH_TEST_LEDGER_SEED", str(ledger_seed))
    monkeypatch.setenv("XDG_CACHE_HOME", str(session_cache))
    # torch sizes its OpenMP pool to every CPU and its threads spin while they wait: a training or a
    # doctor a test starts itself (no orch process to pin, see ``one_cpu``) burned twice the CPU of
    # the same work on one thread, on a machine whose CPUs the suite's workers already share.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if not os.environ.get("ORCH_TEST_DATABASE_URL"):
        monkeypatch.delenv("ORCH_DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv("ORCH_DATABASE_URL", os.environ["ORCH_TEST_DATABASE_URL"])
    for var in SECRET_ENV + CLOUD_ENV:
        monkeypatch.delenv(var, raising=False)
    # Nothing a test does may reach a real cloud: every API points at a loopback port where nothing
    # listens, until a test's fake server takes its place.
    for var in ("RUNPOD_API_BASE_URL", "VAST_URL", "HF_ENDPOINT", "LAMBDA_API_BASE_URL", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(var, NOWHERE)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # boto3 would ask 169.254.169.254 for credentials
    # A test drives its jobs with the looks it makes (`orch reap`, `orch jobs show`): no detached
    # watcher (``orchestrator.reaper.watcher``) races them, nor outlives the test. tests/test_watcher.py turns it on.
    monkeypatch.setenv("ORCH_WATCHER", "off")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # never the developer's ~/.runpod or ~/.ssh
    (tmp_path / "user").mkdir()
    yield home
    _cleanup_local(home)


def _cleanup_local(home: Path) -> None:
    """Whatever a failing test left running: no sshd or training outlives its test."""
    from providers import local as sshd

    root = home / "local"
    if root.exists():
        for d in root.iterdir():
            iid = d.name.split("-")[1] if d.name.count("-") >= 2 else None
            if iid:
                sshd.kill_instance(d, iid, timeout=2)


def one_cpu(proc: subprocess.Popen) -> subprocess.Popen:
    """Put a just-started orch process, and so every local instance it starts (its sshd,
    then every session and training there), on one CPU: the least loaded (``quietest_cpu``).

    torch sizes its OpenMP pool to the CPUs a process may use, and OpenMP threads spin while they
    wait: with the suite's workers sharing a 2-core machine, trainings each sized for every CPU
    burned about three times the CPU of the same trainings on one CPU each (three concurrent
    8-epoch trainings: 85 CPU-s against 29). One CPU per instance is what a small cloud instance
    has; orch sees nothing of this but the CPU count its training finds."""
    from tests.fakes.hosts import quietest_cpu

    cpu = quietest_cpu()
    if cpu is None:
        return proc
    try:  # it is still importing: whatever it starts comes later and inherits this
        os.sched_setaffinity(proc.pid, {cpu})
    except OSError:
        pass  # it has already ended
    return proc


def on_instance(name: str):
    """A script of ``playbooks/on_instance`` imported as the instance runs it (standard library
    only), to read from this machine's side what the instance would find."""
    import importlib

    from playbooks.host import ON_INSTANCE

    if str(ON_INSTANCE) not in sys.path:
        sys.path.insert(0, str(ON_INSTANCE))
    return importlib.import_module(name)


def orch_popen(args, env=None, stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT):
    """``orch ARGS`` started as a user starts it (``subprocess.Popen``'s interface) in ``cwd``, on
    one CPU (``one_cpu``), forked from a process that imported orch once (``tests.zygote``;
    ``ORCH_TEST_FORK=0``: a fresh interpreter, as a user's)."""
    from tests import zygote
    from tests.fakes.hosts import quietest_cpu

    full = {**os.environ, **(env or {})}
    args = [str(a) for a in args]
    forked = zygote.popen(args, full, cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=True, cpu=quietest_cpu()) \
        if zygote.enabled() else None
    if forked is not None:
        return forked
    return one_cpu(subprocess.Popen([sys.executable, "-m", "orchestrator", *args], stdin=stdin, stdout=stdout,
                                    stderr=stderr, text=True, env=full, cwd=cwd))


def run_orch(*args, env=None, check=None, timeout=600, input=None, cwd=ROOT):
    """``orch`` as a user runs it (in ``cwd``): a separate process, its exit code, its stdout and stderr."""
    proc = orch_popen(args, env, stdin=subprocess.PIPE if input is not None else None, cwd=cwd)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    proc = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check is not None and proc.returncode != check:
        raise AssertionError(f"orch {' '.join(map(str, args))} exited {proc.returncode}, wanted {check}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


@pytest.fixture
def orch():
    return run_orch


@pytest.fixture
def ledger(orch_home):
    from orchestrator.instances.lifecycle import Orch

    return Orch.open().ledger


def has_libreyolo() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("libreyolo") is not None and importlib.util.find_spec("torch") is not None
    except Exception:
        return False


def skip_without(*modules: str) -> None:
    """Skip the test unless each module is installed, without importing it here: torch,
    transformers and accelerate are what the test's instances import, not the test's own process
    (``pytest.importorskip`` imported them into the worker: 20 s of the suite's CPU)."""
    import importlib.util

    for name in modules:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"needs {name}")


needs_torch = pytest.mark.skipif(not has_libreyolo(), reason="needs the local extra (torch + libreyolo)")
