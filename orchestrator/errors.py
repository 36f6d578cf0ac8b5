"""The errors orch raises on purpose. Anything else reaching the CLI is a bug."""


class OrchError(Exception):
    """A failure with a message meant for the user (exit code 1)."""

    exit_code = 1


class UsageError(OrchError):
    """Bad input: nothing was created, billed or changed (exit code 2)."""

    exit_code = 2


class ProviderError(OrchError):
    """The provider failed or refused; never read as an empty answer."""


class AuthError(ProviderError):
    """The provider rejected the credentials."""


class NoCapacity(ProviderError):
    """The provider has no machine matching the request right now."""


class StartRefused(ProviderError):
    """A stopped instance could not get its GPUs back; its disk is kept."""


class SSHError(OrchError):
    """The instance could not be reached over SSH (now): worth trying again later."""


class HostKeyMismatch(OrchError):
    """The instance presented a host key other than the pinned one: a possible interception.

    Not an ``SSHError`` on purpose: whoever treats "unreachable" as "try later" must never pass
    over this one by accident."""


class VerifyFailed(OrchError):
    """The device does not work (no GPU, or a torch built for another one)."""


class IllegalTransition(OrchError):
    """A state change that the lifecycle does not allow, or that lost a race."""


class Busy(OrchError):
    """Another orch process is working on this instance."""
