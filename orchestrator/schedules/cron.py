"""When a schedule's runs are due (``orch schedule``): cron as users know it, in a time zone, with a
window and the rules for a pass that comes late. Pure: every function takes the time it decides
for, nothing here reads a clock, a file or the ledger (``scheduling`` does, above the jobs).

- **Cron**: the five fields of POSIX ``crontab`` (pubs.opengroup.org, "crontab - schedule periodic
  background work": minute hour day-of-month month day-of-week, ``*``, lists, ranges; when both
  day fields are restricted either one matches) with what crontab(5) of Vixie cron and cronie
  adds and users write: steps, month and day names, day-of-week 7 for Sunday as 0, and ``@hourly
  @daily @weekly @monthly`` (``@yearly @annually @midnight`` too; never ``@reboot``). The fields
  are checked one by one (a refusal names the field) and iterated by croniter
  (github.com/kiorky/croniter) over the zone's wall clock; which instant a wall-clock time is,
  ``zoneinfo`` says (docs.python.org/3/library/zoneinfo.html, the IANA database, PEP 495's fold).
- **The two day fields, as cron runs them** (``_iter``): which of them must match is
  decided by their first character, not by whether they restrict anything. cronie's ``load_entry``
  (github.com/cronie-crond/cronie, ``src/entry.c``) sets DOM_STAR / DOW_STAR for a day field whose
  text starts with ``*``, and its ``find_jobs`` (``src/cron.c``) fires on ``dom AND dow`` when
  either flag is set, ``dom OR dow`` otherwise; Vixie cron does the same. So ``0 0 */2 * 1`` runs
  on the odd days that are Mondays (AND: ``*/2`` starts with ``*``), while ``0 0 1-31/2 * 1``
  runs on every odd day and every Monday (OR). croniter alone takes either for both (it ORs
  whenever neither field is exactly ``*``): every extra firing would rent a machine, so orch
  iterates with croniter's ``implement_cron_bug``, which applies cronie's rule.
  ``0 0 30 2 1`` (both restricted: OR) runs every Monday of February, as under cronie.
- **Ranges go up**: ``5-1`` is refused, as Vixie cron and cronie before 1.6 refused it (``num1 >
  num2``; today's cronie sets no day for it, so it never matches) and croniter would wrap it round.
  The one descending range cron means is a day-of-week range ending on Sunday written 0
  (``fri-sun``, ``5-0``: cronie's ``get_range`` reads it as ``5-7``).
- **Daylight saving**: one rule, for every schedule, after cron(8) of Vixie cron ("Daylight Saving
  Time and other time changes": jobs in a skipped interval run right after the change; in a
  repeated one, care is taken not to run them twice). A wall-clock time that does not exist (the
  hour the clocks spring over) runs once, at the instant the clocks jump past it; a time that
  exists twice (the hour they fall back) runs once, the first time. An instant is one run at most,
  so every occurrence inside a skipped hour is one run. (Vixie cron keeps its rule for jobs at
  fixed hours and runs ``*``-hour jobs by the new clock; orch keeps one rule for all.)
- **Window** (``HH:MM-HH:MM`` in the schedule's zone, across midnight when the end comes first):
  an occurrence may start only inside the first window that closes after it. Until that window
  closes each pass may try again (an offer under the ceiling); then it is skipped.
- **A late pass** (the laptop slept, no reaper ran): an occurrence is late when the first pass
  after it comes more than ``grace`` later. ``--misfire skip`` records it skipped, ``run-once``
  runs it now, once. Occurrences that fell between two passes are folded into the newest one: a
  schedule never runs a backlog. An occurrence waiting for its turn (``--overlap queue``, a window
  retry) is never late. A window bounds every run: once it closed, nothing of it starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from typing import Iterator

from orchestrator.errors import UsageError

FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@weekly": "0 0 * * 0",
           "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *"}
_RANGES = ("0-59", "0-23", "1-31", "1-12 or jan-dec", "0-7 or sun-sat (0 and 7 are Sunday)")
_NAMES = {3: "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec", 4: "sun|mon|tue|wed|thu|fri|sat"}
OVERLAP = ("skip", "queue")
MISFIRE = ("skip", "run-once")
MIN_GRACE = timedelta(minutes=10)  # a pass this soon after an occurrence is on time (see ``grace``)
_WALK = 100_000  # cron steps without an occurrence before one is given up on (every minute: ~70 days)


def utc(dt: datetime) -> datetime:
    """SQLite hands datetimes back naive; every one orch stores is UTC."""
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


# -- checking what the user typed ------------------------------------------------------------------
def _item(k: int) -> re.Pattern:
    value = r"\d+" + (f"|{_NAMES[k]}" if k in _NAMES else "")
    return re.compile(rf"(\*|(?:{value})(?:-(?:{value}))?)(?:/\d+)?", re.I)


def parse(expr: str, flag: str = "--cron") -> str:
    """The expression as five fields (an alias spelled out); UsageError naming the field that is wrong."""
    from croniter import croniter

    text = " ".join(str(expr or "").split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise UsageError(f"{flag}: {text!r} is not a cron alias orch knows ({', '.join(ALIASES)})")
        return ALIASES[text.lower()]
    fields = text.split(" ") if text else []
    if len(fields) != 5:
        raise UsageError(f"{flag}: {text!r} has {len(fields)} field(s); cron has five: {' '.join(FIELDS)} "
                         "(e.g. '0 2 * * *', 02:00 every day)")
    for k, field in enumerate(fields):
        alone = " ".join(field if j == k else "*" for j in range(5))
        valid = all(_item(k).fullmatch(part) for part in field.split(","))
        for part in field.split(",") if valid else []:
            low, high = _bounds(k, part)
            if high is not None and low > high and not (k == 4 and high == 0):  # 5-0: Friday to Sunday
                raise UsageError(f"{flag}: the {FIELDS[k]} field {field!r} has a range that goes down ({part}): "
                                 "cron ranges go up; write it as two (e.g. 22-23,0-2)")
        if not valid or not croniter.is_valid(alone):
            raise UsageError(f"{flag}: the {FIELDS[k]} field {field!r} is not valid: {_RANGES[k]}, with lists (,), "
                             "ranges (-) and steps (/)")
    try:  # each field right, but never together (the 31st of February; 30 2 beside a *-day)
        _iter(text, datetime(2000, 1, 1)).get_next(datetime)
    except (ValueError, KeyError):
        dom, dow = fields[2], fields[4]
        star = " (a day field starting with * makes both day fields required, as cron reads them)" \
            if "*" not in (dom, dow) and (dom.startswith("*") or dow.startswith("*")) else ""
        raise UsageError(f"{flag}: {text!r} never happens: the day-of-month field {fields[2]!r} and the month "
                         f"field {fields[3]!r} never meet{star}") from None
    return text


def _bounds(k: int, part: str) -> tuple[int, int | None]:
    """A list item's range ends as numbers (names read as cron reads them); (low, None) for one value or ``*``."""
    first = part.split("/")[0]
    if first == "*" or "-" not in first:
        return 0, None
    names = _NAMES.get(k, "").split("|")
    ends = [names.index(e.lower()) + (1 if k == 3 else 0) if e.lower() in names else int(e) for e in first.split("-")]
    return ends[0], ends[1]


