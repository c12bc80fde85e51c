"""A running job's pace: seconds per step from the train points its worker receives, for the
job's expected end (`Job.pace_s`, `expected_end_at`) and the scheduler's likely ends."""

from __future__ import annotations

import bisect
import math
from datetime import datetime


class Pace:
    """Train points as received, (step, when), thinned to at most `KEPT` (every other one
    dropped when full, the newest always kept), and the pace over the later half of them.

    A job that pauses every `cycle` steps (to evaluate, to checkpoint) has a pace in saw
    teeth: a window that holds one pause more or less than its share says too slow or too
    fast. Where the cycle is known, the window starts at the point nearest halfway that
    leaves it whole cycles long (1-45 % off before, on a job that spent two thirds of its
    time evaluating: tests/test_eta.py)."""

    KEPT = 256

    def __init__(self, cycle: int | None = None) -> None:
        self.points: list[tuple[int, datetime]] = []
        self.cycle = cycle
        """Steps between the job's repeated pauses (None: unknown, or none)."""

    def note(self, step: int, when: datetime) -> None:
        if self.points and step <= self.points[-1][0]:
            return
        if len(self.points) >= self.KEPT:
            self.points = self.points[:-1:2] + [self.points[-1]]
        self.points.append((step, when))

    def pace(self) -> float | None:
        """Seconds per step from the point halfway through the steps to the newest."""
        if len(self.points) < 2:
            return None
        (first, _), (last, at) = self.points[0], self.points[-1]
        steps = [s for s, _ in self.points]
        start = min(bisect.bisect_left(steps, (first + last) / 2), len(self.points) - 2)
        if self.cycle is not None:
            whole = [i for i, s in enumerate(steps[:-1]) if last - s >= self.cycle and (last - s) % self.cycle == 0]
            if whole:
                start = min(whole, key=lambda i: abs(i - start))
        step, since = self.points[start]
        return (at - since).total_seconds() / (last - step)


def pause_cycle(*every: int | None) -> int | None:
    """Steps after which a trainer's pauses (evaluations every `eval_every` steps,
    checkpoints every `checkpoint_every`) come round again (`Pace.cycle`); None without any."""
    periods = [int(n) for n in every if isinstance(n, int) and n > 0]
    return math.lcm(*periods) if periods else None
