"""bench/ideal.py: the clairvoyant reference's average JCT on hand-worked traces (shortest
remaining GPU time first on one pool of GPUs, a job that does not fit waiting while later
ones start)."""

from __future__ import annotations

import pytest

from bench.ideal import ideal_avg_jct
from service.scheduler.trace import TraceJob


def job(job_id: int, submit: float, run_s: float, gpus: int = 1) -> TraceJob:
    return TraceJob(job_id, submit, run_s, gpus, "alice")


def test_the_job_with_the_least_work_left_runs_first_and_a_longer_one_is_stopped_for_it() -> None:
    # one GPU: a (10 s) alone until b (2 s) comes at 4: a has 6 left, b runs, then a
    # ends at 12 (JCT 12), b at 6 (JCT 2)
    assert ideal_avg_jct([job(1, 0, 10), job(2, 4, 2)], 1) == pytest.approx(7.0)
    # first come is not first served: c (1 s) before a (10 s), both at 0
    assert ideal_avg_jct([job(1, 0, 10), job(3, 0, 1)], 1) == pytest.approx((11 + 1) / 2)


def test_work_is_gpus_times_time_and_a_job_that_does_not_fit_waits_while_others_start() -> None:
    # 2 GPUs: wide (2 GPUs x 3 s = 6 GPU-s) and two of 1 GPU x 4 s (4 GPU-s each) at 0: the
    # two narrow ones first (less work), to 4; wide from 4 to 7
    assert ideal_avg_jct([job(1, 0, 3, gpus=2), job(2, 0, 4), job(3, 0, 4)], 2) == pytest.approx((7 + 4 + 4) / 3)
    # 3 GPUs: wide (2 x 5 = 10) first, then a (1 x 20) beside it while the third GPU is free
    assert ideal_avg_jct([job(1, 0, 5, gpus=2), job(2, 0, 20)], 3) == pytest.approx((5 + 20) / 2)


def test_a_job_larger_than_the_pool_is_left_out_as_the_replays_leave_it() -> None:
    assert ideal_avg_jct([job(1, 0, 10, gpus=9), job(2, 0, 3)], 8) == pytest.approx(3.0)
    assert ideal_avg_jct([], 8) == 0.0
