"""A resumed attempt restores its job's earlier points from the metrics log in the job's
folder, each naming the attempt that trained it (`"attempt": N`). The trainer writes that
file: a line naming attempt 9999 was stored as such, and over HTTP (a Slurm node, where the
API refuses a point of a later attempt) it failed the whole report, and with it the job.
A restored point's attempt is now at most the restoring one's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from towerq.contract import events
from towerq.contract.attempts import Stored
from worker.relay import MetricSink


def test_a_restored_point_cannot_claim_a_later_attempt(tmp_path: Path) -> None:
    channel: Any = SimpleNamespace(job_id=7, attempt=3, stored=lambda: Stored(log_bytes=0, metric_points=0))
    settings: Any = SimpleNamespace(artifacts_dir=tmp_path, job_metric_points_max=2_000_000)
    sink = MetricSink(channel, settings)
    for claimed in (9999, 2, None):
        line = {"event": "metric", "step": 10, "loss": 1.0, "attempt": claimed}
        sink.metric(events.Metric.model_validate(line), publish=False)
    assert [m["attempt"] for m in sink.metrics] == [3, 2, 3]
