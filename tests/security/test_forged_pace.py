"""A job's expected end is told from the train points its worker receives (`worker.pace.Pace`):
what a trainer prints cannot make the worker keep more than a bounded number of them, and the
times it writes on its lines are its word, not used: the worker's own clock times each point."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from towerq.contract import events
from towerq.contract.attempts import Stored
from worker.pace import Pace
from worker.relay import MetricSink


def metric_line(step: int, time: float) -> events.TrainerEvent:
    line = {"event": "metric", "time": time, "step": step, "loss": 1.0, "accuracy": None,
            "learning_rate": 0.1, "examples_per_sec": 1.0, "step_time_s": 0.001}  # fmt: skip
    event = events.decode(json.dumps(line))
    assert isinstance(event, events.Metric), event
    return event


def test_a_flood_of_points_keeps_a_bounded_few_and_forged_times_are_not_taken(tmp_path: Path) -> None:
    channel: Any = SimpleNamespace(job_id=7, attempt=1, stored=lambda: Stored(log_bytes=0, metric_points=0))
    settings: Any = SimpleNamespace(artifacts_dir=tmp_path, job_metric_points_max=2_000_000)
    sink = MetricSink(channel, settings)
    before = datetime.now(UTC)
    for step in range(1, 20_001):  # "finished in 1970": every line says time 0
        sink.metric(metric_line(step, 0.0))
        sink.metrics.clear()  # what a flush would take away; the pace's points stay with the sink
    assert len(sink.paces.points) <= Pace.KEPT
    assert sink.latest["step_at"] >= before, "the worker's clock, not the line's"
    assert sink.latest["pace_s"] is not None and 0 <= sink.latest["pace_s"] < 1
    end = sink.latest["step_at"] + timedelta(seconds=sink.latest["pace_s"] * 1000)
    assert end > before, "no forged time puts the expected end in the past"
