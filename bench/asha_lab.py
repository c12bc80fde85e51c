"""Adaptive sweeps at lab scale: the queue time a lab's sweeps give back with ASHA.

A lab of `--hosts` x `--gpus-per-host` GPUs replayed through the scheduler's simulator (the
engine of `towerq simulate`, with the live policy): its members' jobs are the Philly sample's
(those that fit on one host, thinned at random to `--background-load` of the lab's GPUs over
the trace's span), and beside them sweeps, submitted at random times by four members, enough
for `--sweep-load` of the lab's GPUs when every setting trains to the end. Each sweep is the
search `bench/asha.py` ran for real: its settings' learning curves (eval accuracy at each
evaluation) and their run times, from `--curves` (written by `bench/asha.py --curves`),
scaled so that the mean setting lasts as long as the trace's mean one-GPU job.

Replayed twice, side by side: every setting to the end (the full search), then the same
trace with ASHA (`--min-steps`, `--factor`): a setting stops at the rung where the settings
that reached it before it leave it behind, decided by `service.jobs.asha.judge`, the
searcher's own rule; it then holds its GPU only until that rung (plus `STOP_S`, the stop's
latency measured on this machine). Which settings reached a rung first depends on when each
started, which depends on the decisions: they are taken from the previous replay's start
times, and the ASHA replay is repeated until the decisions no longer change, at most
`ROUNDS` times (how many still change is printed).

Printed: the sweeps' GPU-hours, the other jobs' mean and p95 wait, the time from a sweep's
submit to its last setting's end, and the best eval accuracy each sweep found.

Usage: `python bench/asha_lab.py [--curves bench/data/asha-curves.json] [--hosts 4]
[--gpus-per-host 4] [--background-load 0.6] [--sweep-load 0.4] [--seeds 5]`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.jobs.asha import EarlyStopping, judge  # noqa: E402
from service.scheduler.simulate import simulate  # noqa: E402
from service.scheduler.trace import TraceJob, read_trace  # noqa: E402
from service.scheduler.types import Policy  # noqa: E402

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "data" / "philly_2017-10-23_5000.csv"
CURVES = HERE / "data" / "asha-curves.json"
STOP_S = 3.0
"""From a setting's evaluation at a rung to its GPU free (bench/asha.py's stops, 2-3 s)."""
ROUNDS = 6
SWEEPERS = 4
FIRST_SWEEP_JOB = 10_000_000
"""Sweep s's setting i is job FIRST_SWEEP_JOB + 1000 s + i (the trace's jobs are numbered below)."""


@dataclass(frozen=True)
class Setting:
    """One setting of the search: its steps, its run time to the end (s), its eval accuracy by step."""

    steps: int
    seconds: float
    accuracy: dict[int, float]

    def at(self, step: int) -> float | None:
        """Its eval accuracy at `step` (None where it has none: the worst)."""
        return self.accuracy.get(step)

    def until(self, step: int) -> float:
        """Its run time to `step`."""
        return self.seconds * step / self.steps

    @property
    def final(self) -> float:
        return self.accuracy.get(self.steps, max(self.accuracy.values(), default=0.0))


@dataclass(frozen=True)
class Lab:
    background: list[TraceJob]
    sweeps: list[tuple[float, str]]
    """Each sweep's submit time and member."""
    settings: list[Setting]
    hosts: int
    gpus_per_host: int

    def sweep_job_id(self, sweep: int, setting: int) -> int:
        return FIRST_SWEEP_JOB + sweep * 1000 + setting

    def sweep_and_setting(self, job_id: int) -> tuple[int, int] | None:
        """(its sweep, its setting) for a sweep's job; None for another job."""
        return divmod(job_id - FIRST_SWEEP_JOB, 1000) if job_id >= FIRST_SWEEP_JOB else None


def read_curves(path: Path, mean_s: float) -> list[Setting]:
    """The search's settings, their run times scaled so that the mean is `mean_s`."""
    raw = json.loads(path.read_text())["curves"]
    scale = mean_s / statistics.mean(c["seconds"] for c in raw)
    return [
        Setting(c["steps"], c["seconds"] * scale, {int(step): value for step, value in c["eval_accuracy"].items()})
        for c in raw
    ]


