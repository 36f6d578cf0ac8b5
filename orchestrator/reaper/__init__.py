"""What runs unattended: the rules (pure: idle, deadline, break-even: ``rules``), one reaper pass
(``reaper``), the reaper on a timer (``reaper_timer``: systemd, cron or a loop), one duty pass (the
reaper, every job advanced, every due schedule started: ``duty``) and the detached watcher that runs
it while a job is active (``watcher``).

Layers 7 to 13 (ARCHITECTURE.md): ``rules`` is a check, ``reaper`` and ``reaper_timer`` look at the
fleet, ``duty`` and ``watcher`` sit above the jobs."""
