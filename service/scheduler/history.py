"""Users' recent run times: what the scheduler may expect of their next job.

An estimate is the 90th percentile of the user's last `window` completed run times, once
there are at least `minimum` of them. It is a guess, never a promise: the policy uses it
only to lend GPUs held for a waiting job to jobs that will very likely be done before
that job could start anyway.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable

from service.scheduler.types import QueuedJob, RunningJob

WINDOW = 50
MINIMUM = 5
QUANTILE = 0.9


class RunTimes:
    def __init__(self, window: int = WINDOW, minimum: int = MINIMUM) -> None:
        self.minimum = minimum
        self.recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self.cached: dict[str, tuple[float | None, float | None]] = {}
        """User -> (90th percentile, median) of their recent runs, recomputed only by `add`."""

    def add(self, user: str, seconds: float) -> bool:
        """Record a completed run; True when the user's estimate or median changed (the
        simulator then refreshes their queued jobs, as the live service does every pass)."""
        before = self.cached.get(user, (None, None))
        self.recent[user].append(seconds)
        self.cached[user] = self._compute(user)
        return self.cached[user] != before

    def estimate(self, user: str) -> float | None:
        """A run time the user's next job will very likely not exceed (90th percentile)."""
        return self.cached.get(user, (None, None))[0]

    def typical(self, user: str) -> float | None:
        """The user's median run time."""
        return self.cached.get(user, (None, None))[1]

    def _compute(self, user: str) -> tuple[float | None, float | None]:
        runs = sorted(self.recent[user])
        if len(runs) < self.minimum:
            return None, None
        return runs[min(len(runs) - 1, int(QUANTILE * len(runs)))], runs[len(runs) // 2]

    def annotate(self, queued: Iterable[QueuedJob], running: Iterable[RunningJob]) -> None:
        """Give jobs their owners' estimates."""
        for job in queued:
            job.estimate_s, job.typical_s = self.estimate(job.user), self.typical(job.user)
        for run in running:
            run.estimate_s, run.typical_s = self.estimate(run.user), self.typical(run.user)