def build_lab(args: argparse.Namespace, seed: int) -> Lab:
    rng = random.Random(seed)
    trace = [j for j in read_trace(args.trace) if j.gpu_count <= args.gpus_per_host]
    span = max(j.submit for j in trace) - min(j.submit for j in trace)
    capacity_s = args.hosts * args.gpus_per_host * span
    offered = sum(j.duration * j.gpu_count for j in trace)
    keep = min(1.0, args.background_load * capacity_s / offered)
    background = [j for j in trace if rng.random() < keep]
    one_gpu = [j.duration for j in trace if j.gpu_count == 1]
    settings = read_curves(args.curves, statistics.mean(one_gpu))
    per_sweep = sum(s.seconds for s in settings)
    count = max(1, round(args.sweep_load * capacity_s / per_sweep))
    sweeps = sorted((rng.uniform(0, span), f"sweeper-{i % SWEEPERS}") for i in range(count))
    return Lab(background, sweeps, settings, args.hosts, args.gpus_per_host)


def jobs_of(lab: Lab, run_s: dict[int, float]) -> list[TraceJob]:
    """The lab's trace, each sweep setting holding its GPU for `run_s` (by job id; default: to the end)."""
    jobs = [TraceJob(j.id, j.submit, j.duration, j.gpu_count, j.user) for j in lab.background]
    for s, (submit, user) in enumerate(lab.sweeps):
        for i, setting in enumerate(lab.settings):
            job_id = lab.sweep_job_id(s, i)
            jobs.append(TraceJob(job_id, submit, run_s.get(job_id, setting.seconds), 1, user))
    return sorted(jobs, key=lambda j: (j.submit, j.id))


def decide(lab: Lab, starts: dict[int, float], early: EarlyStopping) -> dict[int, int]:
    """ASHA's stops, given when each setting started: job id -> the rung's step where it stops."""
    stops: dict[int, int] = {}
    for s in range(len(lab.sweeps)):
        arrivals = []
        for i, setting in enumerate(lab.settings):
            job_id = lab.sweep_job_id(s, i)
            for k, step in enumerate(early.rungs(setting.steps)):
                arrivals.append((starts[job_id] + setting.until(step), k, step, job_id, i))
        earlier: dict[int, list[float | None]] = defaultdict(list)
        for _, k, step, job_id, i in sorted(arrivals):
            if job_id in stops:
                continue  # stopped at an earlier rung: it never gets here
            value = lab.settings[i].at(step)
            goes_on, _ = judge(earlier[k], value, "max", early.reduction_factor)
            earlier[k].append(value)
            if not goes_on:
                stops[job_id] = step
    return stops


def replay(lab: Lab, run_s: dict[int, float]) -> tuple[dict[str, Any], list[TraceJob]]:
    jobs = jobs_of(lab, run_s)
    return simulate(jobs, lab.hosts, lab.gpus_per_host, Policy.TOWERQ), jobs


def figures(lab: Lab, jobs: list[TraceJob], stops: dict[int, int]) -> dict[str, float]:
    others = [j.waited for j in jobs if lab.sweep_and_setting(j.id) is None]
    ends: dict[int, float] = defaultdict(float)
    gpu_s = 0.0
    for j in jobs:
        if (found := lab.sweep_and_setting(j.id)) is not None:
            assert j.start is not None, f"sweep job {j.id} never started"
            ends[found[0]] = max(ends[found[0]], j.start + j.duration)
            gpu_s += j.duration
    best = [
        max(setting.final for i, setting in enumerate(lab.settings) if lab.sweep_job_id(s, i) not in stops)
        for s in range(len(lab.sweeps))
    ]
    return {
        "gpu_h": gpu_s / 3600,
        "wait_mean_h": statistics.mean(others) / 3600,
        "wait_p95_h": statistics.quantiles(others, n=20)[-1] / 3600,
        "sweep_h": statistics.mean(ends[s] - submit for s, (submit, _) in enumerate(lab.sweeps)) / 3600,
        "best": 100 * statistics.mean(best),
    }


