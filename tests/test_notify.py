"""Notifications: lifecycle events posted to a webhook (Slack's JSON) on a loopback HTTP server."""

import getpass
import json
import shutil
import subprocess
import sys
import time

import pytest

from tests.clouds import arrange, open_orch, wait_for
from tests.conftest import ROOT, run_orch
from tests.fakes.webhook import SECRET, Hook

@pytest.fixture
def hook():
    server = Hook()
    yield server
    server.close()


def write_config(home, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "config.toml").write_text(text)
    (home / "config.toml").chmod(0o600)


def secret_nowhere(home, *procs) -> None:
    """The URL's secret part is in config.toml and nowhere else orch wrote or said."""
    for proc in procs:
        assert SECRET not in proc.stdout + proc.stderr and "XyZzy" not in proc.stdout + proc.stderr
    for f in home.rglob("*"):
        if f.is_file() and f.name != "config.toml" and not f.is_symlink():
            assert b"XyZzy" not in f.read_bytes(), f


def reap_until(predicate, timeout=90) -> list:
    """`orch reap` passes until ``predicate()`` (the watchdog on the instance acts on its own clock)."""
    procs, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.append(run_orch("reap", check=0))
        if predicate():
            return procs
        time.sleep(2)  # pacing: the watchdog acts on its own clock; a pass is two orch processes on 2 cores
    raise AssertionError(f"not seen in {timeout} s: {[p.stdout for p in procs[-2:]]}")


def ready(name: str, watchdog_on: bool = True, **policy):
    """A ready local instance without `orch up`'s provisioning (``tests.clouds.arrange``), with the
    idle policy `orch up --idle-minutes ... --on-idle ...` records (``policy``) and, unless
    ``watchdog_on`` is False, the watchdog `orch up` arms once it is ready: these tests watch what
    the watchdog and the reaper do to it. The first test runs the real `orch up`, with its output."""
    from orchestrator.money import policy as policies
    from orchestrator.instances import watchdog

    orch = open_orch()
    inst = arrange(orch, name)
    if policy:
        inst = orch.ledger.update(inst.id, policy=policies.from_flags(**policy))
    if watchdog_on:
        assert watchdog.arm(orch, inst), [e.reason for e in orch.ledger.events(inst.id)]
    return inst


def test_an_instance_destroyed_by_its_watchdog_is_posted_once_without_the_url_anywhere(orch_home, hook):
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\n')
    up = run_orch("up", "box1", "--cpu", "--idle-minutes", "0.02", "--on-idle", "destroy", check=0)
    assert hook.posts == []  # coming up is no news
    procs = reap_until(lambda: json.loads(run_orch("status", "--json", check=0).stdout) == [])
    wait_for(lambda: hook.posts, timeout=10, what="the webhook's post")  # orch waits for its posts at exit
    for post in hook.posts:
        assert post["path"] == f"/services/{SECRET}" and post["type"] == "application/json"
        assert set(post["body"]) == {"text"}
    texts = hook.texts()
    # A look that falls between the watchdog's stop and its destroy records (and posts) the stop first.
    assert all("stopped by the watchdog" in t and "-&gt; destroy" in t for t in texts[:-1]), texts
    assert len(texts) <= 2 and len(set(texts)) == len(texts), texts  # each transition once
    text = texts[-1]
    # The watchdog destroys what a reaper pass marked safe; on a loaded machine that pass's own idle
    # rule may come first. Either way one destroy, posted once.
    assert text.startswith(("orch: box1 on local was destroyed by the watchdog",
                            "orch: box1 on local was destroyed by the reaper")), text
    status = run_orch("status", "box1", "--json", check=0)
    secret_nowhere(orch_home, up, status, *procs)
    ledger = (orch_home / "ledger.db").read_bytes()
    assert b"XyZzy" not in ledger and b"127.0.0.1:%d" % hook.server_address[1] not in ledger


def test_an_instance_gone_from_its_provider_is_posted_as_lost(orch_home, hook):
    from providers import local

    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["lost"]\n')
    ready("box1")
    [folder] = (orch_home / "local").iterdir()
    local.kill_instance(folder, folder.name.split("-")[1], timeout=5)  # someone else deleted it
    shutil.rmtree(folder)
    proc = run_orch("reconcile", check=0)
    wait_for(lambda: hook.posts, timeout=10, what="the webhook's post")
    [text] = hook.texts()
    assert text.startswith("orch: box1 on local") and "is lost" in text, text
    secret_nowhere(orch_home, proc)


