"""The scheduling policy: a pure function from (queue, free capacity, usage, now) to
placements. The live scheduler and the trace simulator call the same `schedule`.

Policies:

- `fifo`: strict submit order; nothing passes a blocked job.
- `fit-first`: submit order, start anything that fits, no reservations (big jobs starve).
- `towerq`, the real one:

  * Rank. A job's rank is its priority class (high 0, normal 1, low 2), minus one class
    for every `aging_s` it has waited, plus a size term, plus its owner's fair-share term
    in [0, 1). The size term is 0.3 per doubling of the job's GPU count while it is fresh,
    fading to 0 over `reserve_after_s`: among new work, small gangs go first (they fit
    into the holes other jobs leave, so more work starts sooner), and by the time a gang
    job may claim a reservation its size no longer counts against it. The fair-share term is
    `1 - 2**-(used part / owed part)`, where the used part is the owner's decayed
    GPU-seconds plus what their running jobs will likely still use, over all present
    users', and the owed part their share among present users. A user who used nothing
    lately gets 0, one who used exactly their share 1/2. A job started in the pass adds
    its expected use to its owner at once, so users interleave within a pass. A length
    term puts short work first, which lowers the mean completion time: `LIMIT_CLASS` per
    doubling of the job's own time limit away from an hour (a job without one counts as
    the longest), plus `LENGTH_CLASS` per doubling of its owner's median run time (never
    above its limit).
  * Jobs start in rank order wherever they fit, on the tightest host (best fit keeps
    whole hosts free for big jobs).
  * Starvation guard. A job on one GPU can take any GPU that frees up, so its wait is
    only a matter of rank, which aging settles. A gang job (2+ GPUs) can also starve by
    fragmentation: small jobs fill every GPU that frees up. So a gang job that cannot
    start after waiting `reserve_after_s`, taken by age (the longest waiting first: not by
    rank, so a heavy user's gang backlog cannot be kept behind everyone for ever), up to
    `max_reservations` of them, gets its GPUs reserved on the host(s) that will free up
    soonest (EASY backfill); the oldest of them is also considered before any other job.
    A job's age is the time it has waited, all its spells in the queue (`waiting_since`):
    the time it ran before a stop does not count, or a gang stopped by time slicing after
    a day's run would take a reservation at once and undo its slice.
    A reserved GPU then goes only to a job that ends before the reservation starts:
    known from its time limit, or very likely from its owner's recent run times.
  * Preemption (optional): a `high` job that cannot start stops `low` jobs (the youngest
    first, so the least work is redone) on the host where that frees room soonest; their
    GPUs are held for it until they have checkpointed and gone back to the queue.
  * Time slicing (`demote_after_gpu_s` > 0; the service's `time_slice_gpu_s`): least
    attained service in several levels, as Tiresias (NSDI '19) does for GPU clusters
    where run times are unknown and heavy-tailed. A job that has run `demote_after_gpu_s`
    GPU-seconds (all attempts) ranks `DEMOTED_CLASS` lower, and `SERVED_CLASS` lower per
    doubling of its GPU time past that unless it needs a whole host (`ranking`); a fresh
    job that cannot start may stop such jobs of its priority or lower, the most served first; they
    checkpoint and queue again. So short work never waits behind long work, and long
    work is found out by running rather than guessed from its owner's history. An attempt
    is never stopped before it has run `MIN_RUN_S` and as long as all the job's earlier
    attempts together, so slices double and a job is stopped at most about log2(its run
    time / the threshold) times.
  * Whole-host gangs under time slicing. A job that needs a whole host (as many GPUs as
    the largest) waits until every GPU of one host is free at once, and with slicing on,
    fresh and smaller work takes each GPU that frees up first, and may stop the gang
    itself once it has had its slice: such a job can wait far longer than it would in
    plain submit order. So when the eldest job of the best priority class in the queue (by
    age, as above) is one, it is considered before any other, and if it does not fit it
    may stop jobs past their slice (anyone's, when the stop pays), as fresh work does. One
    job per pass, the eldest, so gangs take hosts in the order they have waited and never
    stop each other in turn.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

from service.scheduler.capacity import FreeGpus, Slots, ends_if_started, expected_end
from service.scheduler.ranking import FairShareTerms, base_rank, rank_order
from service.scheduler.types import (
    EPSILON,
    INFINITY,
    PRIORITY_RANK,
    Cluster,
    Decision,
    FairShare,
    LabReservation,
    Pending,
    Placement,
    Policy,
    PolicyConfig,
    QueuedJob,
    Reason,
    RunningJob,
    Wait,
)

HIGH = PRIORITY_RANK["high"]
LOW = PRIORITY_RANK["low"]


def schedule(
    queued: Iterable[QueuedJob],
    cluster: Cluster,
    fair_share: FairShare,
    now: float,
    config: PolicyConfig,
) -> Decision:
    """Decide which queued jobs start now, where, and why the others wait."""
    return _Pass(list(queued), cluster, fair_share, now, config).run()


class _Pass:
    def __init__(
        self, queued: list[QueuedJob], cluster: Cluster, fair_share: FairShare, now: float, config: PolicyConfig
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
        self.blocker: QueuedJob | None = None
        self.reservable: set[int] = set()
        self._reasons: dict[tuple[object, ...], Reason] = {}
        self._no_victims: dict[tuple[object, ...], float] = {}
        """A shape that found no victims, with the shortest fresh run it looked for (a longer
        one, that needs victims with more left, finds none either)."""
        self.terms: FairShareTerms | None = None
        self._stops_jobs = config.policy == Policy.TOWERQ and (config.preemption or config.demote_after_gpu_s > 0)
        """Preemption or time slicing may stop running jobs in this pass."""
        self._sliceable = (
            {r.id: r.served(now) for r in cluster.running if self._may_slice(r)}
            if config.demote_after_gpu_s > 0
            else {}
        )
        """Time slicing: the running jobs fresh work may still stop, and what each has served."""
        self.eldest_gang: int | None = None
        """The eldest queued job when it needs a whole host: it may slice (`_eldest_whole_host_gang`)."""

    def run(self) -> Decision:
        if self.config.preemption:
            self._reclaim_reserved()
        if self.config.policy == Policy.TOWERQ:
            terms = FairShareTerms(self.fair_share, self.cluster.running, self.queued, self.now)
            self.terms = terms
            seen: set[int] = set()
            # Starving gang jobs take reservations by age, not rank, and the eldest goes
            # first: a gang job's wait is bounded by the gang jobs older than it, however
            # many others outrank it (a heavy user's backlog included).
            starving = self._starving_by_age()[: self.config.max_reservations]
            self.reservable = {j.id for j in starving}
            if starving:
                seen.add(starving[0].id)
                if self._consider(starving[0]):
                    terms.started(starving[0])
            eldest = self._eldest_whole_host_gang()
            if eldest is not None and eldest.id not in seen:
                seen.add(eldest.id)
                if self._consider(eldest):
                    terms.started(eldest)
            for job in rank_order(self.queued, terms, self.now, self.config, self._whole_host):
                if job.id in seen:
                    continue
                seen.add(job.id)
                if self._consider(job):
                    terms.started(job)
                elif not self.free.any_free:
                    # Nothing more starts in this pass, so no user's term changes: the rest
                    # of the rank order is one plain sort.
                    rest = [j for j in self.queued if j.id not in seen]
                    if not self.config.explain and not self._may_preempt:
                        self._reserve_for_rest(rest, terms)
                        break
                    ordered = sorted(rest, key=lambda j: self._rank_key(j, terms))
                    for k, waiting in enumerate(ordered):
                        if not self.config.explain and not self._may_preempt:
                            self._reserve_for_rest(ordered[k:], terms)  # no victim left
                            break
                        self._consider(waiting)
                    break
        else:
            strict = self.config.policy == Policy.FIFO
            for job in sorted(self.queued, key=lambda j: (j.submitted, j.id)):
                done = (strict and self.blocker is not None) or not self.free.any_free
                if done and not self.config.explain:
                    break  # nothing more can start; reasons are not wanted
                self._consider(job, strict=strict)
        return self.decision

    def _reclaim_reserved(self) -> None:
        """A window has begun on GPUs that another group's job still holds: with preemption
        on it was lent them expecting to end in time, and is stopped (it checkpoints and
        queues again). Without preemption none was lent them, and those already running
        when the reservation was made run on to their end."""
        for kept in self.cluster.reservations:
            if not kept.start <= self.now < kept.end:
                continue
            gpus = set(kept.gpus)
            for running in self.cluster.running:
                if running.group == kept.group or self._stopping(running):
                    continue
                if any((running.host, i) in gpus for i in running.indices):
                    self.decision.reclaim[running.id] = kept.id

    # -- one job ----------------------------------------------------------------------------

    def _consider(self, job: QueuedJob, strict: bool = False) -> bool:
        """Place `job` if it may and can; else record why it waits. True when placed."""
        self.position += 1
        if strict and self.blocker is not None:
            self._wait(job, Reason(Wait.BEHIND, (self.blocker.id,)))
            return False
        reason = self._cannot_run(job)
        if reason is not None:
            self._wait(job, reason)
            return False
        slots = self.free.fit(job, ends_if_started(job, self.now)) if self.free.any_free else None
        if slots is not None:
            self._place(job, slots)
            return True
        if strict:
            self.blocker = job
        reason = self._make_room(job)
        starving = self._starving_gang(job) and reason.kind not in (Wait.PREEMPTING, Wait.SLICING)
        reserved = self._reserve(job) if starving else None
        self._wait(job, reason, reserved)
        return False

    def _cannot_run(self, job: QueuedJob) -> Reason | None:
        if job.host is not None and job.host not in self.free.hosts:
            return Reason(Wait.HOST_DOWN, (job.host,))
        if job.indices is not None and job.host is not None:
            unusable = self.free.hosts[job.host].unusable
            size = len(self.free.free[job.host])
            bad = tuple(i for i in job.indices if i in unusable or i >= size)
            if bad:
                return Reason(Wait.GPU_UNUSABLE, (job.host, bad))
        limit = self.fair_share.limit(job.user)
        if limit is not None and self.load[job.user] + job.gpus * job.fraction > limit + EPSILON:
            return Reason(Wait.USER_LIMIT, (job.user, self.load[job.user], limit))
        if job.group is not None:
            hours = self.fair_share.group_hours.get(job.group)
            if hours is not None and hours[0] >= hours[1]:
                return Reason(Wait.GROUP_HOURS, (job.group, *hours))
            cap = self.fair_share.group_limits.get(job.group)
            used = self.group_load[job.group]
            if cap is not None and used + job.gpus * job.fraction > cap + EPSILON:
                return Reason(Wait.GROUP_LIMIT, (job.group, used, cap))
        return None

    def _place(self, job: QueuedJob, slots: Slots) -> None:
        self.free.take(slots, job.fraction)
        self.load[job.user] += job.gpus * job.fraction
        if job.group is not None:
            self.group_load[job.group] += job.gpus * job.fraction
        self.decision.placements.append(Placement(job.id, slots))
        self.position -= 1

    def _wait(self, job: QueuedJob, reason: Reason, reserved: float | None = None) -> None:
        if self.config.explain:
            self.decision.pending.append(Pending(job.id, self.position, reason, reserved))

    # -- starvation guard -------------------------------------------------------------------

    def _starving_by_age(self) -> list[QueuedJob]:
        """Gang jobs that have waited `reserve_after_s` (`QueuedJob.waiting_since`) and may
        run, the longest waiting first."""
        starving = [
            j
            for j in self.queued
            if j.gpus > 1 and self.now - j.waiting_since >= self.config.reserve_after_s and self._cannot_run(j) is None
        ]
        return sorted(starving, key=lambda j: (j.waiting_since, j.id))

    @property
    def _whole_host(self) -> int:
        """A job of this many GPUs or more needs a whole host (or several)."""
        return max(2, self.free.largest)

    def _eldest_whole_host_gang(self) -> QueuedJob | None:
        """(Time slicing on.) The eldest job (`waiting_since`) of the best priority class in
        the queue, if it needs a whole host and may run; it goes first, and may slice
        (`Whole-host gangs` above)."""
        if self.config.demote_after_gpu_s <= 0 or not self.queued:
            return None
        eldest = min(self.queued, key=lambda j: (j.priority, j.waiting_since, j.id))
        if eldest.gpus < self._whole_host or self._cannot_run(eldest) is not None:
            return None
        self.eldest_gang = eldest.id
        return eldest

    def _starving_gang(self, job: QueuedJob) -> bool:
        """The job may take a reservation now: one of the pass's starving gangs by age
        (`reservable`, from `_starving_by_age`), while reservations are left."""
        return (
            self.config.policy == Policy.TOWERQ
            and job.id in self.reservable
            and self.reservations < self.config.max_reservations
        )

    def _reserve(self, job: QueuedJob) -> float | None:
        found = self.free.earliest(job, self.now, skip_held=True)
        if found is None or found[1] == INFINITY:
            return None
        known, expected, slots = found
        self.free.hold(job.id, slots, known, expected)
        self.reservations += 1
        return known

    def _rank_key(self, job: QueuedJob, terms: FairShareTerms) -> tuple[float, float, int]:
        rank = base_rank(job, self.now, self.config, self._whole_host)
        return (rank + terms.term(job.user, job.group), job.submitted, job.id)

    def _reserve_for_rest(self, rest: list[QueuedJob], terms: FairShareTerms) -> None:
        """Nothing else can start in this pass, so the rank order no longer changes and the
        only work left is reservations, for the first starving gang jobs in that order. (A
        shortcut for the simulator, which wants no reasons: the outcome is the same. Not with
        preemption on: a later high-priority job may still stop others to make room.)"""
        candidates = [j for j in rest if self._starving_gang(j) and self._cannot_run(j) is None]
        candidates.sort(key=lambda j: self._rank_key(j, terms))
        for candidate in candidates:
            if self.reservations >= self.config.max_reservations:
                return
            self._reserve(candidate)

    # -- preemption -------------------------------------------------------------------------

    @property
    def _may_preempt(self) -> bool:
        """Whether a job considered from here on might still stop a running one."""
        return self.config.preemption or bool(self._sliceable)

    def _may_slice(self, running: RunningJob) -> bool:
        """(Time slicing on.) The job is not stopping, it has had its first
        `demote_after_gpu_s`, and this attempt has run at least MIN_RUN_S and as long as
        all its earlier attempts together."""
        if not running.stoppable or running.stopping:
            return False
        return self.now >= sliceable_from(running, self.config.demote_after_gpu_s)

    def _make_room(self, job: QueuedJob) -> Reason:
        if not self._stops_jobs:
            return self._why_no_fit(job)
        choice, kind = None, Wait.PREEMPTING
        if self.config.preemption and job.priority == HIGH:
            choice = self._victims(job, lambda r: r.priority == LOW and r.stoppable, lambda r: -r.started)
        eldest = job.id == self.eldest_gang
        fresh = job.served_gpu_s < self.config.demote_after_gpu_s
        if choice is None and 0 < self.config.demote_after_gpu_s and (fresh or eldest):
            choice, kind = self._slice_victims(job, eldest), Wait.SLICING
        if choice is None:
            return self._why_no_fit(job)
        slots, victims = choice
        for victim in victims:
            if not self._stopping(victim):
                self.decision.preempt[victim.id] = job.id
                if kind == Wait.SLICING:
                    self.decision.sliced.add(victim.id)
                self._sliceable.pop(victim.id, None)
        if kind == Wait.SLICING and len(self.decision.sliced) >= MAX_SLICES_PER_PASS:
            self._sliceable.clear()  # the rest next pass
        self.free.hold(job.id, slots, self.now, self.now)
        hosts = " + ".join(host for host, _ in slots)
        return Reason(kind, (hosts, tuple(dict.fromkeys(v.id for v in victims))))

    def _slice_victims(self, job: QueuedJob, eldest: bool = False) -> tuple[Slots, list[RunningJob]] | None:
        """Time slicing: running jobs of the same or a lower priority that `_may_slice`,
        the most served first; a user above their share (their part of the present users'
        use is over their part of the shares) stops only their own jobs, except for the
        eldest whole-host job (`eldest`, `_eldest_whole_host_gang`). A stop must pay:
        when the fresh work's run time is known (`_fresh_run_s`), the job stopped must be
        expected to run on (`expected_end`, cautious) for longer than that plus what the stop
        costs it (`STOP_COST_S`), else the fresh job waits as it would without slicing
        (shortest remaining work first: stopping a job for one as long gains nobody). Within a pass,
        victims only get fewer and free GPUs scarcer, so a shape that found none finds none
        later in the pass either."""
        terms = self.terms
        above_share = terms is not None and terms.used_part(job.user, job.group) > terms.owed(job.user, job.group)
        own_only = above_share and not eldest
        fresh_run = self._fresh_run_s(job)
        shape = (job.gpus, job.fraction, job.host, job.indices, job.priority, job.user if own_only else None)
        if not self._sliceable or fresh_run >= self._no_victims.get(shape, INFINITY):
            return None
        served = self._sliceable

        def may_stop(running: RunningJob) -> bool:
            mine = running.user == job.user or not own_only
            if not (running.id in served and running.priority >= job.priority and mine):
                return False
            return not fresh_run or expected_end(running, self.now) - self.now >= fresh_run + STOP_COST_S

        choice = self._victims(job, may_stop, lambda r: -served[r.id])
        if choice is None:
            self._no_victims[shape] = min(fresh_run, self._no_victims.get(shape, INFINITY))
        return choice

    def _fresh_run_s(self, job: QueuedJob) -> float:
        """How long fresh work stopping a served job is known to hold its GPUs: its owner's
        median run time (at most its limit), else its limit; 0 when nothing is known (as
        Tiresias does, time slicing then finds out by running it: it can be stopped in turn
        once it has had its slice)."""
        for known in (job.likely_run_s, job.limit_s):
            if known is not None:
                return known
        return 0.0

    def _victims(
        self, job: QueuedJob, may_stop: Callable[[RunningJob], bool], order: Callable[[RunningJob], float]
    ) -> tuple[Slots, list[RunningJob]] | None:
        """The host where stopping the fewest running jobs that `may_stop` (in `order`)
        makes room; jobs already stopping count as gone. A job larger than any host takes
        whole hosts (`_victims_whole_hosts`)."""
        if job.gpus > self.free.largest:
            return self._victims_whole_hosts(job, may_stop)
        best: tuple[int, str, tuple[int, ...], list[RunningJob]] | None = None
        hosts = [job.host] if job.host is not None else self.free.order
        for host in hosts:
            if host not in self.free.hosts:
                continue
            running = self.free.running_on[host]
            freed = [r for r in running if self._stopping(r)]
            candidates = sorted((r for r in running if may_stop(r) and not self._stopping(r)), key=order)
            indices = self.free.would_fit_if_freed(job, host, freed)
            for victim in candidates:
                if indices is not None:
                    break
                freed.append(victim)
                indices = self.free.would_fit_if_freed(job, host, freed)
            if indices is None:
                continue
            fresh = sum(1 for r in freed if not self._stopping(r))
            if best is None or fresh < best[0]:
                best = (fresh, host, indices, freed)
        return ([(best[1], best[2])], best[3]) if best else None

    def _victims_whole_hosts(
        self, job: QueuedJob, may_stop: Callable[[RunningJob], bool]
    ) -> tuple[Slots, list[RunningJob]] | None:
        """For a job larger than any host: the whole hosts (as `FreeGpus.fit` places it)
        where stopping the fewest running jobs makes room. A host is a candidate only if
        every job on it that is not already stopping `may_stop`; one part of a job over
        several hosts frees its other hosts too (a job stops on all of them)."""
        size = self.free.largest
        part = replace(job, gpus=size, host=None, indices=None)
        candidates: list[tuple[int, int, str, tuple[int, ...], list[RunningJob]]] = []
        for position, host in enumerate(self.free.order):
            if len(self.free.free[host]) != size:
                continue
            running = self.free.running_on[host]
            fresh = {r.id for r in running if not self._stopping(r)}
            if any(not may_stop(r) for r in running if r.id in fresh):
                continue
            indices = self.free.would_fit_if_freed(part, host, running)
            if indices is not None:
                candidates.append((len(fresh), position, host, indices, running))
        needed = -(-job.gpus // max(size, 1))
        if len(candidates) < needed:
            return None
        chosen = sorted(candidates)[:needed]
        return [(host, indices) for _, _, host, indices, _ in chosen], [r for *_, freed in chosen for r in freed]

    def _stopping(self, running: RunningJob) -> bool:
        return running.stopping or running.id in self.decision.preempt or running.id in self.decision.reclaim

    # -- why it waits -----------------------------------------------------------------------

    def _why_no_fit(self, job: QueuedJob) -> Reason:
        if not self.config.explain:
            return Reason(Wait.NO_FIT)
        shape = (job.gpus, job.fraction, job.host, job.indices, self.free.version)
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
        """Why `job` waits on the GPUs it could have soonest, reservations honoured."""
        found = self.free.earliest(job, self.now)
        if found is None:
            return Reason(Wait.NO_FIT, (job.gpus, job.fraction, INFINITY))
        known, _, slots = found
        host, indices = slots[0]
        kept = self.free.kept_from(host, indices, job.group) if self.free.kept else None
        if kept is not None:  # the soonest it could start is on GPUs kept for a group, after its window
            return _lab_reserved(host, indices, kept)
        holds = self.free.holds.get(host, {})
        held_by = sorted({holds[i].job_id for i in indices if i in holds and holds[i].job_id != job.id})
        if held_by:
            start = min(holds[i].start for i in indices if i in holds and holds[i].job_id == held_by[0])
            return Reason(Wait.RESERVED, (host, indices, held_by[0], start))
        holders = tuple(sorted({r.id for r in self.free.running_on[host] if set(r.indices) & set(indices)}))
        if job.indices is not None:
            return Reason(Wait.GPUS_BUSY, (host, indices, holders, known))
        if holders:  # the earliest GPUs are a forecast: the job takes whichever free up, so none is named
            return Reason(Wait.JOBS_HOLD, (host, job.gpus, job.fraction, holders, known))
        return Reason(Wait.NO_FIT, (job.gpus, job.fraction, known))

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


MAX_SLICES_PER_PASS = 32
"""Time slicing stops at most this many jobs in one pass (a gang may take it a little
over); fresh work that needs more stops them in the next passes, seconds later, while the
first ones are still writing their checkpoints (`CHECKPOINT_S`). So a pass stays fast
however many jobs are past their slice at once (a whole busy cluster after a quiet spell):
each stop is a search of every host for the fewest victims."""
CHECKPOINT_S = 30.0
"""A stopped job holds its GPUs this long (it writes a checkpoint first), in the simulator
and the forecast; the worker gives it `cancel_grace_s` (30 s by default)."""
RESTART_S = 60.0
"""Run time a stopped job loses when it starts again (process, graph, checkpoint restore)."""
STOP_COST_S = CHECKPOINT_S + RESTART_S
"""What stopping a job costs it: the checkpoint it writes, and the restart it pays again."""
MIN_RUN_S = 600.0
"""Time slicing stops no attempt younger than this: starting a job again costs about a
minute (`RESTART_S`), so each slice pays for it at least ten times over."""


def sliceable_from(running: RunningJob, slice_gpu_s: float) -> float:
    """When time slicing (after `slice_gpu_s`) may first stop this attempt: once the job has
    served its slice, and the attempt has run `MIN_RUN_S` and as long as the earlier ones.
    A job over several hosts serves on all of them at once (`whole_load`)."""
    load = running.whole_load
    if load <= 0:
        return INFINITY
    to_serve = (slice_gpu_s - running.served_gpu_s) / load
    return running.started + max(to_serve, MIN_RUN_S, running.served_gpu_s / load)
