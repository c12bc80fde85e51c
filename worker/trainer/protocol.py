"""The trainer's JSON-lines protocol on stdout: one JSON object per line, flushed at once.
Its typed form, with the bounds the worker applies, is `towerq.contract.events` (`decode`).

Every line has `event` and `time` (Unix seconds). Events:

- `started`: `pid` (the trainer's own; in the sandbox not the worker's child), `towers`,
  `devices`, `cuda_visible_devices`, `simulated`, `memory_limit_enforced`, `memory_limit_mb`,
  `variable_device`, `global_batch`, `tower_batches`, `resumed_from_step` (null on a fresh start), `total_steps`.
- `metric`: `step`, `loss`, `accuracy` (null for regressions), `learning_rate`,
  `examples_per_sec`, `step_time_s`; loss and accuracy are averages over the towers;
  the two speeds are over the steps since the previous `metric`, training time only
  (evaluations and checkpoints in between are left out).
- `eval`: `step`, `loss`, `accuracy`, `examples` (held-out split; EMA weights when set).
- `metric` and `eval` also carry `metrics` (name -> value) when the user's model module
  defines `metrics(labels, logits)`: per-example values averaged like accuracy. A command
  job's `metric` may carry `total_steps` (`towerq.report`); the trainer's never does (a
  model job's steps are its spec's).
- `log`: `level` (`info` | `warning` | `error`), `message`.
- `checkpoint`: `step`, `path`.
- `stopped`: `step` (SIGTERM received; a checkpoint was written first).
- `done`: `step`, `final` (the last eval), `seconds`; before it, the run writes its last
  checkpoint and exports the trained model as `model.keras` (a `log` line says which).
- `error`: `kind` (`spec`, `dataset`, `model`, `device`, `nan_loss`, `oom`, `internal`),
  `message` (for people); the process then exits non-zero.

Anything else a model prints goes to stdout as plain text and is kept as a log line.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped on request, after a checkpoint


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


METRICS_LOG = "metrics.jsonl"
"""The trainer's own copy of its `metric` and `eval` lines, in the artifact folder: after a
crash, the worker takes from it the points up to the checkpoint a new attempt resumes from
(the dead worker may not have stored the last ones)."""


class Reporter:
    """Writes protocol lines; non-finite numbers become null so every line is valid JSON.
    With `metrics_log`, metric and eval lines are also appended to that file."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.metrics_log: TextIO | None = None
        self.attempt = 1

    def keep_metrics(self, path: Path, up_to_step: int, attempt: int) -> None:
        """Append metric lines (marked with `attempt`) to `path`, keeping only its points up
        to `up_to_step` (the checkpoint this run resumes from; later ones are trained again)."""
        self.attempt = attempt
        kept = [line for line in read_metrics_log(path) if line.get("step", 0) <= up_to_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in kept))
        self.metrics_log = path.open("a")
        atexit.register(self.metrics_log.flush)  # the trainer exits without tearing its objects down

    def sync_metrics(self) -> None:
        """Make the metrics log durable (done before each checkpoint is announced)."""
        if self.metrics_log is not None:
            self.metrics_log.flush()
            os.fsync(self.metrics_log.fileno())

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "time": round(time.time(), 3), **_clean(fields)})
        if self.metrics_log is not None and event in ("metric", "eval"):
            self.metrics_log.write(line[:-1] + f', "attempt": {self.attempt}}}' + "\n")
        self.stream.write(line + "\n")
        self.stream.flush()

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", level=level, message=message)


def read_metrics_log(path: Path) -> list[dict[str, Any]]:
    """The metric and eval lines of a metrics log (a torn last line is skipped)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return list(parse_metrics_log(text.splitlines()))


def parse_metrics_log(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The metric and eval points of a metrics log's lines, one at a time (a line that is
    not a JSON object with an integer `step` is passed over)."""
    for raw in lines:
        try:
            line = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(line, dict) and isinstance(line.get("step"), int):
            yield line
