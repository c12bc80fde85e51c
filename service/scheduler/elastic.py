"""Elastic jobs: a job with a `min_gpu_count` below its `gpu_count` may run on any number of
GPUs of one host in between. Its global batch stays `batch_size × gpu_count` at every size
(the trainer gives each tower a larger slice: docs/trainer.md), so what it learns does not
depend on the size it ran at; only how fast it trains does. A resize is a stop at a
checkpoint and a start from it on the new GPUs: it costs the job `STOP_COST_S`.

- Start small: a job whose full size does not fit now starts on the most GPUs of one host
  that are free, at least its minimum, instead of waiting for the full size.
- Shrink: a job that does not fit takes GPUs from elastic jobs running above their minimum
  on one host (of its priority or lower, the most served first), each keeping at least half
  of what it holds, instead of waiting. It takes only what it needs; an elastic job that
  takes them starts on what that frees, at least its minimum. (Tried and dropped: shrinking
  only when the waiting job's expected wait outweighs what the shrink costs the running
  ones, and starting small only when that beats waiting for the full size; on the Philly
  window both gave back most of the gain, docs/scheduling.md.)
- Grow: after a pass's placements, an elastic job below its full size grows onto idle GPUs
  of its host (none of which a waiting job could take now: the pass placed every job that
  fits), when the time it saves by the larger size is at least twice what the resize costs.

A job is resized at most once every `MIN_RUN_S` (as time slicing stops an attempt no sooner):
a restart costs about `STOP_COST_S`, so each size pays for it several times over. A job that
spans several hosts is not elastic (the trainer's global batch over several hosts is its
full size; the contract refuses a smaller one).

The throughput model (the simulator's, and the rule for growth): on n GPUs a job trains at
`speed(n) = n × 0.9^log2(n)`, 90 % kept per doubling, the figure Horovod reports for
synchronous data-parallel training over 25 GbE (Sergeev & Del Balso, 2018); its rate at n
GPUs is `speed(n) / speed(full)` of its rate at its full size.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from service.scheduler.capacity import Ends, ends_if_started
from service.scheduler.costs import MIN_RUN_S, STOP_COST_S
from service.scheduler.outlook import likely_end
from service.scheduler.types import EPSILON, INFINITY, QueuedJob, RunningJob

if TYPE_CHECKING:
    from service.scheduler.mechanics import Pass

SCALING_PER_DOUBLING = 0.9
"""Throughput kept per doubling of a job's GPUs (Horovod's ~90 % at 25 GbE)."""
PAYS_TWICE = 2.0
"""A resize must be worth this many times its cost (`STOP_COST_S`): the time a job is
expected to run on is a guess, so a resize that only just pays on the guess is not made."""


def speed(gpus: int) -> float:
    """Training speed on `gpus` GPUs, in one GPU's."""
    return gpus * SCALING_PER_DOUBLING ** math.log2(gpus) if gpus > 0 else 0.0


def rate(gpus: int, full: int) -> float:
    """The rate of a job on `gpus` GPUs, as a part of its rate on its `full` size."""
    return speed(gpus) / speed(full)


def start_small(scheduling: Pass, job: QueuedJob) -> bool:
    """Place `job` on the most GPUs of one host that are free now, at least its minimum
    (its full size does not fit)."""
    free = scheduling.free
    if not job.elastic or not free.any_free or job.gpu_count > free.largest:
        return False
    assert job.min_gpu_count is not None
    for size in range(min(job.gpu_count - 1, free.max_full), job.min_gpu_count - 1, -1):
        smaller = replace(job, gpu_count=size)
        slots = free.fit(smaller, _ends_at(job, size, scheduling.now))
        if slots is not None:
            scheduling.place(smaller, slots)
            return True
    return False


def shrink_for(scheduling: Pass, job: QueuedJob) -> bool:
    """Make room for `job` (which does not fit) by shrinking elastic jobs on the one host
    where that takes GPUs from the fewest of them, and place it there; False when no host
    has such room."""
    free = scheduling.free
    if job.gpu_count > free.largest or job.indices is not None:
        return False
    shape = _shape(scheduling, job, job.gpu_count, job.min_gpu_count, job.fraction, job.host, job.hosts, job.priority)
    if shape in scheduling.no_shrink:
        return False
    end = ends_if_started(job, scheduling.now)
    best: tuple[tuple[int, int, int], str, list[int], dict[int, tuple[int, ...]]] | None = None
    for position, host in enumerate(job.where(free.order)):
        found = _room_on(scheduling, job, host, end)
        if found is not None:
            size, open_now, given = found
            key = (-size, len(given), position)
            if best is None or key < best[0]:
                best = (key, host, open_now, given)
                if size == job.gpu_count and len(given) == 1:  # a shrink gives some GPUs: none does better
                    break
    if best is None:
        scheduling.no_shrink.add(shape)
        return False
    key, host, open_now, given = best
    size = -key[0]
    taken = list(open_now)
    for running in list(free.running_on[host]):
        if running.id not in given:
            continue
        released = given[running.id]
        kept = tuple(i for i in running.indices if i not in released)
        scheduling.decision.shrink[running.id] = kept
        scheduling.unload(running, len(released))
        free.give(host, released, running.fraction)
        free.runs_on(running, kept)
        taken.extend(released)
    scheduling.place(replace(job, gpu_count=size), [(host, tuple(sorted(taken[:size])))])
    return True


