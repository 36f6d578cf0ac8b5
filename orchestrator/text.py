"""Text that came from somewhere orch does not trust (an instance's status.json, a provider's answer)
made safe to print: no terminal escapes, no control characters, bounded length. Rich markup in it is
escaped where it is printed through Rich (``cli.app.out``). A secret a command printed hidden
(``redact``). A JSON column of a ledger row read as the input it is (``row_json``). And plain
columns for big tables."""

from __future__ import annotations

import re
from functools import lru_cache

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
        if len(value) < _MIN_FRAGMENT:
            # A value of 1-3 characters ("0", "on") is in every log as part of other words and numbers:
            # hidden where it stands alone, not inside a longer run of letters and digits, and its
            # encoded forms (hex "30", base64 "MA==") not looked for; each would match almost anything.
            alternatives.append(rf"(?<![^\W_]){re.escape(value)}(?![^\W_])")
            continue
        alternatives.append(re.escape(value))
        if len(value) >= _MIN_FRAGMENT:  # `rev`: a short value reversed matches much else
            alternatives.append(re.escape(value[::-1]))
        alternatives += [re.escape(f) for f in _base64_forms(value.encode())]
        # hex (xxd -p, od, a client dumping its request), either case: whole bytes, so the same digits
        # wherever the value sits in a longer dump
        alternatives.append(f"(?i:{value.encode().hex()})")
        for encoded in {quote(value), quote(value, safe=""), quote_plus(value), quote_plus(value, safe="")} - {value}:
            # %2F or %2f: the hex digits of a percent escape in either case
            alternatives.append("".join(f"%(?i:{part[:2]})" + re.escape(part[2:]) if i else re.escape(part)
                                        for i, part in enumerate(encoded.split("%"))))
    if not alternatives:
        return None
    return re.compile("|".join(sorted(set(alternatives), key=len, reverse=True)))


# What a terminal shows as nothing: escape sequences (colours, cursor moves, titles) and the other
# control characters but the line breaks and tabs. A value with these between its characters
# (`printf '%s\e[0m%s'`, a coloured logger) still shows in clear on a terminal and to a reader.
_INVISIBLE = re.compile(_ANSI.pattern + r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def redact(text, secrets) -> str | None:
    """``text`` with every secret value in ``secrets`` replaced by ``***``, as printed, reversed,
    base64-encoded (any alignment, either alphabet), hex (either case) or URL-encoded, also with
    terminal escapes or control characters between its characters (what a terminal shows as the
    value): what a command's log, a ``set -x`` or a client printing its token shows. The one place
    this is done: whatever stores, shows or posts text from an instance that got secrets passes it
    through here first. None stays None."""
    if text is None or not secrets:
        return text
    pattern = _pattern(tuple(sorted(secrets)))
    if pattern is None:
        return text
    text = pattern.sub(MASK, text)
    return _hidden_through_escapes(text, pattern) if _INVISIBLE.search(text) else text


def _hidden_through_escapes(text: str, pattern: re.Pattern) -> str:
    """The values ``pattern`` finds once the invisible characters are taken out of ``text``, hidden
    in ``text`` itself: each from its first visible character to its last, escapes between included."""
    import bisect

    starts, kept, pieces, at = [], [], [], 0  # the visible runs: where each starts in text, in the stripped text
    length = 0
    for m in _INVISIBLE.finditer(text):
        if m.start() > at:
            starts.append(length)
            kept.append(at)
            pieces.append(text[at:m.start()])
            length += m.start() - at
        at = m.end()
    if at < len(text):
        starts.append(length)
        kept.append(at)
        pieces.append(text[at:])
    visible = "".join(pieces)

    def where(i):  # the position in text of the stripped text's character i
        run = bisect.bisect_right(starts, i) - 1
        return kept[run] + i - starts[run]

    out, at = [], 0
    for m in pattern.finditer(visible):
        start, end = where(m.start()), where(m.end() - 1) + 1
        out += [text[at:start], MASK]
        at = end
    return "".join(out) + text[at:]


class Redactor:
    """``redact`` over bytes as they arrive (a log being pulled), so the value never lands on disk
    in clear: each line is hidden once it is whole. A line longer than ``LINE`` with no break is
    hidden in blocks, each cut where no value as printed straddles it."""

    LINE = 1 << 20
    OVERLAP = 64 << 10  # longer than any value's form: what a block keeps back for the next

    def __init__(self, secrets):
        self.secrets, self.carry, self.size = [s for s in secrets if s], b"", 0

    def feed(self, chunk: bytes) -> bytes:
        data = self.carry + chunk
        cut = data.rfind(b"\n") + 1
        if not cut and len(data) > self.LINE:
            cut = data.rfind(b"\r") + 1 or self._cut(data)
        self.carry = data[cut:]
        return self._hide(data[:cut])

    def end(self) -> bytes:
        out, self.carry = self._hide(self.carry), b""
        return out

    def _cut(self, data: bytes) -> int:
        cut = len(data) - self.OVERLAP
        pattern = _pattern(tuple(sorted(self.secrets)))
        text = data.decode("latin-1")  # one character a byte: positions are the bytes'
        for m in pattern.finditer(text, max(0, cut - self.OVERLAP)) if pattern is not None else ():
            if m.start() < cut < m.end():
                return m.start()
        return cut

    def _hide(self, data: bytes) -> bytes:
        if not data:
            return data
        text = data.decode("utf-8", "surrogateescape")
        out = redact(text, self.secrets).encode("utf-8", "surrogateescape")
        self.size += len(out)
        return out


def why(e: BaseException) -> str:
    """An exception as the short reason recorded in an event or a note: its first line, bounded."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def nearest(word: str, known) -> str:
    """" (did you mean 'x'?)" for the known name closest to a mistyped ``word`` (difflib), else "":
    what a refusal of an unknown key or setting adds so that a typo is mended at once."""
    import difflib

    near = difflib.get_close_matches(str(word), sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def columns(header: tuple[str, ...], rows: list[tuple[str, ...]], right: frozenset[int] = frozenset()) -> str:
    """Plain aligned columns for a table of any size (Rich's Table takes most of a second for a
    thousand rows); the columns numbered in ``right`` are right-aligned. Cells are printed as they
    are: whatever came from an instance or a provider is ``text.clean``-ed first."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "".join("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                   .rstrip() + "\n" for row in table)


def row_json(raw: str | None, default):
    """A JSON column of a ledger row (``runs.args``, an instance's memory, a job's phases...) as the
    input it is: a shared ledger is written by others too, so what is not JSON, is nested past
    Python's stack, or is not of ``default``'s type (an object where a dict is meant) reads as
    ``default``. The one reader of such columns, so a list where an object was meant is never an
    AttributeError in whatever reads it."""
    import json

    try:
        value = json.loads(raw) if raw else default
    except (ValueError, TypeError, RecursionError):
        return default
    return value if isinstance(value, type(default)) else default
