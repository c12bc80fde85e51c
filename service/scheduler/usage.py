"""Decayed GPU-seconds: the usage history fair share compares users by.

Usage decays with a half-life, so what someone used last month counts less than what they
used this morning. A value `v` measured at time `t0` is worth `v * 2**(-(t - t0)/h)` at
time `t`; holding `g` GPUs from `a` to `b` is worth the integral of that over `[a, b]`.
The live scheduler and the trace simulator both use these two functions.
"""

from __future__ import annotations

import math
from datetime import datetime

LN2 = math.log(2.0)


def decayed(value: float, as_of: float, now: float, half_life_s: float) -> float:
    """`value`, measured at `as_of`, decayed to `now`."""
    if value == 0.0 or now <= as_of:
        return value
    return value * 2.0 ** (-(now - as_of) / half_life_s)


def interval_usage(gpus: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """Decayed GPU-seconds at `now` of holding `gpus` GPUs from `start` to `end` (<= now)."""
    if end <= start:
        return 0.0
    scale = half_life_s / LN2
    return gpus * scale * (2.0 ** (-(now - end) / half_life_s) - 2.0 ** (-(now - start) / half_life_s))


def gpu_hours_within(gpus: float, start: datetime, end: datetime, since: datetime, until: datetime) -> float:
    """GPU hours (not decayed) of holding `gpus` GPUs from `start` to `end`, the part inside
    [since, until]: what usage reports and GPU-hour quotas count."""
    seconds = (min(end, until) - max(start, since)).total_seconds()
    return gpus * max(0.0, seconds) / 3600