def move_for(scheduling: Pass, job: QueuedJob) -> bool:
    """Make room for `job`, which needs whole hosts and does not fit, by moving the elastic
    jobs on the hosts that hold the fewest GPUs, each at its present size, onto idle GPUs
    of other hosts, and place it on the hosts that frees; False when moves cannot free
    enough hosts. A host is cleared only if every job on it may move (elastic, of `job`'s
    priority or lower, on whole GPUs, not resized for `MIN_RUN_S`, not on a host it asked
    for) and each of its GPUs is then open to `job`; no job moves onto a host a move
    clears. Without it a whole-host job waits for whole hosts to empty, or slices jobs that
    had their time slice, while idle GPUs elsewhere could take the elastic jobs in its way
    (the moved jobs lose a restart, `STOP_COST_S`, and train at the same size)."""
    free = scheduling.free
    size = free.largest
    pinned = job.host is not None or job.hosts is not None or job.indices is not None
    if job.gpu_count < size or pinned or job.fraction < 1 - EPSILON:
        return False
    shape = _shape(scheduling, job, "move", job.gpu_count, job.priority)
    if shape in scheduling.no_shrink:
        return False
    part = replace(job, gpu_count=size)
    hosts = []
    for position, host in enumerate(free.order):
        on_host = free.running_on[host]
        if len(free.free[host]) != size or not all(_may_move(scheduling, r, job) for r in on_host):
            continue
        indices = free.would_fit_if_freed(part, host, on_host)
        if indices is not None:
            hosts.append((sum(len(r.indices) for r in on_host), position, host, indices))
    needed = -(-job.gpu_count // max(size, 1))
    idle = {host: _idle(scheduling, host) for host in free.order if host in free.with_room}
    cleared: list[tuple[str, tuple[int, ...]]] = []
    moves: dict[int, tuple[RunningJob, str, tuple[int, ...]]] = {}
    for _, _, host, indices in sorted(hosts):
        if len(cleared) == needed:
            break
        if any(target == host for _, target, _ in moves.values()):
            continue  # a job moves onto it
        plan = _plan_moves(free.running_on[host], idle, {host, *(h for h, _ in cleared)})
        if plan is None:
            continue
        cleared.append((host, indices))
        for running, target, gpus in plan:
            idle[target] = [i for i in idle[target] if i not in gpus]
            moves[running.id] = (running, target, gpus)
    if len(cleared) < needed:
        scheduling.no_shrink.add(shape)  # later in the pass: fewer idle GPUs, fewer jobs that may move
        return False
    for running, target, gpus in moves.values():
        free.give(running.host, running.indices, running.fraction)
        free.take([(target, gpus)], running.fraction)
        free.runs_on(running, gpus, target)
        scheduling.decision.grow[running.id] = (target, gpus)
        scheduling.decision.moved_for[running.id] = job.id
    scheduling.place(job, cleared)
    return True


def _plan_moves(
    running: list[RunningJob], idle: dict[str, list[int]], cleared: set[str]
) -> list[tuple[RunningJob, str, tuple[int, ...]]] | None:
    """Where each of `running` goes, at its size: onto the idle GPUs of the host with the
    fewest that hold it (best fit), the largest job first; None when one cannot go."""
    left = {host: list(gpus) for host, gpus in idle.items() if host not in cleared}
    plan = []
    for job in sorted(running, key=lambda r: (-len(r.indices), r.id)):
        fits = [(len(gpus), host) for host, gpus in left.items() if len(gpus) >= len(job.indices)]
        if not fits:
            return None
        _, host = min(fits)
        gpus = tuple(left[host][: len(job.indices)])
        left[host] = left[host][len(job.indices) :]
        plan.append((job, host, gpus))
    return plan


def grow(scheduling: Pass) -> None:
    """Grow elastic jobs below their full size onto idle GPUs, the furthest below it first,
    where it pays (`_growth_pays`): on their own host, or by moving to another host where
    more of them are idle (a resize restarts the job from its checkpoint anyway), unless
    it asked for its host."""
    free = scheduling.free
    if not free.any_free:
        return
    below = [
        r
        for host in free.order
        for r in free.running_on[host]
        if _may_resize(scheduling, r) and len(r.indices) < _full(r)
    ]
    idle = {host: _idle(scheduling, host) for host in free.order if host in free.with_room}
    for running in sorted(below, key=lambda r: (len(r.indices) / _full(r), r.started, r.id)):
        full, held = _full(running), len(running.indices)
        host, size = running.host, min(full, held + len(idle.get(running.host, ())))
        for other, gpus in idle.items():
            if other != running.host and min(full, len(gpus)) > size and not running.pinned:
                host, size = other, min(full, len(gpus))
        if size <= held or not _growth_pays(running, size, scheduling.now):
            continue
        if host == running.host:
            added = idle[host][: size - held]
            indices = tuple(sorted(running.indices + tuple(added)))
        else:
            added = idle[host][:size]
            indices = tuple(added)
            free.give(running.host, running.indices, running.fraction)
            idle[running.host] = _idle(scheduling, running.host)
        idle[host] = [i for i in idle[host] if i not in added]
        scheduling.decision.grow[running.id] = (host, indices)
        free.take([(host, tuple(added))], running.fraction)
        scheduling.unload(running, held - size)
        free.runs_on(running, indices, host)


def _shape(scheduling: Pass, job: QueuedJob, *shape: object) -> tuple[object, ...]:
    """`Pass.no_shrink`'s key for `job`: what shrinking or moving for it depends on. Where lab
    reservations keep GPUs, also its group and time limit and estimate: which kept GPUs it may
    take depends on them (`FreeGpus.may_borrow`)."""
    if scheduling.free.kept:
        return (*shape, job.group, job.limit_s, job.estimate_s)
    return shape


def _idle(scheduling: Pass, host: str) -> list[int]:
    """The GPUs of `host` that are wholly free and no one else's to take (held, kept)."""
    free = scheduling.free
    return [i for i, f in enumerate(free.free[host]) if f >= 1 - EPSILON and free.open_to(host, i, None)]


def _room_on(
    scheduling: Pass, job: QueuedJob, host: str, end: Ends
) -> tuple[int, list[int], dict[int, tuple[int, ...]]] | None:
    """On `host`: the size `job` would start at, the GPUs it would take that are open now,
    and the GPUs each shrunk job would give up (the most served first, each only what it
    spares above what it keeps); None when shrinking cannot make room for it there."""
    free = scheduling.free
    if host not in free.hosts:
        return None
    victims = [r for r in free.running_on[host] if _may_shrink(scheduling, r, job)]
    if not victims:
        return None
    open_now = [i for i in range(len(free.free[host])) if free.usable(host, i, job, end)]
    spare: list[tuple[int, RunningJob, list[int]]] = []
    for running in victims:
        openable = [i for i in running.indices if free.open_to(host, i, job)]
        count = min(len(running.indices) - _keeps(running), len(openable))
        if count > 0:
            spare.append((count, running, openable[-count:]))
    room = len(open_now) + sum(count for count, _, _ in spare)
    least = job.min_gpu_count if job.elastic and job.min_gpu_count is not None else job.gpu_count
    size = min(job.gpu_count, room)
    if size < least or size <= len(open_now):
        return None
    given: dict[int, tuple[int, ...]] = {}
    needed = size - len(open_now)
    for count, running, openable in sorted(spare, key=lambda s: (-s[1].served(scheduling.now), s[1].id)):
        if needed <= 0:
            break
        take = min(count, needed)
        given[running.id] = tuple(openable[-take:])
        needed -= take
    return size, open_now, given


def _may_resize(scheduling: Pass, running: RunningJob) -> bool:
    """An elastic job on one host, not stopping or resized in this pass, whose attempt has
    run `MIN_RUN_S`."""
    return (
        running.elastic
        and running.job_gpu_load is None
        and not scheduling.stopping(running)
        and running.id not in scheduling.decision.shrink
        and running.id not in scheduling.decision.grow
        and scheduling.now - running.started >= MIN_RUN_S
    )


def _may_move(scheduling: Pass, running: RunningJob, job: QueuedJob) -> bool:
    """An elastic job that may move to another host to make room for `job`: of its priority
    or lower, on whole GPUs, not on the host it asked for."""
    return (
        _may_resize(scheduling, running)
        and running.priority >= job.priority
        and running.fraction >= 1 - EPSILON
        and not running.pinned
    )


def _may_shrink(scheduling: Pass, running: RunningJob, job: QueuedJob) -> bool:
    """An elastic job `job` may take GPUs from: of its priority or lower, above what it keeps."""
    if not _may_resize(scheduling, running) or running.priority < job.priority:
        return False
    return len(running.indices) > _keeps(running)


def _keeps(running: RunningJob) -> int:
    """The fewest GPUs a shrink leaves an elastic job: its minimum, and half what it holds."""
    return max(running.min_gpu_count or 1, math.ceil(len(running.indices) / 2))


def _full(running: RunningJob) -> int:
    return running.full_gpu_count or len(running.indices)


def _growth_pays(running: RunningJob, size: int, now: float) -> bool:
    """Whether growing to `size` saves, on the time the job likely runs on, at least
    `PAYS_TWICE` × what the resize costs (a job with no known end: always)."""
    left = likely_end(running, now) - now
    if left == INFINITY:
        return True
    full = _full(running)
    saved = left * (1 - rate(len(running.indices), full) / rate(size, full))
    return saved >= PAYS_TWICE * STOP_COST_S


def _ends_at(job: QueuedJob, size: int, now: float) -> Ends:
    """When `job` ends if it starts now on `size` GPUs: its time limit is a wall clock's;
    the run time its owner's history gives is at its full size, and longer on fewer."""
    known, likely = ends_if_started(job, now)
    if likely == INFINITY:
        return known, likely
    return known, min(known, now + (likely - now) / rate(size, job.gpu_count))
