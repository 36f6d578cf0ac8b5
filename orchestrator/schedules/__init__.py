"""Schedules: when a run is due (``cron``, pure), the schedules and each occurrence settled
(``ledger_schedules``), each schedule's secrets kept at home (``schedule_secrets``), and a due run
launched through ``jobs.submit`` (``scheduling``).

Layers 2, 6 and 13 (ARCHITECTURE.md); each imports only from its own layer and below."""
