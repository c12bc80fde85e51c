"""The mechanics every scheduling policy shares (`service.scheduler.policy` says the order
each considers jobs in): one pass's state (free GPUs, each user's and group's load, the
decision so far), placing a job on the tightest host where it fits and may run, saying why
one waits, backfill reservations for the jobs a policy makes `reservable`, and, for a
policy that stops jobs, asking `service.scheduler.victims` whom to stop.

- Reservations (EASY backfill): a reservable job that cannot start gets its GPUs held on the
  host(s) that will free up soonest; a held GPU then goes only to a job that ends before the
  reservation starts: known from its time limit, or very likely from its owner's recent run
  times.
- Preemption and time slicing (`service.scheduler.victims`): a job that cannot start may
  stop others (a `high` job `low` ones, where preemption is on; fresh work jobs that had
  their slice, where time slicing is on); their GPUs are held for it until they have
  checkpointed and gone back to the queue.
- Elastic jobs (`service.scheduler.elastic`): before anything is stopped for a job that does
  not fit, an elastic one may start on fewer GPUs, and any may shrink elastic jobs for room;
  after the pass, elastic jobs below their size may grow onto idle GPUs.
"""

from __future__ import annotations

import enum
import operator
from collections import defaultdict
from dataclasses import replace

from service.scheduler import elastic, victims
from service.scheduler.capacity import FreeGpus, ends_if_started
from service.scheduler.outlook import Slots
from service.scheduler.ranking import FairShareTerms
from service.scheduler.types import (
    EPSILON,
    INFINITY,
    Cluster,
    Decision,
    FairShare,
    LabReservation,
    Pending,
    Placement,
    PolicyConfig,
    QueuedJob,
    Reason,
    RunningJob,
    Wait,
)

SHAPE = operator.attrgetter(
    "user",
    "group",
    "priority",
    "gpu_count",
    "min_gpu_count",
    "fraction",
    "host",
    "hosts",
    "indices",
    "limit_s",
    "estimate_s",
    "typical_s",
    "served_gpu_s",
)
"""Everything `Pass.consider` reads of a queued job but its id (a job the pass singles out by
id is considered in full) and its submit time (which only ranks it): two jobs of one shape
meet the same outcome in the same state of the pass."""


class Outcome(enum.Enum):
    """What considering a job came to."""

    PLACED = "placed"
    HELD = "held"
    """It may not run now, wherever there is room (a host down, a limit, a group's quota)."""
    NO_ROOM = "no room"
    """It may run, and waits for room (which a policy that stops jobs may be making)."""


