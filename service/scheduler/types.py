"""What the scheduling policy sees and what it answers: plain data, no database, no clock.

Times are seconds (epoch in the service, trace time in the simulator). Fractions are of one
GPU: a job with `fraction` 0.5 on 2 GPUs holds half of each of them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.core.defaults import DEFAULT_AGING_S, DEFAULT_MAX_RESERVATIONS, DEFAULT_RESERVE_AFTER_S

INFINITY = math.inf
EPSILON = 1e-9


class Policy(enum.StrEnum):
    FIFO = "fifo"
    FIT_FIRST = "fit-first"
    TOWERQ = "towerq"


PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclass(slots=True)
class QueuedJob:
    id: int
    user: str
    priority: int
    """0 high, 1 normal, 2 low (`PRIORITY_RANK`)."""
    gpu_count: int
    """How many GPUs (a count; `JobSpec.gpus` and `gpu_ids` are lists of indices)."""
    fraction: float
    submitted: float
    host: str | None = None
    """The job must run on this host."""
    indices: tuple[int, ...] | None = None
    """The job must run on exactly these GPUs of `host`."""
    limit_s: float | None = None
    """Time limit or a trusted estimate of the run time; None when unknown."""
    estimate_s: float | None = None
    """A run time the job will very likely not exceed, from its owner's recent jobs (not a
    promise); None when unknown."""
    typical_s: float | None = None
    """Its owner's median run time lately; None when unknown."""
    served_gpu_s: float = 0.0
    """GPU-seconds its earlier attempts ran (0 for a job that never ran)."""
    group: str | None = None
    """The group it runs in (its share and quotas); None: none."""
    min_gpu_count: int | None = None
    """An elastic job (`service.scheduler.elastic`): it may start on as few GPUs as this, grow
    to `gpu_count` and shrink back; None: it runs on `gpu_count` GPUs or not at all."""
    hosts: frozenset[str] | None = None
    """The only hosts it may run on, where some may not (a notebook session in a lab where
    some workers run no sessions: `snapshot.read_queued`); None: any (or `host`)."""

    @property
    def elastic(self) -> bool:
        return self.min_gpu_count is not None and self.min_gpu_count < self.gpu_count

    def where(self, order: Sequence[str]) -> Sequence[str]:
        """The hosts of `order` it may run on: its own host, those of `hosts`, or all."""
        if self.host is not None:
            return [self.host]
        if self.hosts is None:
            return order
        return [host for host in order if host in self.hosts]

    @property
    def likely_run_s(self) -> float | None:
        """Its owner's median run time, never above its own time limit; None when unknown."""
        if self.typical_s is None or self.limit_s is None:
            return self.typical_s
        return min(self.typical_s, self.limit_s)

    @property
    def waiting_since(self) -> float:
        """Its submit time, moved on by the time its earlier attempts ran (its served
        GPU-seconds over its GPUs): when it would have been submitted had it waited all along.
        The starvation guard goes by it (`policy`): a job stopped by time slicing, queued
        again after a day's run, has not waited a day."""
        load = self.gpu_count * self.fraction
        return self.submitted + self.served_gpu_s / load if load > 0 else self.submitted

    def parts_on(self, slots: list[tuple[str, tuple[int, ...]]], now: float) -> list[RunningJob]:
        """This job started `now` on `slots`: a part per host, each with what is known of the
        job as queued; elastic on one host (a job over several hosts is not resized)."""
        whole = self.gpu_count * self.fraction if len(slots) > 1 else None
        elastic = self.elastic and len(slots) == 1
        return [
            RunningJob(
                id=self.id,
                user=self.user,
                priority=self.priority,
                host=host,
                indices=indices,
                fraction=self.fraction,
                started=now,
                limit_s=self.limit_s,
                estimate_s=self.estimate_s,
                typical_s=self.typical_s,
                served_gpu_s=self.served_gpu_s,
                group=self.group,
                job_gpu_load=whole,
                min_gpu_count=self.min_gpu_count if elastic else None,
                full_gpu_count=self.gpu_count if elastic else None,
                pinned=self.host is not None or self.hosts is not None,
            )
            for host, indices in slots
        ]


