"""Jobs (``orch run``): a piece of work from a request to its results on disk, at the lowest cost
per job, over as many machines as it takes, surviving lost ones.

``spec`` (states, names, ``JobSpec``, ``Submission``), ``request`` (flags or a task file in, a ``Submission`` out), ``submit`` (the one path in), ``plan`` (the
offer), ``engine`` (``advance``: one look, one step), ``caps`` (cost, --max-cost, --max-hours),
``group`` (an attempt on N machines), ``kinds`` (what a job runs: a LibreYOLO training, a
command), ``resume_copy`` (the training's checkpoint copy), ``record`` (folders, history lines).
"""

from orchestrator.jobs.caps import cost
from orchestrator.jobs.engine import advance, advance_all, cancel
from orchestrator.jobs.plan import Choice, check_plan, plan
from orchestrator.jobs.spec import MAX_GROUP_JOB_NAME, MAX_NAME, MAX_RETRIES, JobSpec, Submission, check_job_name
from orchestrator.jobs.states import (ACTIVE, CANCELLED, COMPLETED, ENDED, FAILED, PLANNED, RECOVERING, RUNNING,
                                      STOPPED)
from orchestrator.jobs.submit import OverEstimate, Submitted, submit

__all__ = ["ACTIVE", "ENDED", "PLANNED", "RUNNING", "RECOVERING", "COMPLETED", "FAILED", "CANCELLED", "STOPPED",
           "MAX_NAME", "MAX_GROUP_JOB_NAME", "MAX_RETRIES", "Choice", "OverEstimate", "JobSpec", "Submission", "Submitted", "advance",
           "advance_all", "cancel", "check_job_name", "check_plan", "cost", "plan", "submit"]
