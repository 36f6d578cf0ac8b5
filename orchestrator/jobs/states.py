"""A job's states, and its attempts' (the ledger's words)."""

# Job states
PLANNED, RUNNING, RECOVERING = "planned", "running", "recovering"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
ACTIVE = (PLANNED, RUNNING, RECOVERING)
ENDED = (COMPLETED, FAILED, CANCELLED)
# Attempt states: "running" while its work runs, "completed" once its results are home
LAUNCHING, ATTEMPT_RUNNING, ATTEMPT_DONE = "launching", "running", "completed"
LOST, LAUNCH_FAILED, INTERRUPTED, STOPPED_BY_JOB = "lost", "failed", "interrupted", "cancelled"
