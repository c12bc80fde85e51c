"""Times a user or a supervisor gives towerq: stored in UTC, so only those UTC can hold with
room to spare for the windows computed from them (a week before `until`, a reservation's
end): years 1900 to 9998. Past that, a time once overflowed Python's calendar on its way into
the database or a window (a 500); now it is refused, naming the field. And a time limit in
words, as the service and a runner both say it (`limit_text`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator

EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 12, 31, tzinfo=UTC)
RANGE = "a time between 1900 and 9998"


def in_utc(value: datetime) -> datetime:
    """`value` in UTC (a naive one taken as UTC, as the database takes it); ValueError
    outside `EARLIEST`..`LATEST`."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(RANGE) from None
    if not EARLIEST <= value <= LATEST:
        raise ValueError(RANGE)
    return value


Moment = Annotated[datetime, AfterValidator(in_utc)]
"""A time in a request body, in UTC: 422 naming the field outside `EARLIEST`..`LATEST`."""


def limit_text(seconds: int | None) -> str:
    """A time limit to the second, as a job's history and log say it: `1h30m`, `45m`,
    `1m30s`; `none`."""
    if seconds is None:
        return "none"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{count}{unit}" for count, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if count)


def span_text(seconds: float) -> str:
    """How long something has lasted, as an idle job is told it: to the second under a
    minute (`40s`), then to the minute (`35m`, `2h5m`)."""
    return f"{max(0.0, seconds):.0f}s" if seconds < 60 else limit_text(60 * round(seconds / 60))