@dataclass(slots=True)
class RunningJob:
    id: int
    user: str
    priority: int
    host: str
    indices: tuple[int, ...]
    fraction: float
    started: float
    limit_s: float | None = None
    stopping: bool = False
    """Being stopped (cancel or preemption): its GPUs free up soon."""
    estimate_s: float | None = None
    """A likely run time from the owner's recent jobs; None when unknown."""
    typical_s: float | None = None
    """Its owner's median run time lately; None when unknown."""
    measured_end: float | None = None
    """When its last step will be trained at the pace the worker measured so far (the job's
    `expected_end_at`, its ETA); None until there is one."""
    served_gpu_s: float = 0.0
    """GPU-seconds its earlier attempts ran (not counting this one)."""
    group: str | None = None
    job_gpu_load: float | None = None
    """The whole job's GPU load, all its parts together, for a job over several hosts (each
    host's part is a `RunningJob` with the same id); None: this part is the whole job."""
    stoppable: bool = True
    """Preemption and time slicing may stop it: False for a command job that does not say it
    resumes (`"resumable": false`); only an admin or its owner stops that one."""
    min_gpu_count: int | None = None
    full_gpu_count: int | None = None
    """An elastic job's least and full size (`QueuedJob.min_gpu_count`); None: not elastic."""
    run_served_gpu_s: float | None = None
    """GPU-seconds the job had served when this run began: when it last left the queue (an
    elastic job's resize starts a new attempt but not a new run); None: `served_gpu_s`."""
    shrinking_for: int | None = None
    """Live: an elastic job stopping to restart on fewer GPUs (`Decision.shrink`), or on
    another host (`Decision.moved_for`), for this queued job, which waits for the GPUs it
    gives up; None: neither."""
    moving: bool = False
    """Live, with `shrinking_for`: it restarts on another host (a move), not on fewer GPUs."""
    restarts_on: tuple[str, tuple[int, ...]] | None = None
    """Live: a resized elastic job stopping at its checkpoint restarts on these GPUs of this
    host (its `Job.resize_to`), which the forecast replays; None: not being resized."""
    pinned: bool = False
    """It asked for its host (`QueuedJob.host`, a spec's `host`): a resize keeps it there."""

    @property
    def elastic(self) -> bool:
        return self.min_gpu_count is not None and self.full_gpu_count is not None

    def served(self, now: float) -> float:
        """GPU-seconds the whole job has run so far (all its hosts), earlier attempts included."""
        return self.served_gpu_s + self.whole_load * max(0.0, now - self.started)

    @property
    def end_unknown(self) -> bool:
        """Nothing tells when it ends: no time limit, no pace measured, no run times of its
        owner's (its likely end is a guess from how long it has run)."""
        return self.limit_s is None and self.measured_end is None and self.typical_s is None and self.estimate_s is None

    @property
    def end(self) -> float:
        """When it ends at the latest, if known."""
        return self.started + self.limit_s if self.limit_s is not None else INFINITY

    @property
    def gpu_load(self) -> float:
        """This part's GPUs (on `host`), by fraction."""
        return len(self.indices) * self.fraction

    @property
    def whole_load(self) -> float:
        """The whole job's GPUs on every host it runs on, by fraction."""
        return self.gpu_load if self.job_gpu_load is None else self.job_gpu_load


@dataclass(slots=True)
class HostCapacity:
    name: str
    free: list[float]
    """Free fraction of each GPU by index; a GPU that takes no new work (drained, absent)
    has 0 here and is listed in `unusable`."""
    unusable: frozenset[int] = frozenset()

    @property
    def size(self) -> int:
        return len(self.free) - len(self.unusable)

    def take(self, indices: tuple[int, ...], fraction: float) -> None:
        """`fraction` of each of these GPUs is taken (never below 0 free)."""
        for i in indices:
            if i < len(self.free):
                self.free[i] = max(0.0, self.free[i] - fraction)

    def give(self, indices: tuple[int, ...], fraction: float) -> None:
        """`fraction` of each of these GPUs is free again (never above 1; a GPU that takes
        no new work stays at 0)."""
        for i in indices:
            if i < len(self.free) and i not in self.unusable:
                self.free[i] = min(1.0, self.free[i] + fraction)


@dataclass(frozen=True, slots=True)
class LabReservation:
    """GPUs kept for `group` from `start` to `end`: in the window only its jobs take them;
    before it, another job takes one only if its time limit ends it by `start` (or, with
    preemption on, if it very likely ends by then: it is stopped at `start` if not)."""

    id: int
    group: str
    start: float
    end: float
    gpus: tuple[tuple[str, int], ...]


@dataclass(slots=True)
class Cluster:
    hosts: list[HostCapacity]
    running: list[RunningJob] = field(default_factory=list)
    reservations: list[LabReservation] = field(default_factory=list)
    held: list[tuple[int, str, tuple[int, ...]]] = field(default_factory=list)
    """Live: (queued job, host, GPUs) held for that job from the pass's start, which no other
    job takes: those a resize makes room for it on (`settle.hold_made_room`)."""


