"""bench/multihost.py runs end to end (one short repetition) and its bar holds: a killed,
a frozen and a stalled rank are each noticed within 30 s through the service."""

from __future__ import annotations

import pytest

from tests.benches import run_bench

BENCH_TIMEOUT_S = 900
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TIMEOUT_S + 60)]  # the bench's own timeout first


def test_the_multihost_bench_runs_and_notices_every_lost_rank_within_30_s() -> None:
    run = run_bench("bench/multihost.py", "--repeats", "1", "--steps", "60", timeout=BENCH_TIMEOUT_S)
    report = run.stdout[-4000:] + run.stderr[-3000:]
    assert run.returncode == 0 and "met: every loss noticed within 30 s" in run.stdout, report
    for how in ("killed", "frozen", "stalled", "frozen while starting"):
        assert f"  {how} " in run.stdout, report
    assert "tunnel / host network:" in run.stdout or "no sandbox on this machine" in run.stdout, report
    assert "2 hosts x 2 / 1 host x 4:" in run.stdout, report
