"""The test hook that stands for a crash: ``ORCH_TEST_KILL_AT=<name>`` SIGKILLs the process at the
``kill_point`` of that name (the tests kill orch at every step of a launch and look at what it left)."""

from __future__ import annotations

import os
import signal


def kill_point(name: str) -> None:
    if os.environ.get("ORCH_TEST_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
