"""What a provider is: a few verbs over one cloud, and an honest list of what it can do.

A provider never pretends. A listing that fails raises; ``destroy`` is idempotent and returns only
once the provider confirms the instance is gone; a feature it lacks is a mixin it does not inherit,
so the CLI can say "not supported by <provider>" instead of failing halfway. Whatever differs
between providers is a method, a declared attribute or a feature here, so the core never names
one. ``base`` holds the verbs, ``features`` the optional ones, ``model`` the words both sides use,
``http`` the one retry verdict, ``grace`` the wait for a just-made instance to show.
"""

from orchestrator.provider.base import Provider
from orchestrator.provider.features import RentsGroups, SelfEnding, Stoppable, can_stop, self_end_commands
from orchestrator.provider.model import (HOURS_PER_MONTH, TAG, Capabilities, Endpoint, Offer, Progress, Remote,
                                         Request, Status, bid_with_margin, key_name, label_for, parse_label,
                                         stopped_rate)

__all__ = ["Provider", "Stoppable", "SelfEnding", "RentsGroups", "can_stop", "self_end_commands", "Capabilities",
           "Endpoint", "Offer", "Progress", "Remote", "Request", "Status", "HOURS_PER_MONTH", "TAG",
           "bid_with_margin", "key_name", "label_for", "parse_label", "stopped_rate"]
