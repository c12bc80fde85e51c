"""bench/dashboard.py keeps working (a small run; the real figures come from the full one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]
REPO = Path(__file__).resolve().parents[2]


def test_dashboard_bench_runs_and_prints_both_figures() -> None:
    args = ["--jobs", "40", "--metrics", "2000", "--loads", "2", "--points", "3"]
    done = subprocess.run(
        [sys.executable, "bench/dashboard.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "database: 40 jobs, 2000 metric rows" in done.stdout
    assert "jobs page, navigation to table drawn: median" in done.stdout
    assert "metric line to chart drawn: median" in done.stdout
