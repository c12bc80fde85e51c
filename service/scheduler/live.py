"""The live scheduling pass: repair, decide, allocate, dispatch.

One pass at a time across all processes (a Redis lock). The pass reads its snapshot and
runs the policy outside any write transaction, then writes the allocations and the
`dispatched` states in one short transaction that checks again, for every placement, that
the job is still queued and its GPUs still have room (on PostgreSQL also under an
advisory lock, on SQLite under the one-writer lock), so that even a lost Redis lock or a
change since the snapshot cannot over-commit a GPU. The launch messages go to the hosts'
RQ queues only after that commits.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from service.core import defaults, keys
from service.core.context import Context
from service.core.lifecycle import dispatch, request_preemption
from service.core.models import Job, JobState, utcnow
from service.executors import Attempt, executor_for
from service.scheduler.dryrun import expected_start, policy_config
from service.scheduler.explain import describe, describe_reserved
from service.scheduler.forecast import Forecast, Replay, in_queue_order
from service.scheduler.handover import HandOver, cancel_never
from service.scheduler.holdbacks import held_back
from service.scheduler.ledger import UsageLedger
from service.scheduler.policy import schedule
from service.scheduler.reconcile import Repairs, mark_dead_hosts, needs_repair, resend_lost_launches
from service.scheduler.resize import read_targets, request_resizes
from service.scheduler.settle import settle_resizes
from service.scheduler.snapshot import (
    PENDING_COLUMNS,
    Stored,
    arriving,
    free_room,
    read_cluster,
    read_fair_share,
    read_queued,
)
from service.scheduler.types import Cluster, Decision, FairShare, Policy, QueuedJob
from towerq.contract.messages import PreemptMessage

log = logging.getLogger(__name__)

Inputs = tuple[list[QueuedJob], Cluster, FairShare, list[tuple[float, QueuedJob]]]
"""What a pass's replay starts from: its queue, cluster and fair share, and the jobs that
join the queue at their begin (`snapshot.arriving`)."""

PG_PASS_LOCK = 0x746F77657271  # "towerq"


@dataclass
class PassReport:
    placed: list[tuple[int, int, str, tuple[int, ...]]] = field(default_factory=list)
    """(job id, attempt, host, GPU indices) started in this pass."""
    waiting: int = 0
    preempted: list[int] = field(default_factory=list)
    resized: list[int] = field(default_factory=list)
    """Elastic jobs asked to stop to restart on more or fewer GPUs."""
    repairs: Repairs = field(default_factory=Repairs)
    seconds: float = 0.0


class LiveScheduler:
    """Runs scheduling passes against the database for the whole lab."""

    def __init__(self, ctx: Context, policy: Policy = Policy.TOWERQ) -> None:
        self.ctx = ctx
        self.config = policy_config(ctx.settings)
        self.config.policy = policy
        self.ledger = UsageLedger(ctx.settings.fair_share_half_life_s)
        self.pending_written_at = -math.inf
        self.forecast_at = -math.inf
        self.forecast_cost = 0.0
        self.executor = executor_for(ctx.settings, ctx.redis)
        self.handover = None if self.executor.places_jobs else HandOver(ctx, self.executor)
        """Where the executor's cluster places jobs itself (Slurm), each pass hands them over."""
        self.expected: dict[int, Forecast] = {}
        """The last replay's expected starts (see `defaults.FORECAST_COST_RATIO`)."""
        self.replay: Replay | None = None
        """The replay under way: a pass starts it and goes on with it for at most
        `defaults.FORECAST_SLICE_S`; `serve` goes on with it between passes."""
        self.replay_spent = 0.0
        self.replay_again = False
        """A job came while a replay was under way or before the next was due: it gets the
        next one as soon as `defaults.FORECAST_COST_RATIO` allows, without waiting for
        `PENDING_REFRESH_S` or the next timed pass."""
        self.unwritten = False
        """A replay is over and the next pass writes what it found."""

    def run_pass(self, blocking_timeout: float = 10.0) -> PassReport | None:
        """One pass under the scheduler lock; None when another process holds it too long."""
        lock = self.ctx.redis.lock(
            keys.SCHEDULER_LOCK, timeout=defaults.SCHEDULER_LOCK_TTL_S, blocking_timeout=blocking_timeout
        )
        if not lock.acquire():
            return None
        try:
            return self._locked_pass()
        finally:
            try:
                lock.release()
            except redis.exceptions.LockError:
                log.warning("scheduler lock expired during a pass")

    def _locked_pass(self) -> PassReport:
        started = time.perf_counter()
        report = PassReport()
        if self.handover is not None:
            handed, held, stored = self.handover.run()
            report.placed = [(a.job_id, a.attempt, self.executor.name, ()) for a in handed]
            self._write_held(held, {}, stored)
            report.waiting = len(held)
            report.seconds = time.perf_counter() - started
            return report
        now = utcnow()
        self._repair(now, report)
        with self.ctx.db.read() as session:
            everyone, stored = read_queued(session)
            held, never, begins = held_back(session, [q.id for q in everyone])
            queued = [q for q in everyone if q.id not in held and q.id not in never]
            arrivals = arriving(everyone, begins)
            cluster, _ = read_cluster(session, now)
            usage = self.ledger.usage(session, now)
            fair_share = read_fair_share(session, usage, self.ctx.settings.user_gpu_limit, now)
            targets = read_targets(session)
        cancel_never(self.ctx, never)
        self.ledger.history.annotate([*queued, *(job for _, job in arrivals)], cluster.running)
        by_id = {q.id: q for q in queued}
        queued, resized = settle_resizes(queued, cluster, targets, now.timestamp())  # before anyone takes their GPUs
        with collector_paused():
            decision = schedule(queued, cluster, fair_share, now.timestamp(), self.config)
        stopping: list[PreemptMessage] = []
        if resized or decision.placements or decision.preempt or decision.reclaim or decision.shrink or decision.grow:
            with self.ctx.db.write() as session:
                self._serialize(session)
                stops = stop_reasons(decision, cluster, now.timestamp())
                commit = Decision(resized + decision.placements, preempt=decision.preempt, reclaim=decision.reclaim)
                continued = {p.job_id for p in resized}
                stopping = self._commit(session, commit, by_id, stops, continued, report)
                report.resized, resizing = request_resizes(session, decision, cluster)
                stopping += resizing
        for job_id, attempt, host, rank in report.repairs.resend:
            log.warning(
                "launch of job %s attempt %s was lost (Redis flushed?): sent again to %s", job_id, attempt, host
            )
            self.send_launch(job_id, attempt, host, rank)
        ranks: dict[int, int] = {}
        for job_id, attempt, host, _ in report.placed:  # first: what follows must not delay a start
            ranks[job_id] = ranks.get(job_id, -1) + 1
            self.send_launch(job_id, attempt, host, ranks[job_id])
        for message in stopping:
            self.executor.stop(message)
        started_ids = {job_id for job_id, *_ in report.placed}
        self._write_pending(decision, stored, now.timestamp(), started_ids, (queued, cluster, fair_share, arrivals))
        self._write_held(held, begins, stored)
        report.waiting = len(decision.pending)
        report.seconds = time.perf_counter() - started
        return report

    def _repair(self, now: datetime, report: PassReport) -> None:
        """Dead hosts and lost launches; a write transaction only when there is work."""
        with self.ctx.db.read() as session:
            needed = needs_repair(session, self.ctx.settings, now)
        if needed:
            with self.ctx.db.write() as session:
                mark_dead_hosts(session, self.ctx.settings, now, report.repairs)
                resend_lost_launches(session, self.ctx.settings, self.executor, now, report.repairs)

    def _serialize(self, session: Session) -> None:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_PASS_LOCK})

    def _commit(
        self,
        session: Session,
        decision: Decision,
        queued: dict[int, QueuedJob],
        stops: dict[int, str],
        continued: set[int],
        report: PassReport,
    ) -> list[PreemptMessage]:
        """Write the decision, re-checking in this transaction what the snapshot (read
        outside it) said: each job still queued, each GPU still up, undrained and with
        room. A placement that no longer holds is left to the next pass, so whatever
        happened meanwhile, no GPU is ever given more than it has. A placement in `continued`
        goes on with its job's run (a resized elastic job's); every other one begins a run,
        from what its job has served so far (time slicing counts from there)."""
        room = free_room(session, {(host, i) for p in decision.placements for host, ids in p.slots for i in ids})
        for placement in decision.placements:
            job = session.scalars(select(Job).where(Job.id == placement.job_id).with_for_update()).one_or_none()
            fraction = queued[placement.job_id].fraction
            wanted = [(host, i) for host, ids in placement.slots for i in ids]
            if (
                job is None
                or job.state != JobState.QUEUED
                or any(room.get(g, (None, 0.0))[1] < fraction - 1e-9 for g in wanted)
            ):
                continue
            dispatch(session, job, placement.host, [room[g][0] for g in wanted], fraction)
            if placement.job_id not in continued:
                job.run_served_gpu_s = queued[placement.job_id].served_gpu_s
            for gpu in wanted:
                room[gpu] = (room[gpu][0], room[gpu][1] - fraction)
            for host, ids in placement.slots:  # a job over several hosts: a launch on each, rank by rank
                report.placed.append((job.id, job.attempts, host, ids))
        stopping = []
        for victim, reason in stops.items():
            job = session.get(Job, victim)
            if job is not None:
                if message := request_preemption(session, job, reason):
                    stopping.append(message)
                report.preempted.append(victim)
        return stopping  # told to the executor once this commits

    def _write_pending(
        self,
        decision: Decision,
        stored: dict[int, Stored],
        now: float,
        started: set[int],
        inputs: Inputs,
    ) -> None:
        """Queue positions, reasons, reservations and expected starts, written (in their own
        transaction) only where they changed."""
        changes: dict[int, Stored] = {}
        # A long queue's positions shift with every pass; rewriting them all at most once a
        # second keeps the one-writer database free for submissions. A job not yet given a
        # position gets one at once.
        refresh = time.monotonic() - self.pending_written_at >= defaults.PENDING_REFRESH_S
        fresh = any(stored.get(p.job_id, (None,))[0] is None for p in decision.pending)
        due = time.monotonic() - self.forecast_at >= self.forecast_cost * defaults.FORECAST_COST_RATIO
        if self.replay is None and (refresh or fresh or self.replay_again) and due:
            self.replay, self.replay_spent, self.replay_again = self._forecast(decision, inputs, now), 0.0, False
        elif fresh:
            # A job the replay under way or the last one does not know: the next replay is
            # owed as soon as the last one's cost allows (`serve` wakes for it), not at the
            # next timed pass.
            self.replay_again = True
        if self.replay is not None:
            self.advance_forecast(defaults.FORECAST_SLICE_S)
        replayed, self.unwritten = self.unwritten, False
        expected = self.expected
        for pending in decision.pending:
            was = stored.get(pending.job_id, (None, None, None, None, None))
            expected_at, expected_host = expected_start(expected.get(pending.job_id))
            # A new replay's expected starts are written at once (with the rest of the row).
            moved = replayed and (was[3], was[4]) != (expected_at, expected_host)
            if pending.job_id in started or not (refresh or was[0] is None or moved):
                continue
            reason = describe(pending.reason, now) if pending.reason is not None else None
            reserved = pending.reserved_start
            if reason is not None:
                reason = describe_reserved(reason, reserved, now)
            start = datetime.fromtimestamp(reserved, UTC) if reserved is not None and math.isfinite(reserved) else None
            row = (pending.position, reason, start, expected_at, expected_host)
            if was != row:
                changes[pending.job_id] = row
        if changes:
            self._store_pending(changes)
            self.pending_written_at = time.monotonic()

    def _forecast(self, decision: Decision, inputs: Inputs, now: float) -> Replay:
        """The replay of the waiting jobs' expected starts: the policy replayed forward (in
        queue order, those placed in this pass first, as the pass saw them), the jobs held
        back by their begin alone joining at their begin."""
        queued, cluster, fair_share, arrivals = inputs
        order = in_queue_order(queued, decision.placements, decision.pending)
        return Replay(order, cluster, fair_share, now, self.config, arrivals)

    @property
    def replay_owed_at(self) -> float | None:
        """When (monotonic) the replay owed to a job that came during the last one, or before
        the next was due, may start (`defaults.FORECAST_COST_RATIO`); None when none is owed."""
        if self.replay is not None or not self.replay_again:
            return None
        return self.forecast_at + self.forecast_cost * defaults.FORECAST_COST_RATIO

    @property
    def forecasting(self) -> bool:
        """A replay of expected starts is under way."""
        return self.replay is not None

    def advance_forecast(self, budget_s: float) -> bool:
        """Go on with the replay under way for about `budget_s`; True when it is over (its
        expected starts are then written by the next pass)."""
        if self.replay is None:
            return False
        started = time.monotonic()
        over = self.replay.run(budget_s)
        self.replay_spent += time.monotonic() - started
        if over:
            self.expected, self.replay, self.unwritten = self.replay.found, None, True
            self.forecast_at, self.forecast_cost = time.monotonic(), self.replay_spent
        return over

    def _write_held(self, held: dict[int, str], begins: dict[int, datetime], stored: dict[int, Stored]) -> None:
        """Jobs held back (a hold, a dependency, their begin, their sweep's `max_parallel`):
        that is their reason. Those held back by their begin alone have the last replay's
        expected start, if it found one."""
        changes: dict[int, Stored] = {}
        for job_id, reason in held.items():
            expected_at, expected_host = expected_start(self.expected.get(job_id) if job_id in begins else None)
            row = (None, reason, None, expected_at, expected_host)
            if stored.get(job_id) != row:
                changes[job_id] = row
        if changes:
            self._store_pending(changes)

    def _store_pending(self, rows: dict[int, Stored]) -> None:
        """Each queued job's row of `PENDING_COLUMNS`, in one transaction of their own."""
        changes = [{"id": job_id, **dict(zip(PENDING_COLUMNS, row, strict=True))} for job_id, row in rows.items()]
        with self.ctx.db.write() as session:
            statement = update(Job).where(Job.state == JobState.QUEUED)
            session.execute(statement, changes, execution_options={"synchronize_session": None})

    def send_launch(self, job_id: int, attempt: int, host: str, rank: int = 0) -> None:
        """The executor starts the attempt (its GPUs are in the database, `worker.launch`)."""
        self.executor.submit(Attempt(job_id, attempt, host, rank=rank))


@contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector held off during the policy's call. Each pass builds its queue
    anew (thousands of jobs with their rows), so collections land inside the call, now and
    then a full one walking all of it; paused, what the call leaves is collected after it,
    between passes (`bench/elastic.py --pass-only` times both). Already off: stays off."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def stop_reasons(decision: Decision, cluster: Cluster, now: float) -> dict[int, str]:
    """What each job the pass stops is told (and its return to the queue records)."""
    served = {r.id: r.served(now) for r in cluster.running}
    reasons = {}
    for victim, for_job in decision.preempt.items():
        if victim in decision.sliced:
            hours = served.get(victim, 0.0) / 3600
            reasons[victim] = (
                f"had its time slice ({hours:.1f} GPU-hours so far): stopped to make room for job {for_job}; "
                "it queues again and resumes from its checkpoint"
            )
        else:
            reasons[victim] = f"preempted to make room for high-priority job {for_job}"
    groups = {kept.id: kept.group for kept in cluster.reservations}
    for victim, kept_id in decision.reclaim.items():
        reasons[victim] = (
            f"its GPUs are reserved for group {groups[kept_id]} from now (reservation {kept_id}): "
            "stopped; it queues again and resumes from its checkpoint"
        )
    return reasons