def one_lab(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The full search's and ASHA's figures for the lab of `seed`."""
    lab = build_lab(args, seed)
    early = EarlyStopping(min_steps=args.min_steps, reduction_factor=args.factor)
    full_metrics, full_jobs = replay(lab, {})
    starts = {j.id: j.start for j in full_jobs if j.start is not None}
    stops: dict[int, int] = {}
    rounds, changed = 0, -1
    while rounds < ROUNDS and changed != 0:
        rounds += 1
        new = decide(lab, starts, early)
        changed = len(set(new.items()) ^ set(stops.items())) if rounds > 1 else -1
        stops = new
        run_s = {job_id: lab.settings[job_id % 1000].until(step) + STOP_S for job_id, step in stops.items()}
        _, asha_jobs = replay(lab, run_s)
        starts = {j.id: j.start for j in asha_jobs if j.start is not None}
    return {
        "lab": lab,
        "full": figures(lab, full_jobs, {}),
        "asha": figures(lab, asha_jobs, stops),
        "stopped": len(stops) / (len(lab.sweeps) * len(lab.settings)),
        "changed": max(changed, 0),
        "utilization": full_metrics["utilization"],
    }


ROWS = [
    ("sweeps' GPU-hours", "gpu_h", "{:.0f}"),
    ("other jobs' mean wait (h)", "wait_mean_h", "{:.2f}"),
    ("other jobs' p95 wait (h)", "wait_p95_h", "{:.2f}"),
    ("a sweep's submit to its end (h)", "sweep_h", "{:.1f}"),
    ("a sweep's best eval accuracy (%)", "best", "{:.2f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--curves", type=Path, default=CURVES)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gpus-per-host", type=int, default=4)
    parser.add_argument("--background-load", type=float, default=0.6)
    parser.add_argument("--sweep-load", type=float, default=0.4)
    parser.add_argument("--min-steps", type=int, help="the first rung (default: the curves' first evaluation)")
    parser.add_argument("--factor", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5, help="labs drawn (the trace's thinning, the sweeps' times)")
    args = parser.parse_args()
    curves = json.loads(args.curves.read_text())
    args.min_steps = (
        args.min_steps or curves.get("eval_every") or min(int(s) for s in curves["curves"][0]["eval_accuracy"])
    )
    early = EarlyStopping(min_steps=args.min_steps, reduction_factor=args.factor)
    missing = [
        step
        for step in early.rungs(curves["curves"][0]["steps"])
        for c in curves["curves"]
        if str(step) not in c["eval_accuracy"]
    ]
    if missing:
        parser.error(f"--min-steps {args.min_steps}: the curves have no evaluation at step {missing[0]} (a rung)")
    labs = [one_lab(args, seed) for seed in range(1, args.seeds + 1)]

    lab: Lab = labs[0]["lab"]
    gpus = args.hosts * args.gpus_per_host
    setting_h = statistics.mean(s.seconds for s in lab.settings) / 3600
    print(
        f"a lab of {gpus} GPUs ({args.hosts} hosts x {args.gpus_per_host}), policy towerq: jobs of the Philly sample "
        f"({args.background_load:.0%} of its GPUs) and sweeps of {len(lab.settings)} settings ({args.sweep_load:.0%} "
        f"when trained to the end; a setting {setting_h:.1f} h on 1 GPU on average, {len(lab.sweeps)} sweeps), "
        f"curves from {args.curves.name}; ASHA min_steps {args.min_steps}, reduction_factor {args.factor}; "
        f"median of {args.seeds} labs drawn"
    )
    print(f"  {'':<34} {'full search':>12} {'ASHA':>10} {'ASHA / full':>12}  (each lab's ratio)")
    for name, key, shape in ROWS:
        full = statistics.median(one["full"][key] for one in labs)
        asha = statistics.median(one["asha"][key] for one in labs)
        ratios = [one["asha"][key] / one["full"][key] if one["full"][key] else float("nan") for one in labs]
        each = ", ".join(f"{r:.2f}" for r in ratios)
        both = f"{shape.format(full):>12} {shape.format(asha):>10}"
        print(f"  {name:<34} {both} {statistics.median(ratios):>12.3f}  ({each})")
    stopped = statistics.median(one["stopped"] for one in labs)
    utilization = statistics.median(one["utilization"] for one in labs)
    print(f"  stopped early: {stopped:.0%} of the settings; GPU utilization with the full search {utilization:.2f}")
    decisions = len(lab.sweeps) * len(lab.settings)
    changed = [one["changed"] for one in labs]
    print(f"  ASHA's decisions that changed in its last replay (at most {ROUNDS}), each lab: {changed} of {decisions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
