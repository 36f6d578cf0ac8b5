"""The instance lifecycle in the ledger, as an explicit state machine; anything not listed is refused.

These are the ledger's states. What a provider says of an instance right now is another type
(``provider.Status``); ``sync`` turns the one into the other.
"""

REQUESTED = "requested"        # intent written, provider not called yet (or call in flight)
PROVISIONING = "provisioning"  # provider created it; SSH, provisioning and verify under way
READY = "ready"                # verified, usable
STOPPING = "stopping"
STOPPED = "stopped"            # no compute billed; the disk may still bill
STARTING = "starting"          # orch asked for a start: waiting, then provisioning and verify again
SCHEDULING = "scheduling"      # a start was accepted and waits for the host to free a GPU (Vast.ai)
UNATTENDED = "unattended"      # running at the provider though orch neither started nor prepared it: it bills
BROKEN = "broken"              # its container exited or its host dropped: it will not run again by itself
PREEMPTED = "preempted"        # a spot instance stopped (or ended) by the provider, not by us
DESTROYING = "destroying"
DESTROYED = "destroyed"        # confirmed gone at the provider
FAILED = "failed"              # never came to exist at the provider
LOST = "lost"                  # gone at the provider without orch destroying it

TRANSITIONS: dict[str, set[str]] = {
    REQUESTED: {PROVISIONING, FAILED, DESTROYING, LOST},
    PROVISIONING: {READY, DESTROYING, STOPPING, PREEMPTED, BROKEN, LOST},
    READY: {STOPPING, STOPPED, DESTROYING, PREEMPTED, PROVISIONING, BROKEN, LOST},  # STOPPED: from inside
    STOPPING: {STOPPED, READY, BROKEN, DESTROYING, LOST},
    STOPPED: {STARTING, SCHEDULING, UNATTENDED, BROKEN, DESTROYING, LOST},
    STARTING: {READY, STOPPING, STOPPED, SCHEDULING, UNATTENDED, PREEMPTED, BROKEN, DESTROYING, LOST},
    SCHEDULING: {STARTING, STOPPING, STOPPED, UNATTENDED, BROKEN, DESTROYING, LOST},
    UNATTENDED: {STARTING, STOPPING, STOPPED, SCHEDULING, PREEMPTED, BROKEN, DESTROYING, LOST},
    BROKEN: {READY, UNATTENDED, STOPPING, STOPPED, DESTROYING, LOST},
    PREEMPTED: {STARTING, SCHEDULING, UNATTENDED, STOPPED, BROKEN, DESTROYING, LOST},
    DESTROYING: {DESTROYED, LOST},
    DESTROYED: set(),
    FAILED: set(),
    LOST: set(),
}

TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
LIVE = frozenset(TRANSITIONS) - TERMINAL
# What the provider bills in each state; the cost report reads these. A broken instance is billed
# as running until it is destroyed (Vast.ai bills an exited container as running).
BILLING_COMPUTE = frozenset({PROVISIONING, READY, STOPPING, STARTING, UNATTENDED, BROKEN})
BILLING_DISK_ONLY = frozenset({STOPPED, PREEMPTED, SCHEDULING})
# Another orch process is moving the instance through these (or `orch reconcile` settles them).
IN_PROGRESS = frozenset({REQUESTED, PROVISIONING, STARTING, STOPPING, DESTROYING})


def allowed(src: str, dst: str) -> bool:
    return dst in TRANSITIONS.get(src, set())

# A volume's states (``ledger_volumes``): written ``creating`` before its provider is asked, like an
# instance's ``requested``; ``deleting`` before the provider is asked to delete it.
VOLUME_CREATING, VOLUME_READY, VOLUME_FAILED = "creating", "ready", "failed"
VOLUME_DELETING, VOLUME_DELETED = "deleting", "deleted"
VOLUME_TRANSITIONS: dict[str, set[str]] = {
    VOLUME_CREATING: {VOLUME_READY, VOLUME_FAILED, VOLUME_DELETING},
    VOLUME_READY: {VOLUME_DELETING, VOLUME_DELETED},  # DELETED: gone at its provider, found by reconcile
    VOLUME_DELETING: {VOLUME_DELETED, VOLUME_READY},
    VOLUME_FAILED: set(),
    VOLUME_DELETED: set(),
}
VOLUME_LIVE = frozenset(s for s, nxt in VOLUME_TRANSITIONS.items() if nxt)  # what may bill
