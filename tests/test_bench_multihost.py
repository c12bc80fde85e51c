"""bench/multihost.py runs end to end (one short repetition) and its bar holds: a frozen and
a stalled rank are each noticed within 30 s through the service. The bench's other losses
run through the service in test_multihost.py (a killed rank; one frozen while the ranks
start), so this run leaves them out (`--losses`)."""

from __future__ import annotations

import pytest

from tests.benches import run_bench

BENCH_TIMEOUT_S = 900
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BENCH_TIMEOUT_S + 60)]  # the bench's own timeout first


def test_the_multihost_bench_runs_and_notices_a_frozen_and_a_stalled_rank_within_30_s() -> None:
    args = ("--repeats", "1", "--steps", "60", "--losses", "frozen,stalled")
    run = run_bench("bench/multihost.py", *args, timeout=BENCH_TIMEOUT_S)
    report = run.stdout[-4000:] + run.stderr[-3000:]
    assert run.returncode == 0 and "met: every loss noticed within 30 s" in run.stdout, report
    for how in ("frozen", "stalled"):
        assert f"  {how} " in run.stdout, report
    assert "  killed " not in run.stdout, report
    assert "tunnel / host network:" in run.stdout or "no sandbox on this machine" in run.stdout, report
    assert "2 hosts x 2 / 1 host x 4:" in run.stdout, report


@pytest.mark.parametrize(("losses", "said"), [("frozen,drowned", "unknown drowned"), (",", "none given")])
def test_the_multihost_bench_refuses_losses_it_cannot_measure(losses: str, said: str) -> None:
    run = run_bench("bench/multihost.py", "--losses", losses, timeout=60)
    assert run.returncode == 2 and f"--losses: {said}" in run.stderr, run.stderr[-2000:]
