"""Commands on an instance run through its account's login shell, as sshd runs them; a detached
launch returns at once in every shell and outlives the SSH session. Tried on fake cloud hosts
(containers whose root logs in to bash, dash or zsh) and on the local provider."""

import getpass
import pwd
import shutil
import subprocess
import threading
import time

import pytest

from orchestrator.ssh import remote
from playbooks import host as on_host
from tests.clouds import arrange, open_orch
from tests.conftest import run_orch
from tests.fakes.hosts import Host, sshd_available

pytestmark = pytest.mark.skipif(not sshd_available(), reason="fake hosts need root, unshare and sshd")
SHELLS = ["/bin/bash", "/bin/dash", "/usr/bin/zsh"]


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    path = tmp_path_factory.mktemp("key") / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


@pytest.fixture
def machine(tmp_path, key, request):
    shell = request.param
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed here")
    h = Host(tmp_path / "host", env={"PUBLIC_KEY": key[1]}, login_shell=shell)
    h.boot()
    h.login = shell.rsplit("/", 1)[-1]
    yield h
    h.destroy()


def connect(h, key):
    return remote.connect(h.address, h.port, "root", key[0], None)


def within(seconds, fn):
    """fn() in a thread: (its result, or None if it did not return in time)."""
    box = {}
    t = threading.Thread(target=lambda: box.update(value=fn()), daemon=True)
    t.start()
    t.join(seconds)
    return box.get("value")


@pytest.mark.parametrize("machine", SHELLS, indirect=True)
def test_commands_run_through_the_login_shell(machine, key):
    with connect(machine, key) as c:
        assert remote.run(c, "ps -o comm= -p $$; :").strip() == machine.login  # ": " keeps the shell from exec-ing ps


@pytest.mark.parametrize("machine", SHELLS, indirect=True)
def test_a_detached_launch_returns_at_once_and_outlives_the_session(machine, key):
    with connect(machine, key) as c:
        t0 = time.monotonic()
        pid = within(20, lambda: on_host.detach(c, ["sleep", "300"], "/tmp/sleep.log", cwd="/tmp"))
        took = time.monotonic() - t0
    assert pid is not None, "detach did not return: the SSH channel stayed open"
    assert took < 5, f"detach took {took:.1f} s"
    with connect(machine, key) as c:  # a new session, the first one closed
        assert remote.run(c, f"kill -0 {pid} && echo alive", check=False).strip() == "alive"
        assert remote.run(c, f"ps -o args= -p {pid}").strip() == "sleep 300"


@pytest.mark.parametrize("machine", ["/bin/bash"], indirect=True)
def test_the_fake_host_reproduces_the_bash_hang_a_cloud_image_has(machine, key):
    """The shape orch used before: in bash the backgrounded list keeps the channel open. A host
    that ran commands through /bin/sh (dash) would have hidden this."""
    with connect(machine, key) as c:
        hung = within(5, lambda: c.run("cd /tmp && setsid nohup sleep 30 > /dev/null 2>&1 < /dev/null &",
                                       hide=True, warn=True, in_stream=False))
    assert hung is None


def test_the_local_provider_runs_commands_through_the_login_shell(orch_home):
    arrange(open_orch(), "sh1")  # a ready local instance: its sshd, not provisioning, is under test
    try:
        got = run_orch("ssh", "sh1", "--", "ps -o comm= -p $$; :", check=0).stdout.strip()
        login = pwd.getpwnam(getpass.getuser()).pw_shell.rsplit("/", 1)[-1]
        assert got == login
    finally:
        run_orch("down", "sh1", check=0)


@pytest.mark.parametrize("machine", SHELLS[:1], indirect=True)
def test_a_connection_that_ends_during_a_command_is_an_ssh_error_in_one_line(machine, key):
    """Another orch process destroys the instance while this one reads it: sshd goes mid-command.
    What reaches the caller is orch's SSHError (which status and reconcile report as unreachable),
    never paramiko's exception (an internal error for the user)."""
    from orchestrator.errors import SSHError

    with connect(machine, key) as c:
        with pytest.raises(SSHError, match=r"remote command failed \(-1\)|ended during a command"):  # either way
            remote.run(c, "kill -9 $PPID; sleep 5")  # the sshd process serving this very connection
        with pytest.raises(SSHError, match="ended during a command") as e:  # the next command on it
            remote.run(c, "true")
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("machine", ["/bin/bash"], indirect=True)
def test_a_script_whose_process_is_killed_under_it_is_an_ssh_error_not_a_bad_answer(machine, key):
    """A node destroyed while orch reads its run (its sshd and the session's processes killed): the
    session ends with no exit status and no answer. That is the connection lost (an SSHError: the job
    counts the node unreachable and asks its provider), not an instance that answered badly, which
    ended `orch run --wait` on a RunPod cluster whose member pod ended under the read."""
    from orchestrator.errors import OrchError, SSHError

    with connect(machine, key) as c:
        remote.run(c, "printf '#!/bin/sh\\nkill -9 $$\\n' > /tmp/dies; chmod +x /tmp/dies; "
                      "printf '#!/bin/sh\\necho broken >&2; exit 1\\n' > /tmp/fails; chmod +x /tmp/fails")
        with pytest.raises(SSHError, match="ended"):
            on_host.script(c, "run_status.py", "/nowhere", python_path="/tmp/dies")
        with pytest.raises(OrchError, match="no answer") as bad:  # it exited, badly: its answer is bad
            on_host.script(c, "run_status.py", "/nowhere", python_path="/tmp/fails")
        assert not isinstance(bad.value, SSHError)
