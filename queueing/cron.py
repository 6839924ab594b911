"""Sweep cadences in words: the cron shapes procrastinate's periodic tasks take.

procrastinate reads a cron with croniter: five fields (minute, hour, day of month, month,
day of week) and an optional sixth, the second. :func:`describe_cron` says in a sentence
the shapes a sweep's cadence takes (every N seconds, minutes or hours, at a minute or
second, daily at a time); any other expression is returned as the cron itself, so a
cadence is never described wrongly.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"\d+")
_STEP = re.compile(r"\*/(\d+)")


def _every(count: int, unit: str) -> str:
    return f"every {unit}" if count == 1 else f"every {count} {unit}s"


def _step(field: str, period: int) -> int | None:
    """The step of ``*`` (1) or ``*/N``, when it divides ``period`` (so the runs are evenly
    spaced: ``*/7`` seconds is 0, 7 … 56, then 0 again); else None."""
    if field == "*":
        return 1
    match = _STEP.fullmatch(field)
    if match and 0 < int(match[1]) <= period and period % int(match[1]) == 0:
        return int(match[1])
    return None


def _value(field: str, limit: int) -> int | None:
    return int(field) if _NUMBER.fullmatch(field) and int(field) < limit else None


def _describe(fields: list[str]) -> str | None:
    minute, hour, day, month, weekday, *rest = fields
    if (day, month, weekday) != ("*", "*", "*") or len(rest) > 1:
        return None
    second = rest[0] if rest else "0"
    every_second, at_second = _step(second, 60), _value(second, 60)
    every_minute, at_minute = _step(minute, 60), _value(minute, 60)
    every_hour, at_hour = _step(hour, 24), _value(hour, 24)
    if every_second is not None and (minute, hour) == ("*", "*"):
        return _every(every_second, "second")
    if at_second is None:
        return None
    tail = f" at second {at_second}" if at_second else ""
    if every_minute is not None and hour == "*":
        return _every(every_minute, "minute") + tail
    if at_minute is not None and every_hour is not None:
        seconds = f", second {at_second}" if at_second else ""
        return f"{_every(every_hour, 'hour')} at minute {at_minute}{seconds}"
    if at_minute is not None and at_hour is not None:
        seconds = f":{at_second:02d}" if at_second else ""
        return f"every day at {at_hour:02d}:{at_minute:02d}{seconds}"
    return None


def describe_cron(expression: str) -> str:
    """``"*/10 * * * *"`` → ``"every 10 minutes"``, ``"* * * * * 30"`` → ``"every minute at
    second 30"``, ``"17 * * * *"`` → ``"every hour at minute 17"``; a shape it does not
    know → ``"cron: <expression>"``. Pure; no locking."""
    fields = expression.split()
    described = _describe(fields) if len(fields) in (5, 6) else None
    return described or f"cron: {expression}"
