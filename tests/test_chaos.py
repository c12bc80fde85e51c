"""Two minutes of chaos (bench/chaos.py): workers, trainers, the API and the scheduler
killed, Redis restarted, while three users' jobs run (every fourth over both hosts). Every
job succeeds exactly once, no metric step is duplicated or missing, nothing is left held or
running, no 5xx."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.stack import REPO

pytestmark = pytest.mark.slow


def test_two_minutes_of_chaos_leave_every_job_succeeded_once_and_nothing_behind() -> None:
    run = subprocess.run(
        [sys.executable, "bench/chaos.py", "--jobs", "16", "--minutes", "2", "--seed", "7"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert "NOT met" not in run.stdout, report
    assert run.returncode == 0, report
    assert "met: every job succeeded exactly once" in run.stdout, report
    assert "killed" in run.stdout, report
