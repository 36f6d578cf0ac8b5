"""orch: rent GPUs, train on them, bring the weights home, never leave a machine billing."""

__version__ = "0.1.0"
