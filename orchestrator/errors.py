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
    """The instance could not be reached or refused us over SSH."""


class HostKeyMismatch(SSHError):
    """The instance presented a host key other than the pinned one."""


class IllegalTransition(OrchError):
    """A state change that the lifecycle does not allow, or that lost a race."""
