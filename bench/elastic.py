"""Elastic jobs on the Philly window: towerq with a share of its multi-GPU jobs elastic
against towerq with none, side by side on the same traces.

Replays the Philly trace sample (32 hosts × 8 GPUs, the service's defaults: time slicing after
an hour of GPU time) and `--seeds` bootstraps of it (`bench/scheduler_trace.py`'s), each three
times: no job elastic; every job on 2-8 GPUs elastic down to 1 GPU; half of them (by id). An
elastic job trains at `speed(n) / speed(full)` of its full rate on n GPUs, speed(n) =
n × 0.9^log2(n) (Horovod's ~90 % per doubling at 25 GbE), and each resize costs it
`STOP_COST_S` (a checkpoint and a restart: `service.scheduler.elastic`). Printed per trace:
avg JCT and max wait as ratios to the replay without elastic jobs (the issue's goal: at most
0.8× and at most 1.0×; the max wait counts re-waits after a stop, "first" beside it only the
waits for a job's first start, "p99" the wait that 99 % of jobs stay within), "users" the
same ratio of the average over users of each one's avg JCT (each member counts once, however
many jobs they sent: on the flood family the flooder's 2,000 short jobs are 40 % of all
jobs, ranked last by fair share), GPU
utilisation, resizes per elastic job, the moves that freed a host for a job that needs whole
hosts (`elastic.move_for`), and the policy's CPU time per pass (p99 / max over the replay),
and beside them, as the same ratio, a clairvoyant reference (`bench/ideal.py`: every run
time known, no hosts to fit in, stops for free) for what a scheduler could hope for on the
trace. Then a pass over 5,000 queued jobs with
every GPU held by elastic jobs that may be shrunk (the most a pass looks at), and the same
pass with rigid jobs, each timed `PASSES` times with the garbage collector paused as the live
pass runs the policy: median / p99 / max CPU ms (the goal: 20 ms p99 / 50 ms max); and the
collector's cost, side by side: shrinkable passes with the queue built anew for each (as the
live pass reads it), the collector paused and on by turns.

`--families N` replays instead the trace families of `bench/trace_families.py` (N seeds
each; 64 GPUs, 8 hosts x 8), the same three ways; `--pass-only` times only the pass.

Usage: `python bench/elastic.py [--seeds N] [--workers N] [--families N] [--pass-only] [--pass-trace CSV]` (the
file and 10 seeds: about 15 min on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ideal import ideal_avg_jct  # noqa: E402
from bench.scheduler_trace import GPUS_PER_HOST, HOSTS, SLICE_GPU_S, TRACE, bootstrap  # noqa: E402
from bench.trace_families import FAMILIES  # noqa: E402
from bench.trace_families import GPUS_PER_HOST as FAMILY_GPUS_PER_HOST  # noqa: E402
from bench.trace_families import HOSTS as FAMILY_HOSTS  # noqa: E402
from service.scheduler.costs import MIN_RUN_S  # noqa: E402
from service.scheduler.live import collector_paused  # noqa: E402
from service.scheduler.policy import schedule  # noqa: E402
from service.scheduler.simulate import simulate  # noqa: E402
from service.scheduler.trace import TraceJob, read_trace  # noqa: E402
from service.scheduler.types import (  # noqa: E402
    Cluster,
    FairShare,
    HostCapacity,
    Policy,
    PolicyConfig,
    QueuedJob,
    RunningJob,
)

SHARES = (0.0, 1.0, 0.5)
PASSES = 100
"""The synthetic pass is timed this many times (its p99 and max are the goal's)."""
JCT_GOAL, WAIT_GOAL = 0.8, 1.0


def replay(work: tuple[str, int, float]) -> tuple[str, int, float, dict]:
    """One trace (the Philly file or a bootstrap of it: family "philly"; else a generated
    family's seed) replayed with `share` of its jobs on 2 to one host's GPUs elastic."""
    family, seed, share = work
    if family == "philly":
        jobs = read_trace(TRACE)
        sample, hosts, per_host = (bootstrap(jobs, seed) if seed else jobs), HOSTS, GPUS_PER_HOST
    else:
        sample, hosts, per_host = FAMILIES[family](seed), FAMILY_HOSTS, FAMILY_GPUS_PER_HOST
        for i, job in enumerate(sample):
            job.id = i
    config = PolicyConfig(demote_after_gpu_s=SLICE_GPU_S)
    result = simulate(copy.deepcopy(sample), hosts, per_host, Policy.TOWERQ, config=config, elastic=share)
    if share == 0.0:
        result["ideal_avg_jct_s"] = ideal_avg_jct(sample, hosts * per_host)
    return family, seed, share, result


def _pass_inputs(jobs: list[TraceJob], elastic: bool) -> tuple[list[QueuedJob], Cluster, FairShare, float]:
    """Every job of the file queued (elastic where it may be), every GPU held by an 8-GPU job
    past `MIN_RUN_S` (elastic, and so shrinkable, or not)."""
    now = max(j.submit for j in jobs) + 1
    hosts = [HostCapacity(f"h{i:03d}", [0.0] * GPUS_PER_HOST) for i in range(HOSTS)]
    extra = {"min_gpu_count": 1, "full_gpu_count": GPUS_PER_HOST} if elastic else {}
    running = [
        RunningJob(
            10**7 + i, jobs[i].user, 1, f"h{i:03d}", tuple(range(GPUS_PER_HOST)), 1.0, now - MIN_RUN_S - 60 * i, **extra
        )
        for i in range(HOSTS)
    ]
    queued = [
        QueuedJob(
            j.id, j.user, 1, j.gpu_count, 1.0, j.submit, min_gpu_count=1 if elastic and 1 < j.gpu_count <= 8 else None
        )
        for j in jobs
    ]
    usage = {user: 1000.0 * k for k, user in enumerate(sorted({j.user for j in jobs}))}
    return queued, Cluster(hosts, running), FairShare(usage=usage), now


def pass_times(jobs: list[TraceJob], elastic: bool, repeats: int = PASSES) -> list[float]:
    """The CPU ms of `repeats` passes over `_pass_inputs`, each with the collector paused as the
    live pass runs it (`collector_paused`)."""
    queued, cluster, fair, now = _pass_inputs(jobs, elastic)
    times = []
    for _ in range(repeats):
        started = time.thread_time()
        config = PolicyConfig(demote_after_gpu_s=SLICE_GPU_S)
        with collector_paused():
            schedule(queued, Cluster(cluster.hosts, cluster.running), fair, now, config)
        times.append((time.thread_time() - started) * 1000)
    return times


def collector_cost(jobs: list[TraceJob], repeats: int = PASSES) -> tuple[list[float], list[float]]:
    """The CPU ms of shrinkable passes with the queue built anew for each, as the live pass
    reads it from the database: `repeats` with the collector paused, `repeats` with it on,
    taking turns (the queue's building and what a pass leaves are collected untimed)."""
    paused: list[float] = []
    on: list[float] = []
    for k in range(2 * repeats):
        queued, cluster, fair, now = _pass_inputs(jobs, elastic=True)
        config = PolicyConfig(demote_after_gpu_s=SLICE_GPU_S)
        gc.collect(0)
        started = time.thread_time()
        with collector_paused() if k % 2 else contextlib.nullcontext():
            schedule(queued, cluster, fair, now, config)
        (paused if k % 2 else on).append((time.thread_time() - started) * 1000)
    return paused, on


def percentile_99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def spread(times: list[float]) -> str:
    """Median / p99 / max ms."""
    return f"{statistics.median(times):.1f} / {percentile_99(times):.1f} / {max(times):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="bootstraps beside the file (default 10)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--families", type=int, default=0, help="replay the trace families instead, N seeds each")
    parser.add_argument("--pass-only", action="store_true", help="time only the pass over 5,000 queued jobs")
    parser.add_argument(
        "--pass-trace", type=Path, default=TRACE, help="the jobs the timed pass queues (default: the Philly sample)"
    )
    args = parser.parse_args()
    if not args.pass_only:
        if args.families:
            traces = [(family, seed) for family in FAMILIES for seed in range(1, args.families + 1)]
            size = f"{FAMILY_HOSTS} hosts x {FAMILY_GPUS_PER_HOST} GPUs"
            print(f"trace families ({size}, slicing after {SLICE_GPU_S:g} GPU-s)")
        else:
            traces = [("philly", seed) for seed in range(args.seeds + 1)]
            print(
                f"Philly window ({HOSTS} hosts x {GPUS_PER_HOST} GPUs, slicing after {SLICE_GPU_S:g} GPU-s) and "
                f"{args.seeds} bootstraps"
            )
        report(traces, args.workers)
    jobs = read_trace(args.pass_trace)
    gc.freeze()  # what is loaded by now out of full collections, as the live scheduler at startup
    rigid, elastic = pass_times(jobs, elastic=False), pass_times(jobs, elastic=True)
    print(
        f"{PASSES} passes, {len(jobs)} queued, every GPU held by 8-GPU jobs, every job's reason: median / p99 / max "
        f"{spread(elastic)} ms CPU with elastic jobs (shrinkable), {spread(rigid)} ms with rigid ones "
        "(goal 20 ms p99 / 50 ms max)"
    )
    paused, on = collector_cost(jobs)
    print(
        f"with the queue built anew for each pass (as the live pass reads it), shrinkable: {spread(paused)} ms with "
        f"the collector paused during the pass (as the live pass), {spread(on)} ms with it on; "
        f"median ratio {statistics.median(paused) / statistics.median(on):.2f}"
    )


def report(traces: list[tuple[str, int]], workers: int) -> None:
    """Each trace replayed with no job elastic, all and half of them; ratios to the first."""
    work = [(family, seed, share) for family, seed in traces for share in SHARES]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = {(family, seed, share): result for family, seed, share, result in pool.map(replay, work)}
    print("ratios to the same trace with no job elastic")
    print(
        f"{'trace':<20}{'share':>6}{'avg JCT':>9}{'users':>7}{'max wait':>10}{'first':>7}{'p99':>7}{'util':>12}"
        f"{'resizes/job':>13}{'moves':>7}{'pass p99/max ms (none elastic)':>32}{'ideal':>7}"
    )
    met = {share: 0 for share in SHARES[1:]}
    worse = {share: 0 for share in SHARES[1:]}
    waits = {share: 0 for share in SHARES[1:]}
    firsts = {share: 0 for share in SHARES[1:]}
    p99s = {share: 0 for share in SHARES[1:]}
    users_worse = {share: 0 for share in SHARES[1:]}
    ratios: dict[float, list[float]] = {share: [] for share in SHARES[1:]}
    ideals = []
    for family, seed in traces:
        base = results[(family, seed, 0.0)]
        ideal = base["ideal_avg_jct_s"] / base["avg_jct_s"]
        ideals.append(ideal)
        for share in SHARES[1:]:
            got = results[(family, seed, share)]
            jct = got["avg_jct_s"] / base["avg_jct_s"]
            users = got["user_avg_jct_s"] / base["user_avg_jct_s"]
            users_worse[share] += users > 1.0
            wait = got["max_wait_s"] / base["max_wait_s"] if base["max_wait_s"] else 1.0
            first = got["max_first_wait_s"] / base["max_first_wait_s"] if base["max_first_wait_s"] else 1.0
            firsts[share] += first > 1.0
            p99 = got["p99_wait_s"] / base["p99_wait_s"] if base["p99_wait_s"] else 1.0
            p99s[share] += p99 > 1.0
            ratios[share].append(jct)
            met[share] += jct <= JCT_GOAL and wait <= WAIT_GOAL
            worse[share] += jct > 1.0
            waits[share] += wait > 1.0
            name = ("file" if seed == 0 else f"seed {seed}") if family == "philly" else f"{family} {seed}"
            util = f"{base['utilization']:.3f}>{got['utilization']:.3f}"
            cpu = f"{got['p99_pass_cpu_ms']:.1f}/{got['max_pass_cpu_ms']:.1f}"
            cpu += f" ({base['p99_pass_cpu_ms']:.1f}/{base['max_pass_cpu_ms']:.1f})"
            print(
                f"{name:<20}{share:>6.1f}{jct:>9.3f}{users:>7.3f}{wait:>10.3f}{first:>7.3f}{p99:>7.3f}{util:>12}{got['resizes_per_elastic_job']:>13.2f}"
                f"{got['moves']:>7}{cpu:>32}{ideal:>7.3f}"
            )
    for share in SHARES[1:]:
        print(
            f"share {share:.1f}: avg JCT ratio mean {statistics.mean(ratios[share]):.3f}, "
            f"worst {max(ratios[share]):.3f}, worse than none on {worse[share]} of {len(traces)} "
            f"(each user counted once on {users_worse[share]}; max wait on {waits[share]}, max wait for a first "
            f"start on {firsts[share]}, p99 wait on {p99s[share]}); "
            f"goal (avg JCT <= {JCT_GOAL}, max wait <= {WAIT_GOAL}) met on {met[share]} of {len(traces)}"
        )
    print(
        f"clairvoyant reference (bench/ideal.py): avg JCT ratio mean {statistics.mean(ideals):.3f}, "
        f"{min(ideals):.3f}-{max(ideals):.3f}"
    )


if __name__ == "__main__":
    main()