def test_an_instance_destroyed_by_the_reaper_is_posted_as_such(orch_home, hook):
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["reaper"]\n')
    alone = {"ORCH_WATCHDOG": "off"}  # the reaper alone on duty: no watchdog on the instance to beat it
    ready("box1", watchdog_on=False, idle_minutes=0.02, on_idle="destroy")
    time.sleep(2)  # clock: the idle rule's 0.02 min (1.2 s of wall time since ready) must have run out
    reap = run_orch("reap", env=alone, check=0)
    wait_for(lambda: hook.posts, timeout=10, what="the webhook's post")
    [text] = hook.texts()
    assert text.startswith("orch: box1 on local was destroyed by the reaper"), text
    secret_nowhere(orch_home, reap)


def test_a_spot_instance_outbid_is_posted_as_preempted(orch_home, tmp_path, monkeypatch, hook):
    """The fake Vast.ai (tests/fakes/vast_api.py): someone bids more, the next look records it."""
    from tests.fakes.hosts import sshd_available

    if not sshd_available():
        pytest.skip("the fake Vast.ai's hosts need root, sshd and unshare")
    from orchestrator import config
    from orchestrator.provider import Request
    from tests.clouds import configure, open_orch
    from tests.fakes.vast_api import FakeVast

    monkeypatch.setenv("ORCH_WATCHDOG", "off")
    with FakeVast(tmp_path, boot_polls=1) as fake:
        env = {"VAST_URL": fake.url}
        monkeypatch.setenv("VAST_URL", fake.url)
        configure(orch_home, "vastai", {"api_key": fake.key, "ssh_user": getpass.getuser(),
                                        "poll_seconds": 0.05, "destroy_timeout": 10, "direct_ssh_grace": 0.3})
        with open(orch_home / "config.toml", "a") as f:
            f.write(f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["preempted"]\n')
        config._load.cache_clear()
        inst = open_orch().up("spot1", "vastai", Request(name="spot1", gpu="RTX 4090", spot=True), ssh_timeout=60,
                              prepare=None)
        assert hook.posts == []
        fake.outbid(inst.provider_id)
        status = run_orch("status", "spot1", "--json", env=env, check=0)
        assert json.loads(status.stdout)["state"] == "preempted"
        wait_for(lambda: hook.posts, timeout=10, what="the webhook's post")
        [text] = hook.texts()
        assert text.startswith("orch: spot1 on vastai ($") and "was preempted" in text, text
        secret_nowhere(orch_home, status)
        run_orch("down", "spot1", env=env, check=0)
        assert len(hook.posts) == 1  # a destroy the user asked for is no news


def test_events_not_asked_for_are_not_posted(orch_home, hook):
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["preempted", "job"]\n')
    ready("box1", idle_minutes=0.02, on_idle="destroy")
    reap_until(lambda: json.loads(run_orch("status", "--json", check=0).stdout) == [])
    # No wait: only orch posts (the instance never has the URL), and each orch waited for its posts at exit.
    assert hook.posts == []


def test_a_failing_webhook_is_one_warning_without_the_url_and_never_the_commands_failure(orch_home):
    broken = Hook(status=500)
    try:
        write_config(orch_home, f'[notify]\nwebhook_url = "{broken.url}"\n')
        ready("box1", idle_minutes=0.02, on_idle="destroy")
        procs = reap_until(lambda: broken.posts)
        warned = [line for p in procs for line in p.stderr.splitlines() if "notification" in line]
        assert len(warned) == 1 and "HTTP 500" in warned[0], warned
        secret_nowhere(orch_home, *procs)
    finally:
        broken.close()

    # Nothing listening there any more: refused, said in one line, still without the URL.
    code = ("from orchestrator import notify\n"
            f"notify.post({broken.url!r}, 'hello').join(10)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and len(proc.stderr.strip().splitlines()) == 1 and "not delivered" in proc.stderr
    assert SECRET not in proc.stderr and "services" not in proc.stderr


def test_a_finished_job_is_posted_with_slack_markup_escaped(orch_home, hook):
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["job"]\n')
    code = ("from orchestrator import notify\n"
            "notify.job_ended('nightly', 'completed', 'weights home <!channel> & done')\n"
            "notify.job_ended('other', 'failed', 'no offer')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=True)
    assert proc.stderr == ""  # at exit orch waited for both posts
    assert sorted(hook.texts()) == ["orch: job nightly completed: weights home &lt;!channel&gt; &amp; done",
                                    "orch: job other failed: no offer"]


@pytest.mark.parametrize("section, needle", [
    ('webhook_url = "ftp://127.0.0.1/services/XyZzy"', "http(s)"),
    ('webhook_url = "http://127.0.0.1/x"\nevents = ["everything"]', "notify.events"),
    ('hook = "http://127.0.0.1/x"', "unknown notify setting"),
])
def test_bad_notify_settings_are_one_line_exit_2(orch_home, section, needle):
    write_config(orch_home, f"[notify]\n{section}\n")
    proc = run_orch("up", "box1", "--cpu")
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "XyZzy" not in proc.stderr
    assert not (orch_home / "ledger.db").exists() or \
        json.loads(run_orch("status", "--all", "--json").stdout or "[]") == []
