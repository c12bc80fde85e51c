"""Reading the policy's inputs from the database inside the pass's transaction."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.models import (
    HOLDING_STATES,
    Allocation,
    Gpu,
    Group,
    Host,
    HostState,
    Job,
    JobState,
    Reservation,
    User,
    expected_end_at,
    session_refusals,
    utcnow,
)
from service.scheduler.history import RunTimes
from service.scheduler.holdbacks import held_back
from service.scheduler.holdings import holdings
from service.scheduler.ledger import UsageLedger
from service.scheduler.resize import read_targets
from service.scheduler.settle import Target, settle_resizes
from service.scheduler.types import (
    PRIORITY_RANK,
    Cluster,
    FairShare,
    HostCapacity,
    LabReservation,
    QueuedJob,
    RunningJob,
)
from towerq.contract.spec import stoppable

Stored = tuple[int | None, str | None, datetime | None, datetime | None, str | None]
"""What a queued job shows now: its `PENDING_COLUMNS`."""
PENDING_COLUMNS = ("queue_position", "pending_reason", "reserved_start_at", "expected_start_at", "expected_host")


def served_before(session: Session, states: tuple[JobState, ...]) -> dict[int, float]:
    """GPU-seconds the earlier attempts of the jobs in `states` held GPUs (their released
    allocations, each GPU times its fraction), for the jobs that have any. Only a job on its
    second attempt or later can have one, which keeps the read small."""
    rows = session.execute(
        select(Allocation.job_id, Allocation.fraction, Allocation.created_at, Allocation.released_at)
        .join(Job, Allocation.job_id == Job.id)
        .where(Job.state.in_(states), Job.attempts > 1, Allocation.released_at.is_not(None))
    )
    served: dict[int, float] = defaultdict(float)
    for job_id, fraction, created_at, released_at in rows:
        if released_at is not None:  # excluded by the query; tells the type checker
            served[job_id] += fraction * max(0.0, (released_at - created_at).total_seconds())
    return served


def session_hosts(session: Session) -> tuple[frozenset[str] | None, set[int]]:
    """Where some hosts that are up run no notebook sessions (their workers said so): the
    hosts that do, and the queued sessions that name no host, which may run only there;
    else (None, nothing): no host's worker refuses them, the common lab, read in one small
    query. A session that names its host goes there, and where the host refuses it (it
    did not when the session was submitted) fails at its start saying why, rather than wait
    for another host it may not take."""
    refusals = session_refusals(session)
    if not any(refusals.values()):
        return None, set()
    queued = select(Job.id).where(
        Job.state == JobState.QUEUED, Job.requested_host.is_(None), Job.spec["kind"].as_string() == "notebook"
    )
    return frozenset(name for name, why in refusals.items() if not why), set(session.scalars(queued))


def read_queued(session: Session) -> tuple[list[QueuedJob], dict[int, Stored]]:
    rows = session.execute(
        select(
            Job.id,
            User.name,
            Job.priority,
            Job.gpu_count,
            Job.min_gpu_count,
            Job.gpu_memory_fraction,
            Job.created_at,
            Job.requested_host,
            Job.requested_gpus,
            Job.time_limit_s,
            Job.held_s,
            Job.queue_position,
            Job.pending_reason,
            Job.reserved_start_at,
            Job.expected_start_at,
            Job.expected_host,
            Job.group,
        )
        .join(User, Job.user_id == User.id)
        .where(Job.state == JobState.QUEUED)
    )
    queued, current = [], {}
    served = served_before(session, (JobState.QUEUED,))
    only, sessions = session_hosts(session)
    for r in rows:
        queued.append(
            QueuedJob(
                id=r.id,
                user=r.name,
                priority=PRIORITY_RANK[r.priority],
                gpu_count=r.gpu_count,
                fraction=r.gpu_memory_fraction,
                submitted=r.created_at.timestamp() + r.held_s,  # time on hold is no wait
                host=r.requested_host,
                indices=tuple(r.requested_gpus) if r.requested_gpus is not None else None,
                limit_s=float(r.time_limit_s) if r.time_limit_s is not None else None,
                served_gpu_s=served.get(r.id, 0.0),
                group=r.group,
                min_gpu_count=r.min_gpu_count,
                hosts=only if r.id in sessions else None,
            )
        )
        current[r.id] = (r.queue_position, r.pending_reason, r.reserved_start_at, r.expected_start_at, r.expected_host)
    return queued, current


def read_cluster(session: Session, now: datetime | None = None) -> tuple[Cluster, dict[tuple[str, int], Gpu]]:
    """Hosts that are up, their GPUs' free fractions, the jobs holding GPUs, and the lab's
    reservations not yet over at `now` (default: now)."""
    hosts = session.scalars(select(Host).where(Host.state == HostState.UP).order_by(Host.name)).all()
    gpus: dict[tuple[str, int], Gpu] = {}
    capacity: dict[str, HostCapacity] = {}
    for host in hosts:
        present = [g for g in host.gpus if g.present]
        size = max((g.index for g in present), default=-1) + 1
        free = [0.0] * size
        unusable = set(range(size))
        for gpu in present:
            gpus[(host.name, gpu.index)] = gpu
            if not gpu.drained:
                free[gpu.index] = 1.0
                unusable.discard(gpu.index)
        capacity[host.name] = HostCapacity(host.name, free, frozenset(unusable))
    running = _read_running(session, capacity)
    return Cluster(list(capacity.values()), running, read_reservations(session, now or utcnow())), gpus


def read_reservations(session: Session, now: datetime) -> list[LabReservation]:
    rows = session.scalars(select(Reservation).where(Reservation.end_at > now).order_by(Reservation.start_at))
    return [
        LabReservation(
            r.id, r.group, r.start_at.timestamp(), r.end_at.timestamp(), tuple((host, int(i)) for host, i in r.gpus)
        )
        for r in rows
    ]


def _read_running(session: Session, capacity: dict[str, HostCapacity]) -> list[RunningJob]:
    rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.fraction,
            Allocation.created_at,
            Host.name,
            Gpu.index.label("gpu_index"),
            User.name.label("user"),
            Job.priority,
            Job.time_limit_s,
            Job.cancel_requested_at,
            Job.preempt_requested_at,
            Job.group,
            Job.spec,
            Job.gpu_count,
            Job.min_gpu_count,
            Job.resize_to,
            Job.requested_host,
            Job.run_served_gpu_s,
            Job.state,
            Job.step,
            Job.step_at,
            Job.pace_s,
            Job.total_steps,
        )
        .join(Gpu, Allocation.gpu_id == Gpu.id)
        .join(Host, Allocation.host_id == Host.id)
        .join(Job, Allocation.job_id == Job.id)
        .join(User, Job.user_id == User.id)
        .where(Allocation.released_at.is_(None))
    )
    # A job over several hosts is a part on each (as the simulator runs trace jobs bigger
    # than a host), all with its id.
    by_job: dict[tuple[int, str], RunningJob] = {}
    indices: dict[tuple[int, str], list[int]] = defaultdict(list)
    served = served_before(session, HOLDING_STATES)
    moves: dict[int, Target] = {}
    for r in rows:
        target = Target.read(r.resize_to)
        # Stopping to restart on its target (not cancelled on the way): a move's target is held.
        resizing = target if r.preempt_requested_at is not None and r.cancel_requested_at is None else None
        if resizing is not None and resizing.host != r.name:
            moves[r.job_id] = resizing
        host = capacity.get(r.name)
        if host is not None:
            host.take((r.gpu_index,), r.fraction)
        indices[(r.job_id, r.name)].append(r.gpu_index)
        if (r.job_id, r.name) not in by_job:
            by_job[(r.job_id, r.name)] = RunningJob(
                id=r.job_id,
                user=r.user,
                priority=PRIORITY_RANK[r.priority],
                host=r.name,
                indices=(),
                fraction=r.fraction,
                started=r.created_at.timestamp(),
                limit_s=float(r.time_limit_s) if r.time_limit_s is not None else None,
                stopping=r.cancel_requested_at is not None or r.preempt_requested_at is not None,
                served_gpu_s=served.get(r.job_id, 0.0),
                group=r.group,
                stoppable=stoppable(r.spec),
                min_gpu_count=r.min_gpu_count,
                full_gpu_count=r.gpu_count if r.min_gpu_count is not None else None,
                run_served_gpu_s=r.run_served_gpu_s,
                shrinking_for=target.for_job if target is not None else None,
                moving=target is not None and target.host != r.name,
                pinned=r.requested_host is not None,
                restarts_on=(resizing.host, resizing.gpus) if resizing is not None else None,
                measured_end=_timestamp(expected_end_at(r.state, r.step, r.step_at, r.pace_s, r.total_steps)),
            )
    whole: dict[int, float] = defaultdict(float)
    for part, running in by_job.items():
        running.indices = tuple(sorted(indices[part]))
        whole[running.id] += running.gpu_load
    for running in by_job.values():
        if whole[running.id] != running.gpu_load:  # a job over several hosts
            running.job_gpu_load = whole[running.id]
    return _hold_targets(list(by_job.values()), capacity, moves)


def _hold_targets(
    running: list[RunningJob], capacity: dict[str, HostCapacity], moves: dict[int, Target]
) -> list[RunningJob]:
    """While an elastic job stops at its checkpoint to move to another host (`Job.resize_to`:
    for a job that needs its host, or to grow where more GPUs are idle), it holds the GPUs
    it restarts on there, as a part of it on that host, so that no job that came since takes
    them (it gives up its own: without them it would wait in the queue) and one that waits
    for them is told which job it waits for; the simulator holds them too (a resize there is
    a restart on the new GPUs at once, `simulate.Run.resize`). A growth on its own host holds
    nothing more: those were idle GPUs no one waited for, and a job that came since rightly
    takes them (the job restarts on its own and those still free)."""
    for job_id, target in moves.items():
        own = next(r for r in running if r.id == job_id)
        host = capacity.get(target.host)
        if host is None or own.job_gpu_load is not None:
            continue  # a host that is down (resizes are of jobs on one host)
        indices = tuple(sorted({i for i in target.gpus if 0 <= i < len(host.free)}))
        host.take(indices, own.fraction)
        running.append(
            replace(own, host=host.name, indices=indices, shrinking_for=None, moving=False, restarts_on=None)
        )
    return running


def _timestamp(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def read_fair_share(
    session: Session,
    usage: tuple[dict[str, float], dict[str | None, float]],
    default_limit: int | None,
    now: datetime,
) -> FairShare:
    """Users' and groups' usage (the ledger's), shares and limits; and each group with a
    GPU-hour quota, its GPU hours in the last `QUOTA_WINDOW`."""
    users = session.execute(select(User.name, User.share, User.gpu_limit)).all()
    groups = session.execute(select(Group.name, Group.share, Group.max_gpus, Group.max_gpu_hours_week)).all()
    quotas = {g.name: g.max_gpu_hours_week for g in groups if g.max_gpu_hours_week is not None}
    return FairShare(
        usage=usage[0],
        shares={u.name: u.share for u in users},
        limits={u.name: float(u.gpu_limit) for u in users if u.gpu_limit is not None},
        default_limit=float(default_limit) if default_limit is not None else None,
        group_usage=usage[1],
        group_shares={g.name: g.share for g in groups},
        group_limits={g.name: g.max_gpus for g in groups if g.max_gpus is not None},
        group_hours={name: (used, quotas[name]) for name, used in group_gpu_hours(session, now, set(quotas)).items()},
    )


QUOTA_WINDOW = timedelta(days=7)
"""A group's GPU-hour quota counts the hours it held GPUs in any window this long (the last)."""


def group_gpu_hours(session: Session, now: datetime, groups: set[str] | None = None) -> dict[str, float]:
    """GPU hours each group's jobs held in the last QUOTA_WINDOW, running ones up to `now`
    (every group asked about has an entry; `None`: every group with any)."""
    if groups is not None and not groups:
        return {}
    since = now - QUOTA_WINDOW
    hours: dict[str, float] = dict.fromkeys(groups or (), 0.0)
    for held in holdings(session, since, now, groups):
        if held.group is not None:
            hours[held.group] = hours.get(held.group, 0.0) + held.hours_within(since, now, now)
    return hours


def free_room(session: Session, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], tuple[Gpu, float]]:
    """For each (host, GPU index) asked about that can take work now (host up, GPU present
    and not drained): the GPU row and its unallocated fraction."""
    if not wanted:
        return {}
    hosts = {h for h, _ in wanted}
    rows = session.execute(
        select(Gpu, Host.name)
        .join(Host, Gpu.host_id == Host.id)
        .where(Host.name.in_(hosts), Host.state == HostState.UP, Gpu.present.is_(True), Gpu.drained.is_(False))
    ).all()
    gpus = {(name, gpu.index): gpu for gpu, name in rows if (name, gpu.index) in wanted}
    used = dict(
        session.execute(
            select(Allocation.gpu_id, func.sum(Allocation.fraction))
            .where(Allocation.released_at.is_(None), Allocation.gpu_id.in_([g.id for g in gpus.values()]))
            .group_by(Allocation.gpu_id)
        ).all()
    )
    return {key: (gpu, 1.0 - float(used.get(gpu.id, 0.0))) for key, gpu in gpus.items()}


