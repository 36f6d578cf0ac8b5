"""What a machine is made ready with once SSH answers, as data: a job kind says it
(``JobKind.provisioning``), the lifecycle remembers it on the instance's row and runs it after SSH
answers and again after every start (``playbooks.provision`` does the work), so the lifecycle knows
no package by name.

A ``Provisioning`` is torch for the machine's device, then its ``packages`` over that torch (held by
a constraint), then the proof: a matmul on the device. None instead is "SSH answering is all": the
machine's setup is its user's (``orch check``, a command job's ``setup:``).

``MACHINE`` is what a machine gets where no kind says otherwise: ``orch up``'s machine, on which
``orch up --data`` and ``orch train`` run LibreYOLO, LibreYOLO's job kind, and every row made before
a kind chose (its memory says nothing). Words only: no SSH here, so the CLI loads no Fabric for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import OrchError

# An import name, which pip takes as the distribution's name too: nothing a pip option, a version
# range, a URL or a path could hide in (a row's memory is input: a shared ledger is untrusted).
PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


@dataclass(frozen=True)
class Provisioning:
    packages: tuple[str, ...] = ()  # each installed with pip where it does not import, and imported by that name
    says: str = "torch for the device"  # what the bring-up's "[3/4] provisioning (...)" line says it installs

    def __post_init__(self):
        bad = [p for p in self.packages if not isinstance(p, str) or not PACKAGE.fullmatch(p)]
        if bad or not isinstance(self.says, str) or not self.says.isprintable() or len(self.says) > 120:
            raise OrchError(f"a provisioning names {bad[0]!r}: not a package's import name" if bad else
                            "a provisioning's line must be printable text of at most 120 characters")

    def memory(self) -> dict:
        """What the instance's row remembers of it (``recalled`` reads it back)."""
        return {"packages": list(self.packages), "says": self.says}


MACHINE = Provisioning(packages=("libreyolo",), says="torch for the device, then LibreYOLO")


def remembered(steps: Provisioning | None):
    """The row's memory of ``steps`` (its ``prepare`` key): False for none, nothing for ``MACHINE``
    (as every row made before kinds chose), else the steps themselves."""
    if not steps:
        return False
    return None if steps == MACHINE else steps.memory()


def recalled(value) -> Provisioning | None:
    """The steps a row's memory names (``remembered``); a value no orch wrote is refused."""
    if value is None:
        return MACHINE
    if value is False:
        return None
    if not isinstance(value, dict) or set(value) != {"packages", "says"} or not isinstance(value["packages"], list):
        raise OrchError("the instance's recorded provisioning is not one orch writes: refused")
    return Provisioning(tuple(value["packages"]), value["says"])
