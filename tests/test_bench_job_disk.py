"""bench/job_disk.py runs (one small repetition) and prints each folder's row, a restart on
the kept image costing less than one with copies."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.benches import run_bench
from worker import disk_kind


def test_the_job_disk_bench_prints_an_attempts_overhead_per_folder_size() -> None:
    with tempfile.TemporaryDirectory() as name:
        why = disk_kind.images_work(Path(name))
    if why is not None:
        pytest.skip(f"no job disk images here: {why}")
    run = run_bench("bench/job_disk.py", "--sizes-mb", "0,5", "--repeats", "1", timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[1:]}
    assert set(rows) == {"empty", "5"}, run.stdout
    ratio, kept = rows["5"][5], rows["5"][-1]
    assert ratio.endswith("x") and float(ratio[:-1]) > 0, run.stdout
    assert kept.endswith("x") and 0 < float(kept[:-1]) < 1, run.stdout  # a kept image's restart copies nothing