def _iter(expr: str, start: datetime):
    """croniter over ``expr`` with the day fields as cron reads them (``implement_cron_bug``: see the
    module's note on the two day fields): ``0 0 */2 * 1`` is the odd days that are Mondays. Where
    either day may match and the day-of-month side never meets the months (``0 0 30 2 1``), that
    side adds no day: the day-of-week side alone is iterated (croniter 3 gives up on the whole)."""
    from croniter import CroniterBadDateError, croniter

    minute, hour, dom, month, dow = expr.split(" ")
    if not (dom.startswith("*") or dow.startswith("*")):
        try:
            croniter(f"{minute} {hour} {dom} {month} *", datetime(2000, 1, 1)).get_next(datetime)
        except CroniterBadDateError:
            expr = f"{minute} {hour} * {month} {dow}"
    return croniter(expr, start, implement_cron_bug=True)


def zone(name: str, flag: str = "--tz"):
    """The IANA zone (Europe/Madrid); UsageError for a name zoneinfo does not know."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    text = str(name or "")
    if not re.fullmatch(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*", text) or len(text) > 64:
        raise UsageError(f"{flag}: {text!r} is not a time zone name (e.g. UTC, Europe/Madrid, America/New_York)")
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UsageError(f"{flag}: unknown time zone {text!r} (an IANA name: UTC, Europe/Madrid, "
                         "America/New_York)") from None


@dataclass(frozen=True)
class Window:
    start: time
    end: time

    def __str__(self) -> str:
        return f"{self.start:%H:%M}-{self.end:%H:%M}"


def parse_window(text: str, flag: str = "--window") -> Window:
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", str(text or ""))
    if not m or int(m[1]) > 23 or int(m[3]) > 23 or int(m[2]) > 59 or int(m[4]) > 59:
        raise UsageError(f"{flag} takes HH:MM-HH:MM in the schedule's zone (e.g. 00:00-06:00), not {text!r}")
    w = Window(time(int(m[1]), int(m[2])), time(int(m[3]), int(m[4])))
    if w.start == w.end:
        raise UsageError(f"{flag}: {text!r} opens and closes at once: give two different times")
    return w


def check_choice(value: str, allowed: tuple[str, ...], flag: str) -> str:
    if value not in allowed:
        raise UsageError(f"{flag} is one of {', '.join(allowed)}, not {value!r}")
    return value


# -- wall clock and instants -----------------------------------------------------------------------
def wall(t: datetime, tz) -> datetime:
    """The zone's wall-clock time at instant ``t``, naive."""
    return utc(t).astimezone(tz).replace(tzinfo=None)


