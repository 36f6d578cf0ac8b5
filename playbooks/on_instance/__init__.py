"""Everything orch runs on an instance, as real files: uploaded to ``$W/orch/bin/`` and run there by
the instance's Python (standard library only, unless a script says otherwise). Each answers with
one ``ORCH_RESULT {json}`` line (``playbooks.host.script`` reads it).

The controller imports one of them, ``watchdog``, for the definition of busy and idle that the
reaper shares with it; nothing here imports orch.
"""
