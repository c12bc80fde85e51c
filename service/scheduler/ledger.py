"""Each user's and each group's decayed GPU-seconds, kept up to date from allocation rows.

The ledger folds in allocations as they are released (read incrementally, pass by pass)
and adds the running ones' use so far at the time of asking. A fresh ledger reads back
ten half-lives of history, beyond which usage has decayed below a thousandth.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.models import Allocation, Job, JobState, User
from service.scheduler.history import RunTimes
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
        self.seen_ids: set[int] = set()

    def usage(self, session: Session, now: datetime) -> tuple[dict[str, float], dict[str | None, float]]:
        """Decayed GPU-seconds per user and per group at `now`, running allocations included."""
        self._fold_released(session, now)
        users, groups = dict(self.value), dict(self.group_value)
        rows = session.execute(
            select(User.name, Job.group, Allocation.fraction, Allocation.created_at)
            .join(Job, Allocation.job_id == Job.id)
            .join(User, Job.user_id == User.id)
            .where(Allocation.released_at.is_(None))
        )
        t = now.timestamp()
        for user, group, fraction, created_at in rows:
            used = interval_usage(fraction, created_at.timestamp(), t, t, self.half_life_s)
            users[user] = users.get(user, 0.0) + used
            groups[group] = groups.get(group, 0.0) + used
        return users, groups

    def _fold_released(self, session: Session, now: datetime) -> None:
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
        rows = session.execute(
            select(
                Allocation.id,
                Allocation.job_id,
                Allocation.attempt,
                User.name,
                Job.group,
                Allocation.fraction,
                Allocation.created_at,
                Allocation.released_at,
                Job.state,
            )
            .join(Job, Allocation.job_id == Job.id)
            .join(User, Job.user_id == User.id)
            .where(Allocation.released_at.is_not(None), Allocation.released_at > since)
            .order_by(Allocation.released_at)
        )
        newest = self.seen_until or since
        runs_seen: set[tuple[int, int]] = set()
        for alloc_id, job_id, attempt, user, group, fraction, created_at, released_at, state in rows:
            if released_at is None:  # excluded by the query; tells the type checker
                continue
            newest = max(newest, released_at)
            if alloc_id in self.seen_ids:
                continue
            self.seen_ids.add(alloc_id)
            used = interval_usage(fraction, created_at.timestamp(), released_at.timestamp(), t, self.half_life_s)
            self.value[user] += used
            self.group_value[group] += used
            if state == JobState.SUCCEEDED and (job_id, attempt) not in runs_seen:
                runs_seen.add((job_id, attempt))
                self.history.add(user, (released_at - created_at).total_seconds())
        self.seen_until = newest
        self._forget_old_ids(session)

    def _forget_old_ids(self, session: Session) -> None:
        if len(self.seen_ids) < 10_000 or self.seen_until is None:
            return
        keep_since = self.seen_until - LATE_COMMIT_MARGIN
        recent = session.scalars(select(Allocation.id).where(Allocation.released_at > keep_since))
        self.seen_ids = set(recent)
