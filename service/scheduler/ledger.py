"""Each user's and each group's decayed GPU-seconds, kept up to date from what jobs held
(`service.scheduler.holdings`: allocation rows, and the attempts a Slurm cluster placed).

The ledger folds in holdings as they end (read incrementally, pass by pass) and adds the
running ones' use so far at the time of asking. A fresh ledger reads back
ten half-lives of history, beyond which usage has decayed below a thousandth.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.scheduler.history import RunTimes
from service.scheduler.holdings import Holding, holdings
from service.scheduler.usage import decayed, interval_usage

HISTORY_HALF_LIVES = 10
LATE_COMMIT_MARGIN = timedelta(minutes=5)
"""Releases are re-read this far back, for rows committed after a later release was seen."""


class UsageLedger:
    """Decayed usage per user and per group (a job's group, none for a job without one),
    and (from the same rows) users' recent run times."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.history = RunTimes()
        self.value: dict[str, float] = defaultdict(float)
        self.group_value: dict[str | None, float] = defaultdict(float)
        self.as_of: float | None = None
        self.seen_until: datetime | None = None
        self.seen: dict[tuple[str, int], datetime] = {}
        """The holdings folded in, with their ends."""

    def usage(self, session: Session, now: datetime) -> tuple[dict[str, float], dict[str | None, float]]:
        """Decayed GPU-seconds per user and per group at `now`, running holdings included."""
        t = now.timestamp()
        if self.as_of is not None:
            for user in self.value:
                self.value[user] = decayed(self.value[user], self.as_of, t, self.half_life_s)
            for group in self.group_value:
                self.group_value[group] = decayed(self.group_value[group], self.as_of, t, self.half_life_s)
        self.as_of = t
        since = (
            now - timedelta(seconds=self.half_life_s * HISTORY_HALF_LIVES)
            if self.seen_until is None
            else self.seen_until - LATE_COMMIT_MARGIN
        )
        running: list[Holding] = []
        newest = self.seen_until or since
        runs_seen: set[tuple[int, int]] = set()
        for held in sorted(holdings(session, since, now + LATE_COMMIT_MARGIN), key=lambda h: h.end or now):
            if held.end is None:
                running.append(held)
                continue
            newest = max(newest, held.end)
            if held.key in self.seen:
                continue
            self.seen[held.key] = held.end
            used = interval_usage(held.gpus, held.start.timestamp(), held.end.timestamp(), t, self.half_life_s)
            self.value[held.user] += used
            self.group_value[held.group] += used
            if held.succeeded and (held.job_id, held.attempt) not in runs_seen:
                runs_seen.add((held.job_id, held.attempt))
                self.history.add(held.user, (held.end - held.start).total_seconds())
        self.seen_until = newest
        self._forget_old_keys()
        users, groups = dict(self.value), dict(self.group_value)
        for held in running:
            used = interval_usage(held.gpus, held.start.timestamp(), t, t, self.half_life_s)
            users[held.user] = users.get(held.user, 0.0) + used
            groups[held.group] = groups.get(held.group, 0.0) + used
        return users, groups

    def _forget_old_keys(self) -> None:
        """Holdings that ended before the re-read margin are never read again."""
        if len(self.seen) < 10_000 or self.seen_until is None:
            return
        keep_since = self.seen_until - LATE_COMMIT_MARGIN
        self.seen = {key: end for key, end in self.seen.items() if end > keep_since}