def instant(w: datetime, tz) -> datetime:
    """The instant (UTC) a wall-clock time ``w`` stands for, by the daylight-saving rule above: the
    first of a repeated time; for a skipped time, the instant the clocks jump past it."""
    after = w.replace(tzinfo=tz, fold=0).astimezone(timezone.utc)  # a skipped time: read with the offset before
    if wall(after, tz) == w:
        return after  # it exists (fold=0 is its first time where it exists twice)
    lo = w.replace(tzinfo=tz, fold=1).astimezone(timezone.utc)  # the same time read with the offset after: earlier
    lo_s, hi_s = int(lo.timestamp()), int(after.timestamp())
    while hi_s - lo_s > 1:  # the first second whose wall clock is past w: the jump (offsets change on whole seconds)
        mid = (lo_s + hi_s) // 2
        if wall(datetime.fromtimestamp(mid, timezone.utc), tz) > w:
            hi_s = mid
        else:
            lo_s = mid
    return datetime.fromtimestamp(hi_s, timezone.utc)


def _shift(t: datetime, tz) -> timedelta:
    """How far the zone's offset moves within a day of ``t`` (0 away from a daylight-saving change)."""
    offsets = [utc(t + timedelta(days=d)).astimezone(tz).utcoffset() for d in (-1, 0, 1)]
    return max(offsets) - min(offsets)


@dataclass(frozen=True)
class Cron:
    """A checked expression in a zone: its occurrences, as UTC instants."""

    expr: str
    tz_name: str

    @classmethod
    def of(cls, expr: str, tz_name: str) -> "Cron":
        zone(tz_name)
        return cls(parse(expr), tz_name)

    @property
    def tz(self):
        return zone(self.tz_name)

    def occurrences(self, start: datetime) -> Iterator[datetime]:
        """Every occurrence at or after ``start``, in order, each instant once."""
        t, tz = utc(start), self.tz
        # Wall times map to instants in order (``instant``), so none before wall(t) less the
        # zone's shift can land at or after t.
        it = _iter(self.expr, wall(t, tz) - _shift(t, tz) - timedelta(minutes=1))
        last, idle = None, 0
        while idle < _WALK:  # steps without an occurrence (before ``start``, or one instant again)
            u = instant(it.get_next(datetime), tz)
            if u >= t and u != last:
                last, idle = u, 0
                yield u
            else:
                idle += 1
        raise UsageError(f"cron {self.expr!r}: no occurrence found within {_WALK} steps")

    def next_after(self, t: datetime) -> datetime:
        return next(u for u in self.occurrences(t) if u > utc(t))

    def latest(self, t: datetime) -> datetime:
        """The newest occurrence at or before ``t``."""
        t, tz = utc(t), self.tz
        it = _iter(self.expr, wall(t, tz) + _shift(t, tz) + timedelta(minutes=1))
        for _ in range(_WALK):
            u = instant(it.get_prev(datetime), tz)
            if u <= t:
                return u
        raise UsageError(f"cron {self.expr!r}: no occurrence found within {_WALK} steps")

    def count(self, start: datetime, end: datetime, cap: int = 1000) -> int:
        """Occurrences in [start, end), counted up to ``cap``."""
        n = 0
        for u in self.occurrences(start):
            if u >= utc(end) or n >= cap:
                break
            n += 1
        return n

    def local(self, t: datetime) -> datetime:
        return utc(t).astimezone(self.tz)

    def run_name(self, name: str, occurrence: datetime) -> str:
        """A run's job name: NAME-YYYYMMDD-HHMM, the occurrence's time in the schedule's zone."""
        return f"{name}-{self.local(occurrence):%Y%m%d-%H%M}"


