"""Prometheus metrics (`GET /metrics`), read from the database and Redis at scrape time.

The API runs as several processes, and jobs are decided by the scheduler and run by the
workers, so in-process counters would each see a part: every figure here is computed from
the shared state when Prometheus scrapes. The counters and histograms only grow (jobs are
never deleted), as Prometheus expects of them:

- `towerq_jobs{state,user}`, `towerq_queue_length` (those on hold apart:
  `towerq_jobs_on_hold`; those whose begin is ahead: `towerq_jobs_not_begun`), `towerq_hosts{state}`,
  `towerq_gpus`, `towerq_gpus_allocated` (fractions summed), `towerq_gpus_by_state{host,state}`
  (free, held, drained, down), `towerq_gpu_utilization_ratio{host,gpu}` (NVML GPUs),
  `towerq_gpus_held_idle{user}` (GPUs held by running jobs idle past `TOWERQ_GPU_IDLE_WARN_S`,
  fractions summed: an alert's figure);
- `towerq_submissions_total`, `towerq_crashes_total`;
- histograms `towerq_queue_wait_seconds` (submit to first dispatch, time on hold left out),
  `towerq_submit_to_running_seconds` (submit to first running) and
  `towerq_scheduling_pass_seconds` (the scheduler records each pass in Redis).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core import keys
from service.core.db import Database
from service.core.models import Allocation, Gpu, Host, HostState, Job, JobEvent, JobState, User, utcnow, wait_start
from service.core.models.jobs import idle_since

WAIT_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
PASS_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def record_pass(client: redis.Redis, seconds: float) -> None:
    """Count one scheduling pass of `seconds` in the histogram (called by the scheduler)."""
    bucket = next((str(b) for b in PASS_BUCKETS_S if seconds <= b), "+Inf")
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(keys.PASS_HISTOGRAM, bucket, 1)
    pipe.hincrbyfloat(keys.PASS_HISTOGRAM, "sum", seconds)
    pipe.execute()


class TowerqCollector(Collector):
    def __init__(self, db: Database, redis_client: redis.Redis) -> None:
        self.db = db
        self.redis = redis_client

    def collect(self) -> Iterator[Metric]:
        with self.db.read() as session:
            yield from self._jobs(session)
            yield from self._gpus(session)
            yield self._histogram(
                "towerq_queue_wait_seconds", "From submit to the first dispatch.", _waits(session, JobState.DISPATCHED)
            )
            yield self._histogram(
                "towerq_submit_to_running_seconds",
                "From submit to the trainer running.",
                _waits(session, JobState.RUNNING),
            )
        yield self._passes()

    def _jobs(self, session: Session) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("towerq_jobs", "Jobs by state and user.", labels=["state", "user"])
        rows = session.execute(
            select(Job.state, User.name, func.count(Job.id)).join(User).group_by(Job.state, User.name)
        )
        queued = 0
        for state, user, count in rows:
            jobs.add_metric([state, user], count)
            queued += count if state == JobState.QUEUED else 0
        yield jobs
        on_hold = select(Job.state, func.count(Job.id)).where(Job.on_hold_by.is_not(None)).group_by(Job.state)
        held: dict[str, int] = {state: count for state, count in session.execute(on_hold)}  # queued; Slurm's pending
        later = select(func.count(Job.id)).where(
            Job.state == JobState.QUEUED, Job.on_hold_by.is_(None), Job.begin_at > utcnow()
        )
        not_begun = session.scalar(later) or 0  # not on hold, its begin ahead
        waiting = queued - held.get(JobState.QUEUED, 0) - not_begun
        yield GaugeMetricFamily(
            "towerq_queue_length", "Jobs waiting for GPUs (not on hold, their begin time past).", value=waiting
        )
        yield GaugeMetricFamily("towerq_jobs_on_hold", "Jobs on hold (towerq hold).", value=sum(held.values()))
        yield GaugeMetricFamily(
            "towerq_jobs_not_begun", "Queued jobs whose begin time is ahead (towerq run --begin).", value=not_begun
        )
        submitted = session.scalar(select(func.count(Job.id))) or 0
        crashes = session.scalar(select(func.coalesce(func.sum(Job.crashes), 0))) or 0
        yield CounterMetricFamily("towerq_submissions", "Jobs submitted.", value=submitted)
        yield CounterMetricFamily("towerq_crashes", "Attempts that crashed (worker or trainer died).", value=crashes)

    def _gpus(self, session: Session) -> Iterator[Metric]:
        hosts = dict(session.execute(select(Host.state, func.count(Host.id)).group_by(Host.state)).all())
        by_host_state = GaugeMetricFamily("towerq_hosts", "GPU hosts by state.", labels=["state"])
        for state in HostState:
            by_host_state.add_metric([state.value], hosts.get(state, 0))
        yield by_host_state
        held = dict(
            session.execute(
                select(Allocation.gpu_id, func.sum(Allocation.fraction))
                .where(Allocation.released_at.is_(None))
                .group_by(Allocation.gpu_id)
            ).all()
        )
        gpus = session.execute(
            select(Gpu.id, Gpu.index, Gpu.drained, Gpu.utilization_pct, Host.name, Host.state)
            .join(Host)
            .where(Gpu.present.is_(True))
            .order_by(Host.name, Gpu.index)
        ).all()
        states = GaugeMetricFamily(
            "towerq_gpus_by_state", "GPUs by host and state (free, held, drained, down).", labels=["host", "state"]
        )
        utilization = GaugeMetricFamily(
            "towerq_gpu_utilization_ratio", "GPU utilization as NVML reports it (0-1).", labels=["host", "gpu"]
        )
        counts: dict[tuple[str, str], int] = {}
        for gpu_id, index, drained, pct, host, host_state in gpus:
            if host_state != HostState.UP:
                condition = "down"
            else:
                condition = "drained" if drained else "held" if held.get(gpu_id) else "free"
            counts[(host, condition)] = counts.get((host, condition), 0) + 1
            if pct is not None:
                utilization.add_metric([host, str(index)], pct / 100.0)
        for host in sorted({host for host, _ in counts}):
            for condition in ("free", "held", "drained", "down"):
                states.add_metric([host, condition], counts.get((host, condition), 0))
        yield GaugeMetricFamily("towerq_gpus", "GPUs registered.", value=len(gpus))
        yield GaugeMetricFamily(
            "towerq_gpus_allocated", "GPUs allocated (fractions summed).", value=float(sum(held.values()) or 0)
        )
        yield states
        yield utilization
        yield self._held_idle(session)

    def _held_idle(self, session: Session) -> Metric:
        """GPUs held by running jobs whose GPUs have been idle past the warning time, by user."""
        idle = GaugeMetricFamily(
            "towerq_gpus_held_idle",
            "GPUs held by running jobs whose GPUs have been idle past TOWERQ_GPU_IDLE_WARN_S (fractions summed).",
            labels=["user"],
        )
        rows = session.execute(
            select(User.name, Job.gpu_use, Job.attempts, Job.gpu_count, Job.gpu_memory_fraction)
            .join(User)
            .where(Job.state == JobState.RUNNING, Job.gpu_use.is_not(None))
        )
        held: dict[str, float] = {}
        for user, stored, attempt, count, fraction in rows:
            if idle_since(stored, attempt):
                held[user] = held.get(user, 0.0) + count * min(1.0, fraction or 1.0)
        for user in sorted(held):
            idle.add_metric([user], held[user])
        return idle

    def _histogram(self, name: str, documentation: str, values: Sequence[float]) -> Metric:
        buckets = [(str(bound), sum(1 for v in values if v <= bound)) for bound in WAIT_BUCKETS_S]
        buckets.append(("+Inf", len(values)))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=float(sum(values)))

    def _passes(self) -> Metric:
        try:
            stored: dict[Any, Any] = self.redis.hgetall(keys.PASS_HISTOGRAM)
            raw = {(k.decode() if isinstance(k, bytes) else str(k)): float(v) for k, v in stored.items()}
        except redis.RedisError:
            raw = {}
        running = 0.0
        buckets = []
        for bound in PASS_BUCKETS_S:
            running += raw.get(str(bound), 0.0)
            buckets.append((str(bound), running))
        buckets.append(("+Inf", running + raw.get("+Inf", 0.0)))
        return HistogramMetricFamily(
            "towerq_scheduling_pass_seconds",
            "How long scheduling passes take.",
            buckets=buckets,
            sum_value=raw.get("sum", 0.0),
        )


def _waits(session: Session, reached: JobState) -> list[float]:
    """For every job that reached `reached`: seconds from its submit to the first time, less
    its time on hold before it (`Job.wait_held_s`)."""
    first = (
        select(JobEvent.job_id, func.min(JobEvent.time).label("at"))
        .where(JobEvent.state == reached.value)
        .group_by(JobEvent.job_id)
        .subquery()
    )
    rows: Any = session.execute(
        select(Job.created_at, Job.wait_held_s, first.c.at).join(first, first.c.job_id == Job.id)
    )
    return [max(0.0, (_aware(at) - wait_start(_aware(created), held)).total_seconds()) for created, held, at in rows]


def _aware(moment: datetime) -> datetime:
    from datetime import UTC

    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
