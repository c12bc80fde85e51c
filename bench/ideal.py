"""A clairvoyant reference for a trace's average JCT: what a scheduler that knew every job's
run time at its arrival, had no hosts to fit in and paid nothing to stop a job would get.

The cluster is one pool of GPUs. At every arrival and end, the jobs present are taken in
order of the GPU time they have left (run time left × GPUs: shortest remaining work first,
the order that minimises average completion time on one machine, Schrage 1968) and each
gets its full size while the pool has room for it; one that does not fit waits, and the
next ones may still start (any job may be stopped at any moment and go on later where it
was, for free). Jobs run at their full size, as rigid ones: on this trace, letting the jobs
of 2 to 8 GPUs take whatever part of the pool is left (at the elastic throughput model's
rate) did not lower it.

It is not a lower bound (shortest-remaining-first is not optimal on many GPUs with jobs of
several sizes), but every simplification favours it over a real scheduler: it knows run
times exactly, never waits for a whole host or leaves a GPU idle to a host's shape, and
restarts for free. `bench/elastic.py` prints it beside towerq's figures as a ratio to the
same replay without elastic jobs.

Usage: `python bench/ideal.py` (the Philly window and 3 bootstraps; seconds).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scheduler_trace import GPUS_PER_HOST, HOSTS, TRACE, bootstrap  # noqa: E402
from service.scheduler.trace import TraceJob, read_trace  # noqa: E402


def ideal_avg_jct(jobs: list[TraceJob], gpus: int) -> float:
    """The reference's average JCT for `jobs` on a pool of `gpus` GPUs (jobs larger than the
    pool are left out, as the replays leave them out)."""
    runnable = sorted((j for j in jobs if j.gpu_count <= gpus), key=lambda j: (j.submit, j.id))
    if not runnable:
        return 0.0
    left: dict[int, float] = {}
    size = {j.id: j.gpu_count for j in runnable}
    ended: dict[int, float] = {}
    arrivals = list(reversed(runnable))
    now = arrivals[-1].submit
    while arrivals or left:
        while arrivals and arrivals[-1].submit <= now:
            job = arrivals.pop()
            left[job.id] = job.run_s
        room, running = gpus, []
        for job_id in sorted(left, key=lambda k: (left[k] * size[k], k)):
            if size[job_id] <= room:
                running.append(job_id)
                room -= size[job_id]
        step = min((left[k] for k in running), default=math.inf)
        if arrivals:
            step = min(step, arrivals[-1].submit - now)
        now += step
        for job_id in running:
            left[job_id] -= step
            if left[job_id] <= 1e-6:
                ended[job_id] = now
                del left[job_id]
    return sum(ended[j.id] - j.submit for j in runnable) / len(runnable)


def main() -> None:
    jobs = read_trace(TRACE)
    for seed in range(4):
        sample = bootstrap(jobs, seed) if seed else jobs
        name = "file" if seed == 0 else f"seed {seed}"
        print(f"{name:<8} ideal avg JCT {ideal_avg_jct(sample, HOSTS * GPUS_PER_HOST):9.0f} s")


if __name__ == "__main__":
    main()
