"""`POST /api/jobs?dry_run=true`: when would this job start if it were submitted now?

The job is not stored: it joins a copy of the live queue (as a pass would read it) and the
policy is replayed forward (`forecast`), exactly as for the jobs already waiting."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.models import Job
from service.core.settings import Settings
from service.scheduler.explain import clock, describe
from service.scheduler.forecast import Forecast, forecast, in_queue_order
from service.scheduler.holdbacks import dependency_wait
from service.scheduler.policy import schedule
from service.scheduler.snapshot import live_inputs, session_hosts
from service.scheduler.types import PRIORITY_RANK, PolicyConfig, QueuedJob
from towerq.contract.spec import JobSpec

CANDIDATE = -1
"""The id the job under question carries in the replay (stored jobs' ids are positive)."""


@dataclass
class Estimate:
    starts_now: bool
    expected_start_at: datetime | None
    expected_host: str | None
    queue_position: int | None
    """Where it would stand in the queue now (None: it would start at once)."""
    reason: str | None
    """Why it would wait, in the words the queue shows."""
    starts_on: int | None = None
    """How many GPUs it would start on now (an elastic job: maybe fewer than it asks for)."""


def policy_config(settings: Settings) -> PolicyConfig:
    return PolicyConfig(
        aging_s=settings.aging_s,
        reserve_after_s=settings.reserve_after_s,
        max_reservations=settings.max_reservations,
        preemption=settings.preemption,
        demote_after_gpu_s=settings.time_slice_gpu_s,
    )


def estimate(
    session: Session, settings: Settings, user: str, spec: JobSpec, host: str | None, after: list[int] | None = None
) -> Estimate:
    """When and where the job would start if submitted now; `after`: the ids of the jobs it
    would wait for (resolved as a submit resolves them), which hold it first."""
    if spec.hold:
        return Estimate(False, None, None, None, "on hold: it starts once released (towerq release ID)")
    if after:
        states = dict(session.execute(select(Job.id, Job.state).where(Job.id.in_(after))).all())
        if waits := dependency_wait(after, spec.after_condition, states):
            return Estimate(False, None, None, None, f"{waits}: no start estimate until then")
    now = datetime.now(UTC)
    t = now.timestamp()
    begin = spec.begin_at.timestamp() if spec.begin_at is not None and spec.begin_at > now else None
    queued, cluster, fair_share, history, arrivals = live_inputs(
        session, settings.fair_share_half_life_s, settings.user_gpu_limit, now
    )
    candidate = QueuedJob(
        CANDIDATE,
        user,
        PRIORITY_RANK[spec.priority.value],
        spec.gpu_count or 1,  # the spec made it len(gpus) when it names GPUs
        spec.gpu_memory_fraction,
        t if begin is None else begin,  # as a pass ranks it: submitted at its begin
        host=host,
        indices=tuple(spec.gpus) if spec.gpus else None,
        limit_s=float(spec.time_limit_s) if spec.time_limit_s is not None else None,
        group=spec.group,
        min_gpu_count=spec.min_gpu_count,
        hosts=session_hosts(session)[0] if spec.is_notebook and host is None else None,
    )
    history.annotate([candidate], [])
    config = policy_config(settings)
    if begin is not None:  # held back until then, when it joins the queue in the replay
        decision = schedule(queued, cluster, fair_share, t, config)
        order = in_queue_order(queued, decision.placements, decision.pending)
        found = forecast(order, cluster, fair_share, t, config, [*arrivals, (begin, candidate)]).get(CANDIDATE)
        return Estimate(False, *expected_start(found), None, f"not before {clock(begin, t)} (its begin time)")
    everyone = [*queued, candidate]
    decision = schedule(everyone, cluster, fair_share, t, config)
    order = in_queue_order(everyone, decision.placements, decision.pending)
    found = forecast(order, cluster, fair_share, t, config, arrivals).get(CANDIDATE)
    pending = next((p for p in decision.pending if p.job_id == CANDIDATE), None)
    placed = next((p for p in decision.placements if p.job_id == CANDIDATE), None)
    starts_now = placed is not None
    return Estimate(
        starts_now,
        *expected_start(found),
        queue_position=pending.position if pending is not None else None,
        reason=describe(pending.reason, t) if pending is not None and pending.reason is not None else None,
        starts_on=sum(len(ids) for _, ids in placed.slots) if placed is not None else None,
    )


def expected_start(found: Forecast | None) -> tuple[datetime | None, str | None]:
    """The replay's expected start (to the second) and host, or none."""
    if found is None:
        return None, None
    return datetime.fromtimestamp(round(found.start), UTC), found.host
