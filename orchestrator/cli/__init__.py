"""The ``orch`` command: ``app`` holds the Typer app and the output helpers, one module per group of
commands registers on it, and ``main`` is the entry point, the only module that imports them all.

Layer 14 (ARCHITECTURE.md), the top: it may import anything below; nothing imports it."""
