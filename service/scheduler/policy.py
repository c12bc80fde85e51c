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

from collections.abc import Callable, Iterable
from typing import Protocol

from service.scheduler import elastic
from service.scheduler.mechanics import Outcome, Pass
from service.scheduler.ranking import FairShareTerms, RankOrder
from service.scheduler.types import Cluster, Decision, FairShare, Policy, PolicyConfig, QueuedJob


def schedule(
    queued: Iterable[QueuedJob],
    cluster: Cluster,
    fair_share: FairShare,
    now: float,
    config: PolicyConfig,
) -> Decision:
    """Decide which queued jobs start now, where, and why the others wait: the one entry for
    the live pass, the forecast, the dry run and the simulator."""
    policy = POLICIES[config.policy]
    scheduling = Pass(list(queued), cluster, fair_share, now, config, stops_jobs=policy.stops_jobs)
    if config.preemption:
        scheduling.reclaim_reserved()
    policy.run(scheduling)
    if scheduling.has_elastic:
        elastic.grow(scheduling)
    return scheduling.decision


class SchedulingPolicy(Protocol):
    """A policy: the order a pass considers the queued jobs in, and when it stops (the
    mechanics of placing, reserving, preempting and saying why are `mechanics.Pass`'s)."""

    name: str
    stops_jobs: bool
    """Whether preemption and time slicing (where the lab turns them on) may stop running
    jobs for this policy's waiting ones."""

    def run(self, scheduling: Pass) -> None: ...


def in_submit_order(queued: list[QueuedJob]) -> list[QueuedJob]:
    return sorted(queued, key=lambda j: (j.submitted, j.id))


class Fifo:
    """Strict submit order: nothing passes a job that waits for room (a job held by a limit
    or a host that is down does not block). Once the head is blocked or nothing is free,
    the rest only wait, said so when reasons are wanted."""

    name: str = Policy.FIFO
    stops_jobs: bool = False

    def run(self, scheduling: Pass) -> None:
        blocker: QueuedJob | None = None
        for job in in_submit_order(scheduling.queued):
            if (blocker is not None or not scheduling.free.any_free) and not scheduling.config.explain:
                return
            if blocker is not None:
                scheduling.behind(job, blocker)
            elif scheduling.consider(job) is Outcome.NO_ROOM:
                blocker = job


class FitFirst:
    """Submit order, and anything that fits starts; no reservations (big jobs starve)."""

    name: str = Policy.FIT_FIRST
    stops_jobs: bool = False

    def run(self, scheduling: Pass) -> None:
        for job in in_submit_order(scheduling.queued):
            if not scheduling.free.any_free and not scheduling.config.explain:
                return
            scheduling.consider(job)


class Towerq:
    """towerq's policy (the module's docstring): rank order with fair share, starving gangs
    reserved for by age, the eldest whole-host gang first under time slicing."""

    name: str = Policy.TOWERQ
    stops_jobs: bool = True

    def run(self, scheduling: Pass) -> None:
        terms = FairShareTerms(scheduling.fair_share, scheduling.cluster.running, scheduling.queued, scheduling.now)
        scheduling.terms = terms
        seen: set[int] = set()
        # Starving gang jobs take reservations by age, not rank, and the eldest goes
        # first: a gang job's wait is bounded by the gang jobs older than it, however
        # many others outrank it (a heavy user's backlog included).
        starving = self.starving_by_age(scheduling)[: scheduling.config.max_reservations]
        scheduling.reservable = {j.id for j in starving}
        if starving:
            seen.add(starving[0].id)
            if scheduling.consider(starving[0]) is Outcome.PLACED:
                terms.started(starving[0])
        eldest = self.eldest_whole_host_gang(scheduling)
        if eldest is not None and eldest.id not in seen:
            seen.add(eldest.id)
            if scheduling.consider(eldest) is Outcome.PLACED:
                terms.started(eldest)
        config, now = scheduling.config, scheduling.now
        order = RankOrder(scheduling.queued, terms, now, config, scheduling.whole_host)
        scheduling.base_ranks = order.ranks
        for job in order:
            if job.id in seen:
                continue
            seen.add(job.id)
            if scheduling.consider(job) is Outcome.PLACED:
                terms.started(job)
            elif not scheduling.free.any_free:
                # Nothing more starts in this pass, so no user's term changes: the rest
                # of the rank order is one plain sort.
                if not config.explain and not scheduling.may_preempt:
                    self.reserve_for_rest(scheduling, [j for j in scheduling.queued if j.id not in seen], terms)
                    return
                ordered = order.rest(seen)
                for k, waiting in enumerate(ordered):
                    if not config.explain and not scheduling.may_preempt:
                        self.reserve_for_rest(scheduling, ordered[k:], terms)  # no victim left
                        return
                    scheduling.consider(waiting)
                return

    @staticmethod
    def starving_by_age(scheduling: Pass) -> list[QueuedJob]:
        """Gang jobs that have waited `reserve_after_s` (`QueuedJob.waiting_since`) and may
        run, the longest waiting first."""
        waited = scheduling.config.reserve_after_s
        starving = [
            j
            for j in scheduling.queued
            if j.gpu_count > 1 and scheduling.now - j.waiting_since >= waited and scheduling.cannot_run(j) is None
        ]
        return sorted(starving, key=lambda j: (j.waiting_since, j.id))

    @staticmethod
    def eldest_whole_host_gang(scheduling: Pass) -> QueuedJob | None:
        """(Time slicing on.) The eldest job (`waiting_since`) of the best priority class in
        the queue, if it needs a whole host and may run; it goes first, and may slice
        (`Whole-host gangs` above)."""
        if scheduling.config.demote_after_gpu_s <= 0 or not scheduling.queued:
            return None
        eldest = min((j.priority, j.waiting_since, j.id, j) for j in scheduling.queued)[3]  # ids are unique
        if eldest.gpu_count < scheduling.whole_host or scheduling.cannot_run(eldest) is not None:
            return None
        scheduling.eldest_gang = eldest.id
        return eldest

    @staticmethod
    def rank_key(scheduling: Pass, terms: FairShareTerms) -> Callable[[QueuedJob], tuple[float, float, int]]:
        """The rank order's sort key while no job starts (terms fixed). Used once the rank
        order has begun, which has put every queued job's base rank there."""
        ranks, term = scheduling.base_ranks, terms.term
        return lambda job: (ranks[job.id] + term(job.user, job.group), job.submitted, job.id)

    def reserve_for_rest(self, scheduling: Pass, rest: list[QueuedJob], terms: FairShareTerms) -> None:
        """Nothing else can start in this pass, so the rank order no longer changes and the
        only work left is reservations, for the first starving gang jobs in that order. (A
        shortcut for the simulator, which wants no reasons: the outcome is the same. Not with
        preemption on: a later high-priority job may still stop others to make room.)"""
        candidates = [j for j in rest if scheduling.may_reserve(j) and scheduling.cannot_run(j) is None]
        candidates.sort(key=self.rank_key(scheduling, terms))
        for candidate in candidates:
            if scheduling.reservations >= scheduling.config.max_reservations:
                return
            scheduling.reserve(candidate)


POLICIES: dict[str, SchedulingPolicy] = {}
"""Every policy by its name (`PolicyConfig.policy`; `towerq simulate --policy`, the What-if page)."""


def register_policy(policy: SchedulingPolicy) -> None:
    POLICIES[policy.name] = policy


for _policy in (Fifo(), FitFirst(), Towerq()):
    register_policy(_policy)
