"""A job's latest figures (its row's `loss`, `accuracy`, `custom_metrics`, ...), from its
points as they come: what the jobs list, `towerq show` and a sweep's result read.

A program may say a step's numbers in several points (its loss, then a metric of its own; a
framework's training log, then its evaluation's with the epoch; a run's summary): a point of
metrics of its own alone leaves the loss and accuracy as they were (a point with no figure
at all, a NaN loss, says them missing), and each metric of its own is its newest value, of
whichever point said it, at most `LATEST_OWN_NAMES` a split, the newest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from towerq.contract.attempts import MetricRow

LATEST_OWN_NAMES = 32
"""The metrics of its own a job's latest figures keep per split: twice what one point may
carry (`events.MAX_CUSTOM_METRICS`), so a program that names new ones at each step does not
grow its job's row."""


class LatestFigures:
    """One attempt's latest figures: `of` each point, in the order they come."""

    def __init__(self) -> None:
        self.own: dict[str, dict[str, float | None]] = {"train": {}, "eval": {}}
        """The latest value of each metric of its own, by split."""

    def of(self, point: MetricRow, step_time_s: float | None) -> dict[str, Any]:
        """The job's columns `point` changes, and to what."""
        own = point["custom"] or {}
        figures = not own or point["loss"] is not None or point["accuracy"] is not None
        if point["split"] == "eval":
            changed: dict[str, Any] = {}
            if figures:
                changed.update(eval_loss=point["loss"], eval_accuracy=point["accuracy"])
            if own:
                changed.update(eval_custom_metrics=self._own_latest("eval", own))
            return changed
        changed = {"step": point["step"]}
        if figures or point["examples_per_sec"] is not None:
            changed.update(
                loss=point["loss"],
                accuracy=point["accuracy"],
                examples_per_sec=point["examples_per_sec"],
                step_time_s=step_time_s,
            )
        if own:
            changed.update(custom_metrics=self._own_latest("train", own))
        return changed

    def _own_latest(self, split: str, own: Mapping[str, float | None]) -> dict[str, float | None]:
        """The latest value of each metric of its own in `split`, `own` the newest."""
        kept = self.own[split]
        for name, value in own.items():
            kept.pop(name, None)
            kept[name] = value
        while len(kept) > LATEST_OWN_NAMES:
            del kept[next(iter(kept))]  # the one said longest ago
        return dict(kept)