class Pass:
    """One scheduling pass's state and the mechanics on it; a policy calls `consider` on the
    jobs in its order (`service.scheduler.policy`)."""

    def __init__(
        self,
        queued: list[QueuedJob],
        cluster: Cluster,
        fair_share: FairShare,
        now: float,
        config: PolicyConfig,
        stops_jobs: bool = False,
    ) -> None:
        self.queued = queued
        self.cluster = cluster
        self.fair_share = fair_share
        self.now = now
        self.config = config
        self.free = FreeGpus(cluster, now, lend_likely=config.preemption)
        self.decision = Decision()
        self.position = 0
        self.reservations = 0
        self.load: dict[str, float] = defaultdict(float)
        self.group_load: dict[str, float] = defaultdict(float)
        for running in cluster.running:
            self.load[running.user] += running.gpu_load
            if running.group is not None:
                self.group_load[running.group] += running.gpu_load
        self.reservable: set[int] = set()
        """Jobs the policy lets take a reservation in this pass (`may_reserve`)."""
        self._reasons: dict[tuple[object, ...], Reason] = {}
        self.no_victims: dict[tuple[object, ...], float] = {}
        """A shape that found no victims, with the shortest fresh run it looked for (a longer
        one, that needs victims with more left, finds none either)."""
        self.terms: FairShareTerms | None = None
        """The fair-share terms, where the policy ranks by them (who is above their share)."""
        self.base_ranks: dict[int, float] = {}
        """Each queued job's rank before fair share, by id, where the policy ranks by it
        (`ranking.base_rank`: fixed for the pass)."""
        self.stops_jobs = stops_jobs and (config.preemption or config.demote_after_gpu_s > 0)
        """Preemption or time slicing may stop running jobs in this pass."""
        self.sliceable = (
            {r.id: r.served(now) for r in cluster.running if victims.may_slice(r, now, config.demote_after_gpu_s)}
            if config.demote_after_gpu_s > 0
            else {}
        )
        """Time slicing: the running jobs fresh work may still stop, and what each has served."""
        self.eldest_gang: int | None = None
        """The eldest queued job when it needs a whole host: it may slice (towerq's rule)."""
        self.has_elastic = any(r.elastic for r in cluster.running)
        """Some running job is elastic: a waiting job may shrink it, and it may grow."""
        self.shrinking: dict[int, list[RunningJob]] = {}
        """Live: queued job -> the elastic jobs stopping to shrink for it (it waits for them)."""
        for running in cluster.running:
            if running.shrinking_for is not None and running.stopping:
                self.shrinking.setdefault(running.shrinking_for, []).append(running)
        self._settled: dict[tuple[object, ...], tuple[int, Outcome, Reason]] = {}
        """`consider`'s memo: a job shape -> `FreeGpus.version` when a job of it was last
        considered in full, what that came to, and why it waits."""
        self._last_reason = Reason(Wait.NO_FIT)
        """The reason `_wait` last recorded."""
        self.no_shrink: set[tuple[object, ...]] = set()
        """Shapes of jobs (`elastic._shape`) that found no elastic job to shrink for them, or
        (tagged "move") no host that moves could free (later in the pass there are fewer such
        jobs, each holding no more, and fewer idle GPUs)."""

    def reclaim_reserved(self) -> None:
        """A window has begun on GPUs that another group's job still holds: with preemption
        on it was lent them expecting to end in time, and is stopped (it checkpoints and
        queues again). Without preemption none was lent them, and those already running
        when the reservation was made run on to their end."""
        for kept in self.cluster.reservations:
            if not kept.start <= self.now < kept.end:
                continue
            gpus = set(kept.gpus)
            for running in self.cluster.running:
                if running.group == kept.group or self.stopping(running):
                    continue
                if any((running.host, i) in gpus for i in running.indices):
                    self.decision.reclaim[running.id] = kept.id

    # -- one job ----------------------------------------------------------------------------

    def consider(self, job: QueuedJob) -> Outcome:
        """Place `job` if it may and can; else record why it waits (making room for it, by
        preemption or slicing, where the policy stops jobs; reserving GPUs for it, where it
        may take a reservation).

        Once no GPU is free, most of a long queue meets what a job of its shape met before
        it: while the pass has changed nothing since, a job of the same `SHAPE`
        comes to the same outcome for the same reason, and takes it from `_settled` (the
        Philly sample's 5,000 queued jobs, of 33 shapes: about a hundred considered in full).
        Jobs the pass singles out by id (taking a reservation, the eldest whole-host gang,
        one that elastic jobs shrink for) are always considered in full. Whatever a
        consideration changes (a placement, a stop, a resize, a reservation) goes through
        `FreeGpus` (take, give, hold), whose `version` it raises: the memo holds while the
        version does."""
        self.position += 1
        if self.free.any_free or job.id in self.reservable or job.id in self.shrinking or job.id == self.eldest_gang:
            return self._consider(job)
        shape, before = SHAPE(job), self.free.version
        settled = self._settled.get(shape)
        if settled is not None and settled[0] == before:
            self._wait(job, settled[2])
            return settled[1]
        outcome = self._consider(job)
        if self.free.version == before:
            self._settled[shape] = (before, outcome, self._last_reason)
        return outcome

    def _consider(self, job: QueuedJob) -> Outcome:
        reason = self.cannot_run(job)
        if reason is not None:
            self._wait(job, reason)
            return Outcome.HELD
        slots = self.free.fit(job, ends_if_started(job, self.now)) if self.free.any_free else None
        if slots is not None:
            self.place(job, slots)
            return Outcome.PLACED
        if job.id in self.shrinking:  # the GPUs are on their way: nothing else is stopped for it
            shrinking = self.shrinking[job.id]
            ids = tuple(r.id for r in shrinking)
            if any(r.moving for r in shrinking):
                hosts = " + ".join(dict.fromkeys(r.host for r in shrinking))
                self._wait(job, Reason(Wait.MOVING, (hosts, ids)))
            else:
                self._wait(job, Reason(Wait.SHRINKING, (shrinking[0].host, ids)))
            return Outcome.NO_ROOM
        if elastic.start_small(self, job) or (
            self.has_elastic and (elastic.shrink_for(self, job) or elastic.move_for(self, job))
        ):
            return Outcome.PLACED
        reason = victims.make_room(self, job)
        starving = self.may_reserve(job) and reason.kind not in (Wait.PREEMPTING, Wait.SLICING)
        reserved = self.reserve(job) if starving else None
        self._wait(job, reason, reserved)
        return Outcome.NO_ROOM

    def behind(self, job: QueuedJob, blocker: QueuedJob) -> None:
        """`job` waits behind `blocker` (a strict order lets nothing pass it)."""
        self.position += 1
        self._wait(job, Reason(Wait.BEHIND, (blocker.id,)))

    def cannot_run(self, job: QueuedJob) -> Reason | None:
        if job.host is not None and job.host not in self.free.hosts:
            return Reason(Wait.HOST_DOWN, (job.host,))
        if job.hosts is not None and not any(host in self.free.hosts for host in job.hosts):
            return Reason(Wait.NO_HOST)
        if job.indices is not None and job.host is not None:
            unusable = self.free.hosts[job.host].unusable
            size = len(self.free.free[job.host])
            bad = tuple(i for i in job.indices if i in unusable or i >= size)
            if bad:
                return Reason(Wait.GPU_UNUSABLE, (job.host, bad))
        limit = self.fair_share.limit(job.user)
        if limit is not None and self.load[job.user] + job.gpu_count * job.fraction > limit + EPSILON:
            return Reason(Wait.USER_LIMIT, (job.user, self.load[job.user], limit))
        if job.group is not None:
            hours = self.fair_share.group_hours.get(job.group)
            if hours is not None and hours[0] >= hours[1]:
                return Reason(Wait.GROUP_HOURS, (job.group, *hours))
            cap = self.fair_share.group_limits.get(job.group)
            used = self.group_load[job.group]
            if cap is not None and used + job.gpu_count * job.fraction > cap + EPSILON:
                return Reason(Wait.GROUP_LIMIT, (job.group, used, cap))
        return None

    def place(self, job: QueuedJob, slots: Slots) -> None:
        self.free.take(slots, job.fraction)
        self.load[job.user] += job.gpu_count * job.fraction
        if job.group is not None:
            self.group_load[job.group] += job.gpu_count * job.fraction
        self.decision.placements.append(Placement(job.id, slots))
        self.position -= 1

    def unload(self, running: RunningJob, gpus: int) -> None:
        """`running` holds `gpus` fewer GPUs from now in this pass (an elastic job's resize;
        negative: more)."""
        self.load[running.user] -= gpus * running.fraction
        if running.group is not None:
            self.group_load[running.group] -= gpus * running.fraction

    def _wait(self, job: QueuedJob, reason: Reason, reserved: float | None = None) -> None:
        self._last_reason = reason
        if self.config.explain:
            self.decision.pending.append(Pending(job.id, self.position, reason, reserved))

    # -- starvation guard -------------------------------------------------------------------

    @property
    def whole_host(self) -> int:
        """A job of this many GPUs or more needs a whole host (or several)."""
        return max(2, self.free.largest)

    def may_reserve(self, job: QueuedJob) -> bool:
        """The job may take a reservation now: one the policy made `reservable` (towerq's
        starving gangs by age), while reservations are left."""
        return job.id in self.reservable and self.reservations < self.config.max_reservations

    def reserve(self, job: QueuedJob) -> float | None:
        found = self.free.outlook.earliest(job, self.now, skip_held=True)
        if found is None or found[1] == INFINITY:
            return None
        known, expected, slots = found
        self.free.hold(job.id, slots, known, expected)
        self.reservations += 1
        return known

    # -- preemption -------------------------------------------------------------------------

    @property
    def may_preempt(self) -> bool:
        """Whether a job considered from here on might still stop a running one."""
        return self.config.preemption or bool(self.sliceable)

    def stopping(self, running: RunningJob) -> bool:
        return running.stopping or running.id in self.decision.preempt or running.id in self.decision.reclaim

    def resized(self, running: RunningJob) -> bool:
        """An elastic job this pass shrinks, grows or moves: it is not also stopped in it
        (live, the stop would win and the resize be lost; the job it shrank for or was moved
        for would wait for GPUs that the stop gives to the queue)."""
        return running.id in self.decision.shrink or running.id in self.decision.grow

    # -- why it waits -----------------------------------------------------------------------

    def why_no_fit(self, job: QueuedJob) -> Reason:
        if not self.config.explain:
            return Reason(Wait.NO_FIT)
        shape = (job.gpu_count, job.fraction, job.host, job.hosts, job.indices, self.free.version)
        reason = self._reasons.get(shape)
        if reason is None:
            reason = self._reasons[shape] = self._explain_no_fit(job)
        return reason

    def _explain_no_fit(self, job: QueuedJob) -> Reason:
        if self.free.kept:
            reserved = self._kept_from(job)
            if reserved is not None:  # free GPUs a reservation keeps; and where it could go instead
                other = self._busy_elsewhere(job)
                return reserved if other.kind == Wait.LAB_RESERVED else replace(reserved, also=other)
        return self._busy_elsewhere(job)

    def _busy_elsewhere(self, job: QueuedJob) -> Reason:
        """Why `job` waits on the GPUs it most likely could have soonest, reservations
        honoured: those its expected start waits for, unless jobs ahead take them first."""
        found = self.free.outlook.likeliest(job, self.now)
        if found is None:
            return Reason(Wait.NO_FIT, (job.gpu_count, job.fraction, INFINITY))
        likely, slots = found
        host, indices = slots[0]
        kept = self.free.kept_from(host, indices, job.group) if self.free.kept else None
        if kept is not None:  # the soonest it could start is on GPUs kept for a group, after its window
            return _lab_reserved(host, indices, kept)
        holds = self.free.holds.get(host, {})
        held_by = sorted({holds[i].job_id for i in indices if i in holds and holds[i].job_id != job.id})
        if held_by:
            start = min(holds[i].start for i in indices if i in holds and holds[i].job_id == held_by[0])
            return Reason(Wait.RESERVED, (host, indices, held_by[0], start))
        on = [r for r in self.free.running_on[host] if set(r.indices) & set(indices)]
        holders = tuple(sorted({r.id for r in on}))
        if any(r.end_unknown for r in on):  # its end would be a guess: the job is named, no end
            likely = INFINITY
        if job.indices is not None:
            return Reason(Wait.GPUS_BUSY, (host, indices, holders, likely))
        if holders:  # the earliest GPUs are a forecast: the job takes whichever free up, so none is named
            return Reason(Wait.JOBS_HOLD, (host, job.gpu_count, job.fraction, holders, likely))
        return Reason(Wait.NO_FIT, (job.gpu_count, job.fraction, likely))

    def _kept_from(self, job: QueuedJob) -> Reason | None:
        """`LAB_RESERVED` when the job would fit now but for GPUs kept for another group."""
        self.free.ignore_kept = True
        try:
            slots = self.free.fit(job, ends_if_started(job, self.now))
        finally:
            self.free.ignore_kept = False
        if slots is None:
            return None
        for host, indices in slots:
            kept = self.free.kept_from(host, indices, job.group)
            if kept is not None:
                return _lab_reserved(host, indices, kept)
        return None


def _lab_reserved(host: str, indices: tuple[int, ...], kept: LabReservation) -> Reason:
    """The wait for these GPUs of `host`, some of which `kept` keeps (named)."""
    gpus = set(kept.gpus)
    return Reason(
        Wait.LAB_RESERVED,
        (host, tuple(i for i in indices if (host, i) in gpus), kept.group, kept.start, kept.end, kept.id),
    )
