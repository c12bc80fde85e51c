"""A job's latest figures keep each metric of its own its program ever named, the newest
value (`worker.latest`): a program that names a new metric at every step, or sends names
of towerq's columns as its own, must not grow its job's row nor change its other columns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from towerq.contract.attempts import MetricRow
from worker.latest import LATEST_OWN_NAMES, LatestFigures


def row(
    step: int, split: Literal["train", "eval"], custom: dict[str, float | None], loss: float | None = None
) -> MetricRow:
    return MetricRow(
        job_id=1, attempt=1, step=step, split=split, loss=loss, accuracy=None, learning_rate=None,
        examples_per_sec=None, custom=custom, time=datetime.now(UTC),
    )  # fmt: skip


def test_a_new_name_at_every_step_keeps_the_newest_names_alone() -> None:
    figures = LatestFigures()
    for step in range(100_000):
        train = figures.of(row(step, "train", {f"m{step}": 1.0, f"n{step}": 2.0}), None)
        held_out = figures.of(row(step, "eval", {f"e{step}": 3.0}), None)
    assert list(train["custom_metrics"]) == [f"{n}{step}" for step in range(99_984, 100_000) for n in "mn"]
    assert list(held_out["eval_custom_metrics"]) == [f"e{step}" for step in range(100_000 - LATEST_OWN_NAMES, 100_000)]
    assert all(len(kept) == LATEST_OWN_NAMES for kept in figures.own.values())


def test_names_of_towerqs_columns_stay_in_its_own_metrics() -> None:
    figures = LatestFigures()
    changed = figures.of(row(5, "train", {"loss": 9.0, "step": 10**9, "error": 1.0}, loss=0.5), None)
    assert (changed["step"], changed["loss"]) == (5, 0.5)
    assert changed["custom_metrics"] == {"loss": 9.0, "step": 1e9, "error": 1.0}
    assert set(changed) == {"step", "loss", "accuracy", "examples_per_sec", "step_time_s", "custom_metrics"}