class LiveInputs(NamedTuple):
    queued: list[QueuedJob]
    cluster: Cluster
    fair_share: FairShare
    history: RunTimes
    arrivals: list[tuple[float, QueuedJob]]
    """The queued jobs held back by their begin alone, with their begin: the forecast's."""


def live_inputs(session: Session, half_life_s: float, default_limit: int | None, now: datetime) -> LiveInputs:
    """The policy's inputs as a pass would read them now, for a look from outside a pass
    (the fair-share view, a dry run): a fresh usage ledger, the owners' run-time estimates
    on every job, and the run times they came from. Jobs held back (their sweep, a hold,
    their begin) are left out, as the pass leaves them out; the jobs a resize stopped are on
    their new GPUs, and what resizes make room for is held, as the pass does before its
    policy (`settle.settle_resizes`)."""
    ledger = UsageLedger(half_life_s)
    usage = ledger.usage(session, now)
    everyone, _ = read_queued(session)
    held, never, begins = held_back(session, [q.id for q in everyone])
    queued = [q for q in everyone if q.id not in held and q.id not in never]
    arrivals = arriving(everyone, begins)
    cluster, _ = read_cluster(session, now)
    ledger.history.annotate([*queued, *(job for _, job in arrivals)], cluster.running)
    queued, _ = settle_resizes(queued, cluster, read_targets(session), now.timestamp())
    fair_share = read_fair_share(session, usage, default_limit, now)
    return LiveInputs(queued, cluster, fair_share, ledger.history, arrivals)


def arriving(queued: list[QueuedJob], begins: dict[int, datetime]) -> list[tuple[float, QueuedJob]]:
    """The jobs of `queued` held back by their begin alone (`holdbacks.HeldBack.begins`), as
    the forecast has them arrive: (their begin, the job)."""
    return [(begins[q.id].timestamp(), q) for q in queued if q.id in begins]