def window_of(window: Window, tz, occurrence: datetime) -> tuple[datetime, datetime]:
    """(opens, closes): the first window that closes after ``occurrence``."""
    day = wall(occurrence, tz).date()
    for d in (day - timedelta(days=1), day, day + timedelta(days=1)):
        opens = instant(datetime.combine(d, window.start), tz)
        closes = instant(datetime.combine(d if window.end > window.start else d + timedelta(days=1), window.end), tz)
        if closes > utc(occurrence):
            return opens, closes
    raise AssertionError("a window closes within two days")  # pragma: no cover - the loop always returns


# -- what a pass does ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    cron: Cron
    window: Window | None = None
    misfire: str = "skip"
    grace: timedelta = MIN_GRACE


def grace(reaper_every_s: float | None) -> timedelta:
    """How late a pass may come and still be on time: ``MIN_GRACE``, or two intervals of the
    installed reaper where that is longer (a reaper every 30 minutes is never 'late' at 25)."""
    every = timedelta(seconds=2 * reaper_every_s) if reaper_every_s else timedelta(0)
    return max(MIN_GRACE, every)


@dataclass(frozen=True)
class Step:
    """What a pass does for one schedule: ``wait`` (nothing now), ``run`` (try to start
    ``occurrence``) or ``skip`` (record ``occurrence`` skipped, with ``reason``). ``due``: the
    schedule's next occurrence to look at once this one is settled (or, waiting, this one)."""

    action: str
    due: datetime
    occurrence: datetime | None = None
    reason: str = ""
    closes: datetime | None = None  # the window's end: a run that cannot start now may try again until then


def _span(d: timedelta) -> str:
    minutes = int(d.total_seconds() // 60)
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{mins} min" if mins or not minutes else ""]
    return " ".join(p for p in parts if p)


def step(rule: Rule, due: datetime, now: datetime, waiting: datetime | None = None) -> Step:
    """The decision for one schedule at ``now``: its oldest unsettled occurrence is ``due``;
    ``waiting`` is an occurrence an earlier pass left waiting (its turn, its window's offers)."""
    cron, now = rule.cron, utc(now)
    tz = cron.tz
    fmt = "%Y-%m-%d %H:%M %Z"
    if waiting is not None:
        waiting = utc(waiting)
        if rule.window is not None:
            opens, closes = window_of(rule.window, tz, waiting)
            if now >= closes:
                return Step("skip", cron.next_after(now), waiting,
                            f"its window {rule.window} closed at {cron.local(closes):{fmt}} before it could start")
            if now < opens:
                return Step("wait", waiting, waiting)
            return Step("run", cron.next_after(now), waiting, closes=closes)
        return Step("run", cron.next_after(now), waiting)
    due = utc(due)
    if now < due:
        return Step("wait", due)
    occ = cron.latest(now)
    missed = cron.count(due, occ)
    earlier = f"; {missed}{'+' if missed >= 1000 else ''} earlier occurrence(s) since " \
              f"{cron.local(due):{fmt}} missed too" if missed else ""
    if rule.window is not None:
        opens, closes = window_of(rule.window, tz, occ)
        if now >= closes:
            return Step("skip", cron.next_after(now), occ,
                        f"its window {rule.window} closed at {cron.local(closes):{fmt}} before a pass could start it"
                        + earlier)
        if now < opens:
            return Step("wait", occ, occ)
        return Step("run", cron.next_after(now), occ, closes=closes)
    late = now - occ
    if late > rule.grace:
        said = (f"the first pass after {cron.local(occ):{fmt}} came {_span(late)} later (no reaper ran: "
                "asleep, off?)")
        if rule.misfire == "skip":
            return Step("skip", cron.next_after(now), occ, f"missed: {said}; --misfire skip{earlier}")
        return Step("run", cron.next_after(now), occ, f"late: {said}; --misfire run-once runs it once{earlier}")
    return Step("run", cron.next_after(now), occ)
