"""bench/job_disk.py runs (one small repetition) and prints each folder's row."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.benches import run_bench
from worker import disk


def test_the_job_disk_bench_prints_an_attempts_overhead_per_folder_size() -> None:
    with tempfile.TemporaryDirectory() as name:
        why = disk.images_work(Path(name))
    if why is not None:
        pytest.skip(f"no job disk images here: {why}")
    run = run_bench("bench/job_disk.py", "--sizes-mb", "0,5", "--repeats", "1", timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[1:]}
    assert set(rows) == {"empty", "5"}, run.stdout
    assert rows["5"][-1].endswith("x") and float(rows["5"][-1][:-1]) > 0, run.stdout
