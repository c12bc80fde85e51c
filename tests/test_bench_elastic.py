"""bench/elastic.py's timing of the 5,000-queued pass: median / p99 / max of its passes, and
the script's `--pass-only` run (its figures are the machine's; here only that it runs and
says them)."""

from __future__ import annotations

import re

from bench.elastic import spread
from tests.benches import run_bench
from tests.stack import REPO

FIRST_1500 = REPO / "tests" / "service" / "scheduler" / "data" / "philly_first_1500.csv"


def test_the_spread_is_median_p99_and_max() -> None:
    assert spread([float(ms) for ms in range(100, 0, -1)]) == "50.5 / 99.0 / 100.0"
    assert spread([3.0, 1.0, 2.0]) == "2.0 / 3.0 / 3.0"  # fewer than 100 passes: p99 is the max


def test_the_pass_only_run_times_both_passes() -> None:
    # The tests' copy of the trace's first 1,500 jobs (the sample itself is beside the repository)
    run = run_bench("bench/elastic.py", "--pass-only", "--pass-trace", str(FIRST_1500), timeout=300)
    assert run.returncode == 0, run.stderr
    figures = r"(\d+\.\d) / (\d+\.\d) / (\d+\.\d)"
    found = re.search(
        rf"100 passes, 1500 queued.*max {figures} ms CPU with elastic.*, {figures} ms with rigid", run.stdout
    )
    assert found is not None, run.stdout
    values = [float(v) for v in found.groups()]
    assert all(0 < v for v in values) and values[0] <= values[1] <= values[2] and values[3] <= values[4] <= values[5]
