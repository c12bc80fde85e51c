"""The live scheduling pass: repair, decide, allocate, dispatch.

One pass at a time across all processes (a Redis lock, and on PostgreSQL also an advisory
lock in the transaction, so that even a lost Redis lock cannot let two passes allocate at
once). Allocations and the `dispatched` states are written in one transaction; the launch
messages go to the hosts' RQ queues only after it commits.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from rq import Queue
from sqlalchemy import text, update
from sqlalchemy.orm import Session

from service import defaults, keys
from service.context import Context
from service.lifecycle import dispatch, request_preemption
from service.models import Job, utcnow
from service.scheduler.explain import describe, describe_reserved
from service.scheduler.ledger import UsageLedger
from service.scheduler.policy import schedule
from service.scheduler.reconcile import Repairs, launch_id, mark_dead_hosts, resend_lost_launches
from service.scheduler.snapshot import Stored, read_cluster, read_fair_share, read_queued
from service.scheduler.types import Decision, Policy, PolicyConfig

log = logging.getLogger(__name__)

PG_PASS_LOCK = 0x746F77657271  # "towerq"


@dataclass
class PassReport:
    placed: list[tuple[int, int, str, tuple[int, ...]]] = field(default_factory=list)
    """(job id, attempt, host, GPU indices) started in this pass."""
    waiting: int = 0
    preempted: list[int] = field(default_factory=list)
    repairs: Repairs = field(default_factory=Repairs)
    seconds: float = 0.0


class LiveScheduler:
    """Runs scheduling passes against the database for the whole lab."""

    def __init__(self, ctx: Context, policy: Policy = Policy.TOWERQ) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.config = PolicyConfig(
            policy=policy,
            aging_s=s.aging_s,
            reserve_after_s=s.reserve_after_s,
            max_reservations=s.max_reservations,
            preemption=s.preemption,
        )
        self.ledger = UsageLedger(s.fair_share_half_life_s)

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
        with self.ctx.db.write() as session:
            self._serialize(session)
            now = utcnow()
            mark_dead_hosts(session, self.ctx.settings, now, report.repairs)
            resend_lost_launches(session, self.ctx.settings, self.ctx.redis, now, report.repairs)
            decision = self._decide(session, now, report)
        for job_id, attempt, host in report.repairs.resend:
            self.send_launch(job_id, attempt, host)
        for job_id, attempt, host, _ in report.placed:
            self.send_launch(job_id, attempt, host)
        report.waiting = len(decision.pending)
        report.seconds = time.perf_counter() - started
        return report

    def _serialize(self, session: Session) -> None:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_PASS_LOCK})

    def _decide(self, session: Session, now: datetime, report: PassReport) -> Decision:
        queued, stored = read_queued(session)
        cluster, gpus = read_cluster(session)
        usage = self.ledger.usage(session, now)
        self.ledger.history.annotate(queued, cluster.running)
        fair_share = read_fair_share(session, usage, self.ctx.settings.user_gpu_limit)
        decision = schedule(queued, cluster, fair_share, now.timestamp(), self.config)
        by_id = {q.id: q for q in queued}
        for placement in decision.placements:
            job = session.get(Job, placement.job_id)
            assert job is not None
            chosen = [gpus[(placement.host, i)] for i in placement.indices]
            dispatch(session, job, placement.host, chosen, by_id[job.id].fraction)
            report.placed.append((job.id, job.attempts, placement.host, placement.indices))
        for victim, for_job in decision.preempt.items():
            job = session.get(Job, victim)
            if job is not None:
                request_preemption(session, job, for_job)
                report.preempted.append(victim)
        self._write_pending(session, decision, stored, now.timestamp())
        return decision

    @staticmethod
    def _write_pending(session: Session, decision: Decision, stored: dict[int, Stored], now: float) -> None:
        """Queue positions, reasons and reservations, written only where they changed."""
        changes = []
        for pending in decision.pending:
            reason = describe(pending.reason, now) if pending.reason is not None else None
            reserved = pending.reserved_start
            if reason is not None:
                reason = describe_reserved(reason, reserved, now)
            start = datetime.fromtimestamp(reserved, UTC) if reserved is not None and math.isfinite(reserved) else None
            if stored.get(pending.job_id) != (pending.position, reason, start):
                changes.append(
                    {
                        "id": pending.job_id,
                        "queue_position": pending.position,
                        "pending_reason": reason,
                        "reserved_start_at": start,
                    }
                )
        if changes:
            session.execute(update(Job), changes)

    def send_launch(self, job_id: int, attempt: int, host: str) -> None:
        """Put the launch message for this attempt on the host's queue."""
        queue = Queue(keys.host_queue(host), connection=self.ctx.redis)
        queue.enqueue_call(
            "worker.agent.launch",
            args=(job_id, attempt),
            timeout=defaults.RQ_LAUNCH_TIMEOUT_S,
            job_id=launch_id(job_id, attempt),
            result_ttl=24 * 3600,
            failure_ttl=7 * 24 * 3600,
            description=f"launch job {job_id} attempt {attempt}",
        )
