"""The pass where the executor's cluster places jobs itself (`Executor.places_jobs` is
False: Slurm). towerq's policy does not run: the cluster's own scheduler (Slurm's
priorities, fair share and backfill) decides where and when.

Each pass:
- observes every attempt the cluster holds: a waiting one gets the cluster's reason and
  expected start on its row; one the cluster ended without the attempt recording its end
  (an admin's `scancel`, a time limit, a failed node) ends, or queues again, with the
  cluster's reason; one the cluster lost is asked for again, then counted as a crash;
- hands the queued jobs to the cluster, in order of priority then age, while fewer than
  `TOWERQ_SLURM_MAX_PENDING` handed over wait there, not counting those on hold (those a
  sweep's `max_parallel` or their `after` hold back stay in towerq's queue, as do the rest,
  saying why).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Row, func, select, update
from sqlalchemy.orm import Session

from service.core.attempts import mint_attempt_token
from service.core.context import Context
from service.core.exceptions import StaleAttemptError
from service.core.lifecycle import cancel_queued, current_attempt, finish, hand_over, requeue
from service.core.models import HOLDING_STATES, Job, JobState
from service.executors import Attempt, Ended, Executor, ExecutorError
from service.scheduler.holdbacks import held_back
from service.scheduler.snapshot import Stored, read_queued

log = logging.getLogger(__name__)

LOST_AFTER_S = 15.0
"""How long the cluster may not know an attempt before it is asked for again (a submission
that failed on the way, a controller that lost its state)."""
SAID = ("pending_reason", "expected_start_at", "expected_host")
"""What the cluster says of an attempt it holds, on the job's row."""
RESUBMITS = 2
"""Times a lost attempt is asked for again before it counts as a crash."""


@dataclass
class Observed:
    job_id: int
    attempt: int
    ended: Ended


class HandOver:
    """The hand-over passes of one scheduler process (it remembers lost attempts)."""

    def __init__(self, ctx: Context, executor: Executor) -> None:
        self.ctx = ctx
        self.executor = executor
        self.max_waiting = ctx.settings.slurm_max_pending
        """Attempts handed over and not started yet, at most (the rest wait in towerq's queue)."""
        self.lost_since: dict[tuple[int, int], float] = {}
        self.resubmitted: dict[tuple[int, int], int] = {}

    def run(self) -> tuple[list[Attempt], dict[int, str], dict[int, Stored]]:
        """One pass: the jobs handed over, and those their sweep holds (with their rows' stored reasons)."""
        self.observe()
        with self.ctx.db.read() as session:
            queued, stored = read_queued(session)
            held, never, _ = held_back(session, [q.id for q in queued])
            handed = (Job.state == JobState.DISPATCHED) & Job.on_hold_by.is_(None)  # a held one takes no place
            waiting = session.scalar(select(func.count()).select_from(Job).where(handed))
        cancel_never(self.ctx, never)
        ready = sorted(
            (q for q in queued if q.id not in held and q.id not in never),
            key=lambda q: (q.priority, q.submitted, q.id),  # priority: 0 high (`PRIORITY_RANK`)
        )
        room = max(0, self.max_waiting - (waiting or 0))
        if len(ready) > room:
            reason = (
                f"waiting to be handed to {self.executor.name}: {waiting} of towerq's jobs wait there already "
                f"(at most {self.max_waiting} at once, TOWERQ_SLURM_MAX_PENDING)"
            )
            held.update({q.id: reason for q in ready[room:]})
        return self.hand_over([q.id for q in ready[:room]]), held, stored

    # -- handing over ---------------------------------------------------------------------

    def hand_over(self, job_ids: list[int]) -> list[Attempt]:
        attempts = []
        if job_ids:
            with self.ctx.db.write() as session:
                jobs = session.scalars(
                    select(Job)
                    .where(Job.id.in_(job_ids), Job.state == JobState.QUEUED)
                    .order_by(Job.id)
                    .with_for_update()
                ).all()
                for job in jobs:
                    hand_over(session, job, self.executor.name)
                    attempts.append(attempt_of(job))
        for attempt in attempts:
            self.submit(attempt)
        return attempts

    def submit(self, attempt: Attempt) -> None:
        try:
            with self.ctx.db.write() as session:  # each submission its own: an earlier one's dies
                token = mint_attempt_token(session, attempt.job_id, attempt.attempt)
        except StaleAttemptError:
            return  # towerq moved on from the attempt meanwhile
        try:
            self.executor.submit(replace(attempt, token=token))
        except ExecutorError as err:
            if not err.lasting:
                log.warning("job %s attempt %s: %s (asked again later)", attempt.job_id, attempt.attempt, err)
                return
            try:
                with self.ctx.db.write() as session:
                    finish(
                        session,
                        attempt.job_id,
                        attempt.attempt,
                        JobState.FAILED,
                        error=f"{self.executor.name.capitalize()} refused it: {err}",
                    )
            except StaleAttemptError:
                pass

    # -- observing ------------------------------------------------------------------------

    def observe(self) -> None:
        with self.ctx.db.read() as session:
            rows = session.execute(
                select(
                    Job.id,
                    Job.attempts,
                    Job.state,
                    Job.requested_host,
                    Job.gpu_count,
                    Job.time_limit_s,
                    Job.pending_reason,
                    Job.expected_start_at,
                    Job.expected_host,
                    Job.on_hold_by,
                ).where(Job.state.in_(HOLDING_STATES))
            ).all()
        said: list[dict[str, object]] = []
        ended: list[Observed] = []
        resubmit: list[Attempt] = []
        now = time.monotonic()
        holding = set()
        for row in rows:
            attempt = attempt_of(row)
            key = (row.id, row.attempts)
            holding.add(key)
            try:
                seen = self.executor.observe(attempt)
            except ExecutorError as err:
                log.warning("could not ask %s about its jobs: %s", self.executor.name, err)
                return  # nothing is concluded from silence
            if seen.held:
                self.lost_since.pop(key, None)
                stored = (row.pending_reason, row.expected_start_at, row.expected_host)
                now_said = (seen.reason, seen.expected_start, seen.expected_host)
                if row.state == JobState.DISPATCHED and row.on_hold_by is None and stored != now_said:  # held: ours
                    said.append({"id": row.id, **dict(zip(SAID, now_said, strict=True))})
            elif seen.ended is not None:
                ended.append(Observed(row.id, row.attempts, seen.ended))
            elif now - self.lost_since.setdefault(key, now) >= LOST_AFTER_S:
                self.lost_since[key] = now
                if row.state == JobState.DISPATCHED and self.resubmitted.get(key, 0) < RESUBMITS:
                    self.resubmitted[key] = self.resubmitted.get(key, 0) + 1
                    resubmit.append(attempt)
                else:
                    why = f"{self.executor.name} lost its attempt {row.attempts} (no trace of it there)"
                    ended.append(Observed(row.id, row.attempts, Ended("requeue", why)))
        for gone in set(self.lost_since) - holding:
            self.lost_since.pop(gone, None)
            self.resubmitted.pop(gone, None)
        self._write(said, ended)
        for attempt in resubmit:
            log.warning(
                "job %s attempt %s: lost by %s, asked for again", attempt.job_id, attempt.attempt, self.executor.name
            )
            self.submit(attempt)

    def _write(self, said: list[dict[str, object]], ended: list[Observed]) -> None:
        if not said and not ended:
            return
        with self.ctx.db.write() as session:
            if said:
                write_said(session, said)
            for observed in ended:
                try:
                    job = current_attempt(session, observed.job_id, observed.attempt)
                except StaleAttemptError:
                    continue  # the attempt recorded its own end meanwhile
                record_end(session, job, observed.ended)


