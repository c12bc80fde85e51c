"""Two minutes of chaos (bench/chaos.py): workers, trainers, the API and the scheduler
killed, Redis restarted, while three users' jobs run (every fourth over both hosts). Every
job succeeds exactly once, no metric step is duplicated or missing, nothing is left held or
running, no 5xx."""

from __future__ import annotations

import pytest

from tests.benches import run_bench

BENCH_TIMEOUT_S = 900
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TIMEOUT_S + 60)]  # the bench's own timeout first


def test_two_minutes_of_chaos_leave_every_job_succeeded_once_and_nothing_behind() -> None:
    run = run_bench("bench/chaos.py", "--jobs", "16", "--minutes", "2", "--seed", "7", timeout=BENCH_TIMEOUT_S)
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert "NOT met" not in run.stdout, report
    assert run.returncode == 0, report
    assert "met: every job succeeded exactly once" in run.stdout, report
    assert "killed" in run.stdout, report
