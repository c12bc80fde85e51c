"""bench/asha_lab.py: ASHA's decisions in the order the settings reach the rungs (a
hand-worked sweep of three), and the replay at lab scale runs end to end on the curves
checked in beside it (with the first 1,500 jobs of the Philly sample kept with the tests:
../shared is not in every checkout)."""

from __future__ import annotations

import subprocess
import sys

from bench.asha_lab import CURVES, Lab, Setting, decide
from service.jobs.asha import EarlyStopping
from tests.service.scheduler.test_simulate import PHILLY
from tests.stack import REPO


def test_a_setting_is_judged_against_those_that_reached_the_rung_before_it() -> None:
    # 400 steps in 400 s, rungs at 100 and 200 (factor 2): at step 100, a 0.5, b 0.7, c 0.6
    curves = [{100: 0.5, 200: 0.55}, {100: 0.7, 200: 0.72}, {100: 0.6, 200: 0.8}]
    lab = Lab([], [(0.0, "sweeper-0")], [Setting(400, 400.0, curve) for curve in curves], 1, 4)
    a, b, c = (lab.sweep_job_id(0, i) for i in range(3))
    early = EarlyStopping(min_steps=100, reduction_factor=2)
    # a first (alone: goes on), then b (best of 2), then c (behind b, keep 1 of 3): c stops at
    # 100; at 200, a first goes on, b (second, better: keep 1 of 2) goes on
    assert decide(lab, {a: 0.0, b: 10.0, c: 20.0}, early) == {c: 100}
    # c first and b next: a comes third at 100, behind both (keep 1 of 3): stopped; at 200 c
    # (0.8) first, b 0.72 behind it (keep 1 of 2): stopped
    assert decide(lab, {c: 0.0, b: 10.0, a: 20.0}, early) == {a: 100, b: 200}


def test_the_lab_replay_runs_and_asha_spends_fewer_gpu_hours() -> None:
    assert CURVES.is_file()
    run = subprocess.run(
        [sys.executable, "bench/asha_lab.py", "--seeds", "1", "--trace", str(PHILLY)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    row = next(line for line in run.stdout.splitlines() if "sweeps' GPU-hours" in line)
    full, asha, ratio = (float(value) for value in row.split()[2:5])
    assert asha < full and 0 < ratio < 1, run.stdout
    assert "a sweep's best eval accuracy" in run.stdout and "other jobs' mean wait" in run.stdout, run.stdout
