"""A job's states, and its attempts' (the ledger's words)."""

# Job states
PLANNED, RUNNING, RECOVERING = "planned", "running", "recovering"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
STOPPED = "stopped"  # ended by the [budget] (its reason says so): what it had came home first
ACTIVE = (PLANNED, RUNNING, RECOVERING)
ENDED = (COMPLETED, FAILED, CANCELLED, STOPPED)
# Attempt states: "running" while its work runs, "completed" once its results are home
LAUNCHING, ATTEMPT_RUNNING, ATTEMPT_DONE = "launching", "running", "completed"
LOST, LAUNCH_FAILED, INTERRUPTED, STOPPED_BY_JOB = "lost", "failed", "interrupted", "cancelled"
