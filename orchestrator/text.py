"""Text that came from somewhere orch does not trust (an instance's status.json, a provider's answer)
made safe to print: no terminal escapes, no control characters, bounded length. Rich markup in it is
escaped where it is printed through Rich (``cli.app.out``). A secret a command printed hidden
(``redact``). And plain columns for big tables."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

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


MASK = "***"
_MIN_FRAGMENT = 4  # a base64 fragment shorter than this says little of a secret and matches much else


def _base64_forms(raw: bytes) -> set[str]:
    """The secret as base64 shows it inside a longer encoded string: it may start at any of the three
    byte offsets of a 3-byte group, so each alignment gives its own run of characters (the ones
    made of the secret's bits alone; the edges mix in a neighbour's). The whole value encoded on
    its own (``echo -n $T | base64``) too, padding included. Standard and URL-safe alphabets."""
    import base64

    forms = {base64.b64encode(raw).decode()}
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw).decode()
        start, end = -(-8 * k // 6), 8 * (k + len(raw)) // 6
        forms.add(encoded[start:end])
    forms |= {f.replace("+", "-").replace("/", "_") for f in forms}
    return {f for f in forms if len(f) >= _MIN_FRAGMENT}


@lru_cache(maxsize=64)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern | None:
    from urllib.parse import quote, quote_plus

    alternatives = []
    for value in {s for s in secrets if s}:
        alternatives.append(re.escape(value))
        alternatives += [re.escape(f) for f in _base64_forms(value.encode())]
        for encoded in {quote(value), quote(value, safe=""), quote_plus(value), quote_plus(value, safe="")} - {value}:
            # %2F or %2f: the hex digits of a percent escape in either case
            alternatives.append("".join(f"%(?i:{part[:2]})" + re.escape(part[2:]) if i else re.escape(part)
                                        for i, part in enumerate(encoded.split("%"))))
    if not alternatives:
        return None
    return re.compile("|".join(sorted(set(alternatives), key=len, reverse=True)))


def redact(text, secrets) -> str | None:
    """``text`` with every secret value in ``secrets`` replaced by ``***``, as printed, base64-encoded
    (any alignment, either alphabet) or URL-encoded: what a command's log, a ``set -x`` or a client
    printing its token shows. The one place this is done: whatever stores, shows or posts text from
    an instance that got secrets passes it through here first. None stays None."""
    if text is None or not secrets:
        return text
    pattern = _pattern(tuple(sorted(secrets)))
    return text if pattern is None else pattern.sub(MASK, text)


def redact_file(path: Path, secrets) -> bool:
    """A file at home (a pulled log) rewritten with ``redact``, through a new file renamed into place
    (its bytes kept as they are elsewhere); True when something was hidden."""
    import os

    path = Path(path)
    data = path.read_bytes().decode("utf-8", "surrogateescape")
    hidden = redact(data, secrets)
    if hidden == data:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.redact")
    tmp.write_bytes(hidden.encode("utf-8", "surrogateescape"))
    os.replace(tmp, path)
    return True


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
