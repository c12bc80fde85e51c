"""bench/trainer_start.py runs (one start a side) and prints both sides and their ratio."""

from __future__ import annotations

import re

import pytest

from tests.benches import run_bench

pytestmark = pytest.mark.slow  # two trainer processes: TensorFlow loads in each


def test_the_trainer_start_bench_prints_both_sides_and_their_ratio() -> None:
    run = run_bench("bench/trainer_start.py", "--repeats", "1", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    for side in ("scikit-learn hidden (towerq)", "Keras imports it (control)"):
        assert re.search(rf"{re.escape(side)} +\d+\.\d\d s wall +\d+\.\d\d s CPU", run.stdout), run.stdout
    assert re.search(r"hidden / control: wall \d\.\d{3}, CPU \d\.\d{3}", run.stdout), run.stdout
