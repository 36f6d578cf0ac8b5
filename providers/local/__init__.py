"""The embedded default: each instance is a real OpenSSH sshd on a loopback address of its own.

An instance lives in ``$ORCH_HOME/local/<label>/``: its host key, its sshd config and its
``home/``, which is the instance's disk. Stop ends sshd and every process of the instance and
keeps ``home/``; start brings sshd back on the same home and host key; destroy removes it all.
GPUs are what ``nvidia-smi`` reports on this machine (none: CPU-only instances).
``compute`` holds the verbs, ``sshd`` one instance's server and processes, ``python`` each
instance's own Python (the controller's packages seen, its own installs kept in its home),
``machine`` this machine's GPUs.
"""

from orchestrator.hookspecs import hookimpl
from providers.local.compute import LocalProvider
from providers.local.machine import local_gpus, local_vram_gb
from providers.local.sshd import (alive, host_key, instance_pids, kill_instance, running, sshd_pid,
                                  start_sshd)

__all__ = ["LocalProvider", "local_gpus", "local_vram_gb", "alive", "host_key", "instance_pids", "kill_instance",
           "running", "sshd_pid", "start_sshd"]


@hookimpl
def register_providers(register):
    register(LocalProvider)
