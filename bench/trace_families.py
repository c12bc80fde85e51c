"""The scheduling policy on generated trace families that stress what the Philly sample does
not, with the service's defaults (time slicing after one GPU-hour), against fit-first.

Four families, each generated from a seed (so every seed is a fresh draw of the family, and
the seeds the bench reports as held out were never looked at while choosing anything):

- `long-overload`: 64 GPUs (8 hosts x 8), 3,000 jobs over about three weeks in sustained
  overload (the jobs submitted ask for about twice the GPU time the cluster has); run times a mix of short
  (lognormal, median 20 min), medium (median 6 h) and long jobs (3 to 21 days, 5%); half
  of the one-GPU jobs share a GPU (memory fraction 0.5).
- `fractional`: 4,000 jobs on the same cluster near its capacity (load 0.9), three quarters of the
  one-GPU jobs sharing (fractions 0.25 and 0.5), medium and short jobs.
- `bursty`: a background load of 0.7 plus, every three days, a sweep of 200 short jobs
  submitted at once by one user.
- `flood`: a background load of 0.8 plus one user submitting 2,000 jobs in the first hour.

Each family's users draw their work Zipf-like (20 users, the heaviest ~30%). Printed per
family and seed: towerq's avg JCT and max wait as fractions of fit-first's (bars: <= 1.0
each), and the policy's pass time over the whole replay (p99 and max; bars 20 and 50 ms) in
CPU time, which the other replays running beside it on a shared machine do not inflate; the
wall-clock max is printed beside it. Then the same for the passes that also write the queue's
expected starts (`--starts-every`), as the service's pass does when it writes positions: the
pass with every job's reason and the first slice of the replay of the expected starts (max
judged against 50 ms); and the longest of the replay's further slices, which the service runs
between passes (shown: a pass asked for meanwhile waits at most that long).
Usage: `python bench/trace_families.py [--seeds N] [--held-out N] [--family NAME] [--time-slice S]`.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import random
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.core.settings import Settings  # noqa: E402
from service.scheduler.simulate import simulate  # noqa: E402
from service.scheduler.trace import TraceJob  # noqa: E402
from service.scheduler.types import Policy, PolicyConfig  # noqa: E402

HOSTS, GPUS_PER_HOST = 8, 8
CAPACITY = HOSTS * GPUS_PER_HOST
DAY = 86400.0
USERS = [f"u{i:02d}" for i in range(20)]
USER_WEIGHTS = [1 / (i + 1) for i in range(len(USERS))]
JCT_BAR, WAIT_BAR = 1.0, 1.0
PASS_P99_BAR_MS, PASS_MAX_BAR_MS = 20.0, 50.0
SLICE_GPU_S = float(Settings.model_fields["time_slice_gpu_s"].default)
STARTS_EVERY = 50
"""Every 50th arrival, the replay also times a pass as the service runs one when it writes
the queue (the positions, every job's reason, the expected starts): a few dozen such
passes a replay, enough for their maximum, not so many that they dominate its time."""


def _gpus(rng: random.Random) -> int:
    return rng.choices([1, 2, 4, 8], weights=[70, 15, 10, 5])[0]


def _short(rng: random.Random) -> float:
    return min(6 * 3600.0, rng.lognormvariate(math.log(1200), 1.0))


def _medium(rng: random.Random) -> float:
    return min(3 * DAY, rng.lognormvariate(math.log(6 * 3600), 0.8))


def _arrivals(rng: random.Random, jobs: list[tuple[float, int, float]], load: float) -> list[float]:
    """Poisson submit times for `jobs` (duration, gpus, fraction) at the rate at which they
    ask for `load` times the cluster's GPU time."""
    asked = sum(d * g * f for d, g, f in jobs)
    rate = len(jobs) / (asked / (load * CAPACITY))  # jobs per second
    t, times = 0.0, []
    for _ in jobs:
        t += rng.expovariate(rate)
        times.append(t)
    return times


def _draw(rng: random.Random, count: int, duration: Callable[[random.Random], float], sharing: float,
          fractions: tuple[float, ...] = (0.5,)) -> list[tuple[float, int, float]]:  # fmt: skip
    jobs = []
    for _ in range(count):
        gpus = _gpus(rng)
        fraction = rng.choice(fractions) if gpus == 1 and rng.random() < sharing else 1.0
        jobs.append((duration(rng), gpus, fraction))
    return jobs


def _trace(rng: random.Random, jobs: list[tuple[float, int, float]], times: list[float], users: list[str] | None = None
           ) -> list[TraceJob]:  # fmt: skip
    out = []
    for i, ((duration, gpus, fraction), t) in enumerate(zip(jobs, times, strict=True)):
        user = users[i] if users else rng.choices(USERS, weights=USER_WEIGHTS)[0]
        job = TraceJob(i, t, duration, gpus, user)
        job.fraction = fraction
        out.append(job)
    return out


def long_overload(seed: int) -> list[TraceJob]:
    rng = random.Random(f"long-overload-{seed}")

    def duration(r: random.Random) -> float:
        kind = r.random()
        return r.uniform(3 * DAY, 21 * DAY) if kind < 0.05 else _medium(r) if kind < 0.30 else _short(r)

    jobs = _draw(rng, 3000, duration, sharing=0.5)
    return _trace(rng, jobs, _arrivals(rng, jobs, 2.0))


def fractional(seed: int) -> list[TraceJob]:
    rng = random.Random(f"fractional-{seed}")
    jobs = _draw(rng, 4000, lambda r: _medium(r) if r.random() < 0.3 else _short(r), 0.75, (0.25, 0.5))
    return _trace(rng, jobs, _arrivals(rng, jobs, 0.9))


def bursty(seed: int) -> list[TraceJob]:
    rng = random.Random(f"bursty-{seed}")
    jobs = _draw(rng, 3000, lambda r: _medium(r) if r.random() < 0.3 else _short(r), 0.3)
    trace = _trace(rng, jobs, _arrivals(rng, jobs, 0.7))
    end = max(j.submit for j in trace)
    t = DAY
    while t < end:
        owner = rng.choices(USERS, weights=USER_WEIGHTS)[0]
        for _ in range(200):
            job = TraceJob(len(trace), t, _short(rng), 1, owner)
            trace.append(job)
        t += 3 * DAY
    return sorted(trace, key=lambda j: (j.submit, j.id))


def flood(seed: int) -> list[TraceJob]:
    rng = random.Random(f"flood-{seed}")
    jobs = _draw(rng, 3000, lambda r: _medium(r) if r.random() < 0.3 else _short(r), 0.3)
    trace = _trace(rng, jobs, _arrivals(rng, jobs, 0.8))
    for _ in range(2000):
        trace.append(TraceJob(len(trace), rng.uniform(0, 3600), _short(rng), 1, "flooder"))
    return sorted(trace, key=lambda j: (j.submit, j.id))


FAMILIES: dict[str, Callable[[int], list[TraceJob]]] = {
    "long-overload": long_overload,
    "fractional": fractional,
    "bursty": bursty,
    "flood": flood,
}


def replay(work: tuple[str, int, float, int]) -> tuple[str, int, dict, dict]:
    family, seed, slice_gpu_s, starts_every = work
    jobs = FAMILIES[family](seed)
    for i, job in enumerate(jobs):
        job.id = i
    towerq = simulate(copy.deepcopy(jobs), HOSTS, GPUS_PER_HOST, Policy.TOWERQ,
                      config=PolicyConfig(demote_after_gpu_s=slice_gpu_s), estimates_every=starts_every)  # fmt: skip
    fit_first = simulate(copy.deepcopy(jobs), HOSTS, GPUS_PER_HOST, Policy.FIT_FIRST)
    return family, seed, towerq, fit_first


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per family looked at (default 5)")
    parser.add_argument("--held-out", type=int, default=5, help="seeds per family never looked at (default 5)")
    parser.add_argument("--family", choices=list(FAMILIES), action="append", default=None)
    parser.add_argument("--time-slice", type=float, default=SLICE_GPU_S, help="GPU-seconds; 0: no slicing")
    parser.add_argument(
        "--starts-every",
        type=int,
        default=STARTS_EVERY,
        help=f"time a pass that also writes expected starts at every Nth arrival (default {STARTS_EVERY}; 0: none)",
    )
    args = parser.parse_args()
    families = args.family or list(FAMILIES)
    seeds = range(1, 1 + args.seeds + args.held_out)
    work = [(family, seed, args.time_slice, args.starts_every) for family in families for seed in seeds]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(replay, work))
    print(f"{CAPACITY} GPUs ({HOSTS} x {GPUS_PER_HOST}); towerq with time slicing after {args.time_slice:g} GPU-s")
    print(f"{'family':<14} {'seed':>4} {'jobs':>5} {'avg JCT':>8} {'max wait':>9} {'frag t/f':>11}"
          f" {'pass p99':>9} {'pass max':>9} {'wall max':>9} {'+starts p99':>11} {'+starts max':>11}"
          f" {'slice max':>9}")  # fmt: skip
    met_all = True
    for family in families:
        rows = [r for r in results if r[0] == family]
        for _, seed, towerq, fit_first in rows:
            jct = towerq["avg_jct_s"] / fit_first["avg_jct_s"]
            wait = towerq["max_wait_s"] / fit_first["max_wait_s"] if fit_first["max_wait_s"] else math.nan
            ok = jct <= JCT_BAR and wait <= WAIT_BAR and towerq["p99_pass_cpu_ms"] <= PASS_P99_BAR_MS
            ok = ok and towerq["max_pass_cpu_ms"] <= PASS_MAX_BAR_MS
            starts = (towerq.get("p99_pass_with_starts_cpu_ms", 0.0), towerq.get("max_pass_with_starts_cpu_ms", 0.0))
            ok = ok and starts[1] <= PASS_MAX_BAR_MS  # (their p99 is of a few dozen passes: shown, not judged)
            met_all &= ok
            held = " (held out)" if seed > args.seeds else ""
            print(
                f"{family:<14} {seed:>4} {towerq['jobs']:>5} {jct:>8.3f} {wait:>9.3f}"
                f" {towerq['fragmentation']:>5.2f}/{fit_first['fragmentation']:<5.2f}"
                f" {towerq['p99_pass_cpu_ms']:>7.1f}ms {towerq['max_pass_cpu_ms']:>7.1f}ms"
                f" {towerq['max_pass_ms']:>7.1f}ms {starts[0]:>9.1f}ms {starts[1]:>9.1f}ms"
                f" {towerq.get('max_forecast_slice_cpu_ms', 0.0):>7.1f}ms"
                f"{'' if ok else '  (missed)'}{held}"
            )
        jcts = [r[2]["avg_jct_s"] / r[3]["avg_jct_s"] for r in rows]
        both = sum(
            1 for r in rows if r[2]["avg_jct_s"] <= r[3]["avg_jct_s"] and r[2]["max_wait_s"] <= r[3]["max_wait_s"]
        )
        print(f"{family:<14} mean avg JCT {statistics.mean(jcts):.3f}; both bars met on {both} of {len(rows)}")
    print("every bar on every family and seed:", "met" if met_all else "NOT met")


if __name__ == "__main__":
    main()
