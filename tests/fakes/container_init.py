"""PID 1 of a fake cloud host (see hosts.py): standard library only, run by ``unshare`` as root.

It does what a container runtime and a cloud image's entrypoint do between them:

1. the runtime's part, in the new mount namespace: an overlay root whose lower layer is this
   machine's ``/`` (the image) and whose upper layer is the container disk; fresh ``/proc`` (the
   new PID namespace), ``/dev``, ``/sys``, ``/run``, ``/tmp``; the volume bind-mounted at its mount
   path; then ``chroot`` into it;
2. the image's part (``start.sh`` on RunPod's images): SSH host keys (new ones at every boot where
   the image deletes them), the authorized key from ``PUBLIC_KEY``, the environment file SSH
   sessions may source, then ``sshd``;
3. init's part: reap orphans for as long as sshd lives. When this process dies, the kernel ends
   every process of the namespace: that is what a stop does to a container.

The container's environment is this process's own (``/proc/1/environ`` inside the host).

    unshare --mount --pid --fork --kill-child --propagation private -- python3 container_init.py CONFIG
"""

import json
import os
import shlex
import subprocess
import sys
import time


def sh(*argv):
    subprocess.run(argv, check=True)


def runtime(cfg):
    """Mounts, as the container runtime makes them; returns the new root."""
    root, upper, work = cfg["rootfs"], cfg["upper"], cfg["work"]
    os.makedirs(upper, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}", root)
    sh("mount", "-t", "proc", "proc", f"{root}/proc")
    sh("mount", "--rbind", "/dev", f"{root}/dev")
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", f"{root}/dev/shm")  # not this machine's
    sh("mount", "--rbind", "/sys", f"{root}/sys")
    for path in ("/run", "/tmp"):
        sh("mount", "-t", "tmpfs", "-o", "mode=1777" if path == "/tmp" else "mode=0755", "tmpfs", root + path)
    if cfg.get("volume") and cfg.get("mount_path"):
        target = root + cfg["mount_path"]
        os.makedirs(target, exist_ok=True)
        sh("mount", "--bind", cfg["volume"], target)
    # Hide this machine's own scratch space where it would show through the image (pytest's tmp
    # dirs live under /tmp, which the tmpfs above already hides; the fakes' state lives there too).
    for hidden in cfg.get("hide", []):
        if os.path.isdir(root + hidden):
            sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", root + hidden)
    # The image's Python where this machine keeps it under a hidden folder (a checkout and its .venv
    # under /tmp): shown through an overlay of its own, so what the container writes there lands on
    # its own disk, as everything else it writes, never in the real folder.
    for n, path in enumerate(cfg.get("keep", [])):
        os.makedirs(root + path, exist_ok=True)
        layer, scratch = f"{upper}-keep{n}", f"{work}-keep{n}"
        os.makedirs(layer, exist_ok=True)
        os.makedirs(scratch, exist_ok=True)
        sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={path},upperdir={layer},workdir={scratch}",
           root + path)
    return root


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def image(cfg):
    """What the image's entrypoint does at every start, inside the new root."""
    for name, text in cfg.get("files", {}).items():  # the image's own files (.bashrc, python3 ...)
        write(name, text["text"], int(text.get("mode", "644"), 8))
    keys = [f"/etc/ssh/ssh_host_{kind}_key" for kind in ("ed25519",)]
    if cfg.get("new_host_keys_each_boot"):
        # RunPod's images delete the baked keys and make new ones at every start.
        for name in os.listdir("/etc/ssh"):
            if name.startswith("ssh_host_"):
                os.remove(os.path.join("/etc/ssh", name))
    for key in keys:
        if not os.path.exists(key):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", key)
    # Only the host key we made: the machine's own ecdsa/rsa keys are not this host's.
    for name in os.listdir("/etc/ssh"):
        if name.startswith("ssh_host_") and not any(name.startswith(os.path.basename(k)) for k in keys):
            os.remove(os.path.join("/etc/ssh", name))
    public = os.environ.get("PUBLIC_KEY", "")
    if public:
        os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)
        path = "/root/.ssh/authorized_keys"
        have = open(path).read() if os.path.exists(path) else ""
        if public.strip() not in have:
            write(path, have + public.strip() + "\n", 0o600)
    env_file = cfg.get("env_file")
    if env_file:  # the container's environment, written where an SSH session may source it
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                 if k.replace("_", "").isalnum() and not k[0].isdigit() and k not in ("PWD", "SHLVL", "_")]
        write(env_file, "\n".join(lines) + "\n", 0o644)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    root = runtime(cfg)
    os.chroot(root)
    os.chdir("/")
    image(cfg)
    log = open("/var/log/sshd.log", "ab")
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config"], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log)
    print(f"container up: sshd pid {sshd.pid}", flush=True)
    while True:  # init: reap whatever is orphaned to us; the container lives as long as sshd
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.5)
            continue
        if pid == sshd.pid:
            print(f"sshd exited ({status}): the container stops", flush=True)
            return 1


if __name__ == "__main__":
    sys.exit(main())
