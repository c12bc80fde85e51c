"""The trainer's JSON-lines protocol on stdout: one JSON object per line, flushed at once.

Every line has `event` and `time` (Unix seconds). Events:

- `started`: `towers`, `devices`, `cuda_visible_devices`, `simulated`,
  `memory_limit_enforced`, `memory_limit_mb`, `variable_device`, `global_batch`,
  `tower_batches`, `resumed_from_step` (null on a fresh start), `total_steps`.
- `metric`: `step`, `loss`, `accuracy` (null for regressions), `learning_rate`,
  `examples_per_sec`, `step_time_s`; loss and accuracy are averages over the towers.
- `eval`: `step`, `loss`, `accuracy`, `examples` (held-out split; EMA weights when set).
- `log`: `level` (`info` | `warning` | `error`), `message`.
- `checkpoint`: `step`, `path`.
- `stopped`: `step` (SIGTERM received; a checkpoint was written first).
- `done`: `step`, `final` (the last eval), `seconds`.
- `error`: `kind` (`spec`, `dataset`, `model`, `device`, `nan_loss`, `oom`, `internal`),
  `message` (for people); the process then exits non-zero.

Anything else a model prints goes to stdout as plain text and is kept as a log line.
"""

from __future__ import annotations

import json
import math
import sys
import time
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


class Reporter:
    """Writes protocol lines; non-finite numbers become null so every line is valid JSON."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "time": round(time.time(), 3), **_clean(fields)})
        self.stream.write(line + "\n")
        self.stream.flush()

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", level=level, message=message)
