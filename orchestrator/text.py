"""Text that came from somewhere orch does not trust (an instance's status.json, a provider's answer)
made safe to print: no terminal escapes, no control characters, bounded length. Rich markup in it is
escaped where it is printed through Rich (``cli.app.out``). And plain columns for big tables."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def clean(value, limit: int = 300) -> str | None:
    """``value`` as one printable line of at most ``limit`` characters; None stays None."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():  # the character loop only where there is something to take out
        text = "".join(c if c.isprintable() else " " for c in _ANSI.sub("", text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def why(e: BaseException) -> str:
    """An exception as the short reason recorded in an event or a note: its first line, bounded."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def columns(header: tuple[str, ...], rows: list[tuple[str, ...]], right: frozenset[int] = frozenset()) -> str:
    """Plain aligned columns for a table of any size (Rich's Table takes most of a second for a
    thousand rows); the columns numbered in ``right`` are right-aligned. Cells are printed as they
    are: whatever came from an instance or a provider is ``text.clean``-ed first."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "".join("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                   .rstrip() + "\n" for row in table)