@dataclass(slots=True)
class FairShare:
    """Each user's decayed GPU-seconds (`usage`), share (default 1) and GPU limit; each
    group's decayed GPU-seconds, share (default 1), GPU limit, and GPU-hour quota with the
    hours it used in the quota's window."""

    usage: dict[str, float] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)
    default_limit: float | None = None
    group_usage: dict[str | None, float] = field(default_factory=dict)
    """Decayed GPU-seconds of each group's jobs (None: the jobs without a group)."""
    group_shares: dict[str, float] = field(default_factory=dict)
    group_limits: dict[str, float] = field(default_factory=dict)
    group_hours: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Group -> (GPU hours used in the window, the quota), for groups with an hour quota."""

    def share(self, user: str) -> float:
        return self.shares.get(user, 1.0)

    def limit(self, user: str) -> float | None:
        return self.limits.get(user, self.default_limit)

    def group_share(self, group: str | None) -> float:
        return self.group_shares.get(group, 1.0) if group is not None else 1.0


@dataclass(slots=True)
class PolicyConfig:
    policy: Policy = Policy.TOWERQ
    aging_s: float = DEFAULT_AGING_S
    """Waiting this long lifts a job by one priority class."""
    reserve_after_s: float = DEFAULT_RESERVE_AFTER_S
    """A gang job that cannot start after waiting this long gets a reservation."""
    max_reservations: int = DEFAULT_MAX_RESERVATIONS
    """How many jobs may hold reservations at once (each may idle GPUs while it waits)."""
    preemption: bool = False
    demote_after_gpu_s: float = 0.0
    """Time slicing (0: off): a job that has run this many GPU-seconds ranks a class lower,
    and fresh work may stop it to start (see `policy`)."""
    explain: bool = True
    """Give every waiting job its position and reason (the simulator turns it off)."""


class Wait(enum.StrEnum):
    """Why a queued job is not placed; `Reason.args` carries the details."""

    GPUS_BUSY = "gpus_busy"  # (host, indices, holder job ids, end): the GPUs the job named
    JOBS_HOLD = "jobs_hold"  # (host, gpus, fraction, holder job ids, end): a count that jobs hold
    NO_FIT = "no_fit"  # (gpus, fraction, reserved start or inf)
    HOST_DOWN = "host_down"  # (host,)
    NO_HOST = "no_host"  # (): none of the hosts it may run on (`QueuedJob.hosts`) is up
    GPU_UNUSABLE = "gpu_unusable"  # (host, indices)
    USER_LIMIT = "user_limit"  # (user, used, limit)
    GROUP_LIMIT = "group_limit"  # (group, used, limit)
    GROUP_HOURS = "group_hours"  # (group, used hours, quota hours)
    LAB_RESERVED = "lab_reserved"  # (host, indices, group, start, end, reservation id)
    BEHIND = "behind"  # (blocking job id,)
    RESERVED = "reserved"  # (host, indices, for job id, start)
    PREEMPTING = "preempting"  # (host, job ids)
    SLICING = "slicing"  # (host, job ids): time slicing stops long-served jobs for it
    SHRINKING = "shrinking"  # (host, job ids): elastic jobs stop to restart on fewer GPUs for it
    MOVING = "moving"  # (hosts, job ids): elastic jobs stop to restart on other hosts, freeing theirs for it


@dataclass(slots=True, frozen=True)
class Reason:
    kind: Wait
    args: tuple[Any, ...] = ()
    also: Reason | None = None
    """A second blocker that matters as much: a job kept from free GPUs by a reservation
    that would otherwise wait for another host's busy GPUs says both."""


@dataclass(slots=True)
class Placement:
    job_id: int
    slots: list[tuple[str, tuple[int, ...]]]
    """(host, GPU indices) pairs; one pair except for trace jobs bigger than a host."""
    preempts: tuple[int, ...] = ()

    @property
    def host(self) -> str:
        return self.slots[0][0]

    @property
    def indices(self) -> tuple[int, ...]:
        return self.slots[0][1]


@dataclass(slots=True)
class Pending:
    job_id: int
    position: int
    reason: Reason | None
    reserved_start: float | None = None


@dataclass(slots=True)
class Decision:
    placements: list[Placement] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    preempt: dict[int, int] = field(default_factory=dict)
    """Running job to stop -> the queued job it makes room for."""
    reclaim: dict[int, int] = field(default_factory=dict)
    """Running job to stop -> the reservation (id) whose window began on its GPUs (with
    preemption on: the job took them expecting to end in time, and has not)."""
    shrink: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Elastic running job -> the GPUs of its host it keeps: it gives up the others to a
    waiting job of this pass (`service.scheduler.elastic`), restarting on these from its
    checkpoint. Applied before the placements."""
    grow: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """Elastic running job -> the host and GPUs it runs on from now (its own and idle ones,
    or idle ones of another host), restarting on them from its checkpoint. Applied before the
    placements: a move (`moved_for`) frees its GPUs for one; a growth takes only GPUs that no
    placement of the pass takes."""
    moved_for: dict[int, int] = field(default_factory=dict)
    """Those of `grow` that move at their size to another host to free theirs for a queued
    job that needs whole hosts -> that job (`elastic.move_for`)."""
    sliced: set[int] = field(default_factory=set)
    """Those of `preempt` stopped because they had their time slice (the others: for a
    higher-priority job)."""