def record_end(session: Session, job: Job, ended: Ended) -> None:
    """The end of an attempt as the cluster says it happened."""
    log.warning("job %s attempt %s: %s", job.id, job.attempts, ended.message)
    if ended.outcome == "cancelled" or job.cancel_requested_at is not None:
        finish(session, job.id, job.attempts, JobState.CANCELLED, error=job.stop_reason or ended.message)
    elif ended.outcome == "failed":
        finish(session, job.id, job.attempts, JobState.FAILED, error=ended.message)
    else:
        requeue(session, job, ended.message, crashed=ended.outcome == "requeue")


def attempt_of(job: Job | Row[*tuple[Any, ...]]) -> Attempt:
    """The current attempt of a job (its row, or the columns `observe` reads) as the executor takes it."""
    return Attempt(job.id, job.attempts, job.requested_host or "", job.gpu_count, job.time_limit_s)


def cancel_never(ctx: Context, never: dict[int, str]) -> None:
    """Cancel the queued jobs that can never start (a job they need to succeed did not),
    saying why; every pass does, whoever places the jobs."""
    if not never:
        return
    with ctx.db.write() as session:
        waiting = select(Job).where(Job.id.in_(never), Job.state == JobState.QUEUED)
        for job in session.scalars(waiting.with_for_update()):
            cancel_queued(session, job, never[job.id])


def write_said(session: Session, said: list[dict[str, object]]) -> None:
    """What the cluster says of the attempts it holds waiting (`SAID`, by job id), onto the
    rows of those still dispatched and not on hold: one put on hold after the pass read it
    (the cluster then says "held") keeps towerq's reason, who holds it and how to release it."""
    statement = update(Job).where(Job.state == JobState.DISPATCHED, Job.on_hold_by.is_(None))
    session.execute(statement, said, execution_options={"synchronize_session": None})
