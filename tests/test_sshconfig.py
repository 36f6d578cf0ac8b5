"""`orch ssh-config`: the real OpenSSH client (ssh, scp) against real local sshd instances.

What is tested here is the file and what OpenSSH does through it, not provisioning: the instances
are ready local ones made without it (``tests.clouds.arrange``: a real sshd, in the ledger, its
host key vouched for by the local provider), as ``orch up`` leaves them minus torch's probe."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clouds import arrange, open_orch
from tests.conftest import ROOT, run_orch

pytestmark = pytest.mark.skipif(not all(map(shutil.which, ("ssh", "scp", "rsync"))),
                                reason="needs OpenSSH's client and rsync (scripts/install.sh --test)")


def ssh(config: Path, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=20", *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def hosts(config: Path) -> list[str]:
    return [line.split()[1] for line in config.read_text().splitlines() if line.startswith("Host ")]


@pytest.mark.long
def test_ssh_and_scp_reach_the_instance_and_the_file_follows_up_stop_start_down(orch_home, tmp_path):
    arrange(open_orch(), "box1")
    proc = run_orch("ssh-config", check=0)
    config = Path(proc.stdout.strip())
    assert config == orch_home / "ssh_config" and "orch-box1" in proc.stderr
    assert hosts(config) == ["orch-box1"]
    assert "StrictHostKeyChecking yes" in config.read_text()
    assert oct(config.stat().st_mode & 0o777) == "0o600"

    assert ssh(config, "orch-box1", "true").returncode == 0
    assert ssh(config, "orch-box1", "echo", "$ORCH_INSTANCE_ID").stdout.strip()
    local = tmp_path / "up.txt"
    local.write_text("sent with scp\n")
    subprocess.run(["scp", "-F", str(config), "-o", "BatchMode=yes", str(local), "orch-box1:up.txt"], check=True,
                   capture_output=True, timeout=60)
    assert ssh(config, "orch-box1", "cat", "up.txt").stdout == "sent with scp\n"
    back = tmp_path / "back.txt"
    subprocess.run(["scp", "-F", str(config), "-o", "BatchMode=yes", "orch-box1:up.txt", str(back)], check=True,
                   capture_output=True, timeout=60)
    assert back.read_text() == "sent with scp\n"
    # rsync over the same entry (rsync must be on both ends: the local instance shares this machine's).
    synced = tmp_path / "synced"
    subprocess.run(["rsync", "-a", "-e", f"ssh -F {config} -o BatchMode=yes", "orch-box1:up.txt", str(synced)],
                   check=True, capture_output=True, timeout=60)
    assert synced.read_text() == "sent with scp\n"

    # A second instance appears without running ssh-config again (the instance_event hook, here in
    # this process's Orch; `orch stop`, `start` and `down` below are the CLI's own processes).
    arrange(open_orch(), "box2")
    assert hosts(config) == ["orch-box1", "orch-box2"]
    assert ssh(config, "orch-box2", "true").returncode == 0

    run_orch("stop", "box1", check=0)
    assert ssh(config, "orch-box1", "true").returncode != 0  # stopped: no sshd to reach
    run_orch("start", "box1", check=0)
    assert "orch-box1" in hosts(config)
    assert ssh(config, "orch-box1", "cat", "up.txt").stdout == "sent with scp\n"  # the disk was kept

    run_orch("down", "box2", check=0)
    assert hosts(config) == ["orch-box1"]
    run_orch("down", "box1", check=0)
    assert hosts(config) == []
    assert (orch_home / "ssh_known_hosts").read_text() == ""


@pytest.mark.skipif(not shutil.which("rsync"), reason="needs rsync")
def test_rsync_and_what_vscode_remote_ssh_does_work_through_the_entry(orch_home, tmp_path):
    arrange(open_orch(), "box1")
    config = Path(run_orch("ssh-config", check=0).stdout.strip())
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.txt").write_text("beta\n")
    rsh = f"ssh -F {config} -o BatchMode=yes"
    subprocess.run(["rsync", "-a", "-e", rsh, f"{src}/", "orch-box1:synced/"], check=True, capture_output=True,
                   timeout=60)
    back = tmp_path / "back"
    subprocess.run(["rsync", "-a", "-e", rsh, "orch-box1:synced/", f"{back}/"], check=True, capture_output=True,
                   timeout=60)
    assert (back / "a.txt").read_text() == "alpha\n" and (back / "sub" / "b.txt").read_text() == "beta\n"

    # VS Code's Remote-SSH: `ssh -T HOST bash` with its install script on stdin, then a local forward
    # to the server it started there (here the instance's own sshd stands in for that server).
    proc = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "-T", "orch-box1", "bash"],
                          input="echo vscode-$((6 * 7))\nuname -s\n", capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["vscode-42", "Linux"], proc.stderr
    resolved = dict(line.split(" ", 1) for line in ssh(config, "-G", "orch-box1").stdout.splitlines() if " " in line)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        lport = s.getsockname()[1]
    forward = subprocess.Popen(["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
                                "-N", "-L", f"127.0.0.1:{lport}:{resolved['hostname']}:{resolved['port']}", "orch-box1"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        banner, deadline = b"", time.monotonic() + 30
        while not banner and time.monotonic() < deadline and forward.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", lport), timeout=5) as c:
                    banner = c.recv(64)
            except OSError:
                time.sleep(0.3)
        assert banner.startswith(b"SSH-2.0-"), (banner, forward.poll())
    finally:
        forward.terminate()
        forward.wait(10)
    run_orch("down", "box1", check=0)


def test_a_host_key_other_than_the_pinned_one_is_refused(orch_home):
    arrange(open_orch(), "box1")
    config = Path(run_orch("ssh-config", check=0).stdout.strip())
    known = orch_home / "ssh_known_hosts"
    host, _key = known.read_text().split(" ", 1)
    # Some other machine's key pinned for that endpoint: ssh must refuse rather than ask or accept.
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(orch_home.parent / "other")],
                           check=True, capture_output=True)
    assert other.returncode == 0
    known.write_text(f"{host} {(orch_home.parent / 'other.pub').read_text().split()[0]} "
                     f"{(orch_home.parent / 'other.pub').read_text().split()[1]}\n")
    proc = ssh(config, "orch-box1", "true")
    assert proc.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in proc.stderr.upper()
    run_orch("down", "box1", check=0)


def test_install_is_idempotent_with_a_backup_and_uninstall_takes_it_out(orch_home, tmp_path):
    user_ssh = Path.home() / ".ssh"
    assert str(user_ssh).startswith(str(tmp_path))  # the tests' HOME, never the developer's
    user_ssh.mkdir(mode=0o700)
    cfg = user_ssh / "config"
    original = "Host elsewhere\n    User someone\n    Port 2222\n"
    cfg.write_text(original)
    cfg.chmod(0o600)

    arrange(open_orch(), "box1")
    proc = run_orch("ssh-config", "--install", check=0)
    text = cfg.read_text()
    include = f'Include "{orch_home / "ssh_config"}"'
    assert text.splitlines().count(include) == 1 and text.endswith(original)
    assert text.index(include) < text.index("Host elsewhere")  # before any Host line, or it applies to that host only
    backups = sorted(user_ssh.glob("config.orch-backup-*"))
    assert len(backups) == 1 and backups[0].read_text() == original and "backup" in proc.stderr
    assert oct(cfg.stat().st_mode & 0o777) == "0o600"

    # ssh reads ~/.ssh/config from the account's home, not $HOME: -F names the file the user would have.
    assert ssh(cfg, "orch-box1", "echo", "through Include").stdout.strip() == "through Include"
    assert ssh(cfg, "-G", "elsewhere").stdout.count("port 2222") == 1  # the user's own entries still apply

    proc = run_orch("ssh-config", "--install", check=0)
    assert cfg.read_text() == text and "already" in proc.stderr
    assert len(list(user_ssh.glob("config.orch-backup-*"))) == 1

    run_orch("ssh-config", "--uninstall", check=0)
    assert cfg.read_text() == original
    assert not (orch_home / "ssh_config").exists()
    run_orch("down", "box1", check=0)
    assert not (orch_home / "ssh_config").exists()  # uninstalled: orch keeps no file any more
    assert run_orch("ssh-config", "--uninstall", check=0).returncode == 0  # twice is fine


def test_install_without_a_user_config_creates_one(orch_home):
    cfg = Path.home() / ".ssh" / "config"
    run_orch("ssh-config", "--install", check=0)
    assert cfg.read_text().count("Include") == 1
    assert not list(cfg.parent.glob("config.orch-backup-*"))  # nothing to back up
    run_orch("ssh-config", "--uninstall", check=0)
    assert cfg.read_text() == ""


def test_an_orch_home_with_a_space_works_through_the_include(tmp_path, monkeypatch):
    home = tmp_path / "Application Support" / "orch"  # macOS's kind of path
    monkeypatch.setenv("ORCH_HOME", str(home))
    try:
        arrange(open_orch(), "box1")  # opened after ORCH_HOME moved: the spaced home's ledger
        proc = run_orch("ssh-config", "--install", check=0)
        assert f"ssh -F '{home / 'ssh_config'}'" not in proc.stderr  # installed: no -F hint needed
        cfg = Path.home() / ".ssh" / "config"
        assert ssh(cfg, "orch-box1", "echo", "spaced").stdout.strip() == "spaced"
        run_orch("ssh-config", "--uninstall", check=0)
        proc = run_orch("ssh-config", check=0)
        assert f"ssh -F '{home / 'ssh_config'}' orch-NAME" in proc.stderr  # a hint that pastes as it is
    finally:
        run_orch("down", "box1")


def test_install_refuses_a_path_ssh_would_read_as_a_pattern(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "100%" / "orch"))
    proc = run_orch("ssh-config", "--install")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "ORCH_HOME" in proc.stderr
    assert not (tmp_path / "100%").exists() and not (Path.home() / ".ssh").exists()


def test_install_then_uninstall_in_one_second_keeps_both_backups(orch_home):
    cfg = Path.home() / ".ssh" / "config"
    cfg.parent.mkdir(mode=0o700)
    cfg.write_text("Host mine\n    Port 2200\n")
    code = ("from orchestrator.ssh import sshconfig\n"
            "print(sshconfig.install()[1])\nprint(sshconfig.uninstall()[1])\n")
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout.split()
    assert len(set(made)) == 2
    assert Path(made[0]).read_text() == "Host mine\n    Port 2200\n" == cfg.read_text()
    assert "Include" in Path(made[1]).read_text()


def test_install_and_uninstall_together_is_one_line_exit_2(orch_home):
    proc = run_orch("ssh-config", "--install", "--uninstall")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (Path.home() / ".ssh").exists() and not (orch_home / "ssh_config").exists()
