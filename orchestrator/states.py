"""The instance lifecycle as an explicit state machine; anything not listed here is refused."""

REQUESTED = "requested"        # intent written, provider not called yet (or call in flight)
PROVISIONING = "provisioning"  # provider created it; SSH, provisioning and verify under way
READY = "ready"                # verified, usable
STOPPING = "stopping"
STOPPED = "stopped"            # no compute billed; the disk may still bill
STARTING = "starting"
PREEMPTED = "preempted"        # a spot instance stopped by the provider, not by us
DESTROYING = "destroying"
DESTROYED = "destroyed"        # confirmed gone at the provider
FAILED = "failed"              # never came to exist at the provider
LOST = "lost"                  # gone at the provider without orch destroying it

TRANSITIONS: dict[str, set[str]] = {
    REQUESTED: {PROVISIONING, FAILED, DESTROYING, LOST},
    PROVISIONING: {READY, DESTROYING, STOPPING, PREEMPTED, LOST},
    READY: {STOPPING, STOPPED, DESTROYING, PREEMPTED, PROVISIONING, LOST},  # STOPPED: stopped from inside
    STOPPING: {STOPPED, READY, DESTROYING, LOST},
    STOPPED: {STARTING, DESTROYING, LOST},
    STARTING: {READY, STOPPED, PREEMPTED, DESTROYING, PROVISIONING, LOST},
    PREEMPTED: {STARTING, DESTROYING, STOPPED, LOST},
    DESTROYING: {DESTROYED, LOST},
    DESTROYED: set(),
    FAILED: set(),
    LOST: set(),
}

TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
LIVE = frozenset(TRANSITIONS) - TERMINAL
# States in which the provider bills compute (and the disk); the cost report reads these.
BILLING_COMPUTE = frozenset({PROVISIONING, READY, STOPPING, STARTING})
BILLING_DISK_ONLY = frozenset({STOPPED, PREEMPTED})


def allowed(src: str, dst: str) -> bool:
    return dst in TRANSITIONS.get(src, set())
