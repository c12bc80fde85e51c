"""Whom a waiting job may stop, for a policy that stops jobs (`Pass.stops_jobs`): the victims
of preemption and time slicing, on the host where the fewest stops make room.

- Preemption (optional): a `high` job that cannot start stops `low` jobs (the youngest
  first, so the least work is redone) on the host where that frees room soonest; their
  GPUs are held for it until they have checkpointed and gone back to the queue.
- Time slicing (`demote_after_gpu_s` > 0): a fresh job that cannot start may stop jobs of
  its priority or lower that have had their slice, the most served first, when the stop
  pays (`slice_victims`). An attempt is never stopped before it has run `MIN_RUN_S` and as
  long as all the job's earlier attempts together (`sliceable_from`; an elastic job's
  resizes go on with its run), so slices double and a job is stopped at most about
  log2(its run time / the threshold) times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from service.scheduler.costs import STOP_COST_S, sliceable_from
from service.scheduler.outlook import Slots, expected_end
from service.scheduler.types import INFINITY, PRIORITY_RANK, QueuedJob, Reason, RunningJob, Wait

if TYPE_CHECKING:
    from service.scheduler.mechanics import Pass

HIGH = PRIORITY_RANK["high"]
LOW = PRIORITY_RANK["low"]

MAX_SLICES_PER_PASS = 32
"""Time slicing stops at most this many jobs in one pass (a gang may take it a little
over); fresh work that needs more stops them in the next passes, seconds later, while the
first ones are still writing their checkpoints (`CHECKPOINT_S`). So a pass stays fast
however many jobs are past their slice at once (a whole busy cluster after a quiet spell):
each stop is a search of every host for the fewest victims."""


def may_slice(running: RunningJob, now: float, demote_after_gpu_s: float) -> bool:
    """(Time slicing on.) The job is not stopping, it has had its first
    `demote_after_gpu_s`, and this attempt has run at least MIN_RUN_S and as long as
    all its earlier attempts together (`sliceable_from`)."""
    if not running.stoppable or running.stopping:
        return False
    return now >= sliceable_from(running, demote_after_gpu_s)


def make_room(scheduling: Pass, job: QueuedJob) -> Reason:
    """Stop jobs to make room for `job` where it may (a high job low ones; fresh work, or the
    eldest whole-host job, jobs that had their slice), hold the GPUs that frees for it, and
    say so; else say why it waits."""
    if not scheduling.stops_jobs:
        return scheduling.why_no_fit(job)
    choice, kind = None, Wait.PREEMPTING
    if scheduling.config.preemption and job.priority == HIGH:
        choice = fewest_stops(scheduling, job, lambda r: r.priority == LOW and r.stoppable, lambda r: -r.started)
    eldest = job.id == scheduling.eldest_gang
    fresh = job.served_gpu_s < scheduling.config.demote_after_gpu_s
    if choice is None and 0 < scheduling.config.demote_after_gpu_s and (fresh or eldest):
        choice, kind = slice_victims(scheduling, job, eldest), Wait.SLICING
    if choice is None:
        return scheduling.why_no_fit(job)
    slots, victims = choice
    for victim in victims:
        if not scheduling.stopping(victim):
            scheduling.decision.preempt[victim.id] = job.id
            if kind == Wait.SLICING:
                scheduling.decision.sliced.add(victim.id)
            scheduling.sliceable.pop(victim.id, None)
    if kind == Wait.SLICING and len(scheduling.decision.sliced) >= MAX_SLICES_PER_PASS:
        scheduling.sliceable.clear()  # the rest next pass
    scheduling.free.hold(job.id, slots, scheduling.now, scheduling.now)
    hosts = " + ".join(host for host, _ in slots)
    return Reason(kind, (hosts, tuple(dict.fromkeys(v.id for v in victims))))


def slice_victims(scheduling: Pass, job: QueuedJob, eldest: bool = False) -> tuple[Slots, list[RunningJob]] | None:
    """Time slicing: running jobs of the same or a lower priority that `may_slice`,
    the most served first; a user above their share (their part of the present users'
    use is over their part of the shares) stops only their own jobs, except for the
    eldest whole-host job (`eldest`, `policy.Towerq.eldest_whole_host_gang`). A stop must pay:
    when the fresh work's run time is known (`fresh_run_s`), the job stopped must be
    expected to run on (`expected_end`, cautious) for longer than that plus what the stop
    costs it (`STOP_COST_S`), else the fresh job waits as it would without slicing
    (shortest remaining work first: stopping a job for one as long gains nobody). Within a pass,
    victims only get fewer and free GPUs scarcer, so a shape that found none finds none
    later in the pass either."""
    terms = scheduling.terms
    above_share = terms is not None and terms.above_share(job.user, job.group)
    own_only = above_share and not eldest
    fresh_run = fresh_run_s(job)
    owner = job.user if own_only else None
    shape = (job.gpu_count, job.fraction, job.host, job.hosts, job.indices, job.priority, owner)
    if not scheduling.sliceable or fresh_run >= scheduling.no_victims.get(shape, INFINITY):
        return None
    served = scheduling.sliceable

    def may_stop(running: RunningJob) -> bool:
        mine = running.user == job.user or not own_only
        if not (running.id in served and running.priority >= job.priority and mine):
            return False
        return not fresh_run or expected_end(running, scheduling.now) - scheduling.now >= fresh_run + STOP_COST_S

    choice = fewest_stops(scheduling, job, may_stop, lambda r: -served[r.id])
    if choice is None:
        scheduling.no_victims[shape] = min(fresh_run, scheduling.no_victims.get(shape, INFINITY))
    return choice


def fresh_run_s(job: QueuedJob) -> float:
    """How long fresh work stopping a served job is known to hold its GPUs: its owner's
    median run time (at most its limit), else its limit; 0 when nothing is known (as
    Tiresias does, time slicing then finds out by running it: it can be stopped in turn
    once it has had its slice)."""
    for known in (job.likely_run_s, job.limit_s):
        if known is not None:
            return known
    return 0.0


def fewest_stops(
    scheduling: Pass, job: QueuedJob, may_stop: Callable[[RunningJob], bool], order: Callable[[RunningJob], float]
) -> tuple[Slots, list[RunningJob]] | None:
    """The host where stopping the fewest running jobs that `may_stop` (in `order`)
    makes room; jobs already stopping count as gone. A job larger than any host takes
    whole hosts (`whole_hosts`)."""
    if job.gpu_count > scheduling.free.largest:
        return whole_hosts(scheduling, job, may_stop)
    named = job.where(scheduling.free.order)
    hosts = [host for host in named if host in scheduling.free.hosts]
    for host in hosts:  # room that stops no one more (GPUs free, or freeing): no host does better
        freed = [r for r in scheduling.free.running_on[host] if scheduling.stopping(r)]
        indices = scheduling.free.would_fit_if_freed(job, host, freed)
        if indices is not None:
            return [(host, indices)], freed
    best: tuple[int, str, tuple[int, ...], list[RunningJob]] | None = None
    for host in hosts:
        running = scheduling.free.running_on[host]
        freed = [r for r in running if scheduling.stopping(r)]
        candidates = sorted(
            (r for r in running if may_stop(r) and not scheduling.stopping(r) and not scheduling.resized(r)), key=order
        )
        indices = None
        for victim in candidates:
            freed.append(victim)
            indices = scheduling.free.would_fit_if_freed(job, host, freed)
            if indices is not None:
                break
        if indices is None:
            continue
        fresh = sum(1 for r in freed if not scheduling.stopping(r))
        if best is None or fresh < best[0]:
            best = (fresh, host, indices, freed)
            if fresh == 1:  # no host makes room with none (the loop above): none does better
                break
    return ([(best[1], best[2])], best[3]) if best else None


def whole_hosts(
    scheduling: Pass, job: QueuedJob, may_stop: Callable[[RunningJob], bool]
) -> tuple[Slots, list[RunningJob]] | None:
    """For a job larger than any host: the whole hosts (as `FreeGpus.fit` places it)
    where stopping the fewest running jobs makes room. A host is a candidate only if
    every job on it that is not already stopping `may_stop`; one part of a job over
    several hosts frees its other hosts too (a job stops on all of them)."""
    size = scheduling.free.largest
    part = replace(job, gpu_count=size, host=None, indices=None)
    candidates: list[tuple[int, int, str, tuple[int, ...], list[RunningJob]]] = []
    for position, host in enumerate(scheduling.free.order):
        if len(scheduling.free.free[host]) != size:
            continue
        running = scheduling.free.running_on[host]
        fresh = {r.id for r in running if not scheduling.stopping(r)}
        if any(not may_stop(r) or scheduling.resized(r) for r in running if r.id in fresh):
            continue
        indices = scheduling.free.would_fit_if_freed(part, host, running)
        if indices is not None:
            candidates.append((len(fresh), position, host, indices, running))
    needed = -(-job.gpu_count // max(size, 1))
    if len(candidates) < needed:
        return None
    chosen = sorted(candidates)[:needed]
    return [(host, indices) for _, _, host, indices, _ in chosen], [r for *_, freed in chosen for r in freed]
