"""What a pass does about resizes before the policy places anyone (`settle_resizes`), on
plain values: the jobs a resize stopped start on the GPUs it recorded for them
(`place_resized`), and the GPUs beside what a shrink or a move gives up are held for the
job it makes room for (`hold_made_room`). `resize` reads and writes the records
(`Job.resize_to`, `Target`); the forecast holds the same GPUs in its replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.scheduler.types import EPSILON, Cluster, HostCapacity, Placement, QueuedJob


@dataclass(frozen=True, slots=True)
class Target:
    """Where a resized job's next attempt starts."""

    host: str
    gpus: tuple[int, ...]
    run_served_gpu_s: float | None = None
    """What the job had served when its run began (`Job.run_served_gpu_s`): the resize goes on
    with the run."""
    for_job: int | None = None
    """The queued job the resize makes room for (a shrink's or a move's); None: a growth."""
    source: str | None = None
    """The host the job ran on (a move's is not `host`); None in records from before it was kept."""

    @classmethod
    def read(cls, record: object, run_served_gpu_s: float | None = None) -> Target | None:
        """The target a `Job.resize_to` record names (`record`: what `_stop` wrote); None
        for none."""
        if not isinstance(record, dict) or not isinstance(record.get("host"), str):
            return None
        gpus = tuple(i for i in record.get("gpus") or () if isinstance(i, int))
        for_job, source = record.get("for"), record.get("from")
        return cls(
            record["host"],
            gpus,
            run_served_gpu_s,
            for_job if isinstance(for_job, int) else None,
            source if isinstance(source, str) else None,
        )

    def record(self) -> dict[str, Any]:
        """What `Job.resize_to` keeps of it (`read` reads it back)."""
        return {"host": self.host, "gpus": list(self.gpus), "for": self.for_job, "from": self.source}


def settle_resizes(
    queued: list[QueuedJob], cluster: Cluster, targets: dict[int, Target], now: float
) -> tuple[list[QueuedJob], list[Placement]]:
    """What a pass does about resizes before the policy places anyone: the jobs a resize
    stopped start on their targets (`place_resized`), and GPUs are held for the jobs resizes
    make room for (`hold_made_room`). (The queue without the restarted jobs, their
    placements.)"""
    restarts = place_resized(queued, cluster, targets, now)
    if restarts:
        placed = {p.job_id for p in restarts}
        queued = [q for q in queued if q.id not in placed]
    hold_made_room(queued, cluster, targets)
    return queued, restarts


def place_resized(queued: list[QueuedJob], cluster: Cluster, targets: dict[int, Target], now: float) -> list[Placement]:
    """Placements for the queued jobs a resize stopped, on the GPUs of their target still
    free (at least their minimum), taken from `cluster` (each joins its running jobs, so
    that the policy then sees them held)."""
    hosts = {h.name: h for h in cluster.hosts}
    placements = []
    for job in sorted((q for q in queued if q.id in targets), key=lambda q: q.id):
        target = targets[job.id]
        host = hosts.get(target.host)
        if host is None:
            continue
        indices = still_free(host, target.gpus, job.fraction, job.min_gpu_count or job.gpu_count, job.gpu_count)
        if indices is None:
            continue
        host.take(indices, job.fraction)
        # Estimates as the history gave them to it queued (annotate ran first); it goes on
        # with its run.
        (running,) = job.parts_on([(host.name, indices)], now)
        running.run_served_gpu_s = target.run_served_gpu_s
        cluster.running.append(running)
        placements.append(Placement(job.id, [(host.name, indices)]))
    return placements


def still_free(
    host: HostCapacity, gpus: tuple[int, ...], fraction: float, least: int, most: int
) -> tuple[int, ...] | None:
    """The GPUs of a resize's target (`gpus` of `host`) its job restarts on: those still free
    for its `fraction`, at most `most`; None when fewer than `least` are (it waits in the
    queue). The live pass (`place_resized`) and the forecast's replay both ask it."""
    free = [i for i in gpus if i < len(host.free) and i not in host.unusable and host.free[i] >= fraction - EPSILON]
    return tuple(free[:most]) if min(most, len(free)) >= least else None


def hold_made_room(queued: list[QueuedJob], cluster: Cluster, targets: dict[int, Target]) -> None:
    """Hold for each queued job a resize makes room for the GPUs free now on the hosts its
    resizes free (`Cluster.held`; at most its size in all), from the pass that decided them
    until the pass after the last of them has stopped: while they stop, the GPUs beside
    those they give up (a whole host, for a move), and for a job over several whole hosts the
    hosts already free (those whose moves ended first); once they have, what they gave up too.
    Only that job takes them, whatever the rank order says of the jobs that came since:
    the simulator starts it on them at once (a resize there costs the resized job a restart,
    not the job it was made for a wait), and a job that came meanwhile must not make the
    restart a loss. Where it does not start on them (a limit it has reached since), they go
    back to the queue with the pass after."""
    by_id = {q.id: q for q in queued}
    freed: dict[int, list[str]] = {}
    for running in cluster.running:
        if running.stopping and running.shrinking_for in by_id:
            freed.setdefault(running.shrinking_for, []).append(running.host)
    for target in targets.values():
        if target.for_job in by_id and target.source is not None:
            freed.setdefault(target.for_job, []).append(target.source)
    hosts = {h.name: h for h in cluster.hosts}
    largest = max((h.size for h in cluster.hosts), default=0)
    taken = {(host, i) for _, host, indices in cluster.held for i in indices}
    for job_id, names in sorted(freed.items()):
        job, left = by_id[job_id], by_id[job_id].gpu_count
        for name in dict.fromkeys(names):
            host = hosts.get(name)
            if host is None or left <= 0:
                continue
            open_now = [
                i
                for i, level in enumerate(host.free)
                if i not in host.unusable and level >= job.fraction - EPSILON and (name, i) not in taken
            ][:left]
            if open_now:
                cluster.held.append((job_id, name, tuple(open_now)))
                taken.update((name, i) for i in open_now)
                left -= len(open_now)
        coming = sum(len(r.indices) for r in cluster.running if r.stopping and r.shrinking_for == job_id)
        if job.gpu_count >= largest and coming:
            # A job over whole hosts whose moves end at different times: a host already freed
            # (its jobs restarted elsewhere, so no longer named) stays its own while the rest stop.
            for host in cluster.hosts:
                if left - coming < largest:
                    break
                whole = tuple(range(len(host.free)))
                if host.name in names or host.unusable or any(level < 1 - EPSILON for level in host.free):
                    continue
                if host.size == largest and not any((host.name, i) in taken for i in whole):
                    cluster.held.append((job_id, host.name, whole))
                    taken.update((host.name, i) for i in whole)
                    left -= host.size
