"""Traces the simulator replays: a CSV of jobs (`submit_time_s`, `duration_s`, `num_gpus`,
`user`, optional `gpu_fraction`, `time_limit_s` and `group`), read and checked row by row."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

TRACE_COLUMNS = ("submit_time_s", "duration_s", "num_gpus", "user")


FRACTION_COLUMN = "gpu_fraction"


LIMIT_COLUMN = "time_limit_s"


GROUP_COLUMN = "group"
"""The group the job runs in (empty or absent: none), for two-level fair share."""


class TraceError(ValueError):
    """The trace file cannot be read; the message names the line and the column."""


@dataclass(slots=True)
class TraceJob:
    id: int
    submit: float
    duration: float
    gpu_count: int
    user: str
    start: float | None = None
    fraction: float = 1.0
    """Of each GPU (trace column `gpu_fraction`); below 1 the GPU may be shared."""
    limit: float | None = None
    """Time limit (trace column `time_limit_s`): the job is stopped there if still running."""
    left: float | None = None
    """Run time still to go (set when it first starts; a preempted job's grows by RESTART_S)."""
    served: float = 0.0
    """GPU-seconds it has run in earlier attempts."""
    waited: float = 0.0
    """Time spent queued, all attempts together."""
    queued_at: float | None = None
    """When it last went back to the queue after a stop (None: never stopped)."""
    group: str | None = None
    """Trace column `group`: the group it runs in (none when empty or absent)."""
    min_gpu_count: int | None = None
    """Elastic (`simulate(elastic=...)`): it may run on as few GPUs as this; its run time
    left (`left`) is then counted at its full size (`service.scheduler.elastic.rate`)."""
    resizes: int = 0
    """How many times it was shrunk or grown."""

    @property
    def run_s(self) -> float:
        """How long it holds its GPUs: its duration, cut at its time limit."""
        return self.duration if self.limit is None else min(self.duration, self.limit)


def read_trace(path: Path, limit: int | None = None) -> list[TraceJob]:
    """Jobs of a CSV trace with columns submit_time_s,duration_s,num_gpus,user."""
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise TraceError(f"cannot read {path}: {err}") from err
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (need {','.join(TRACE_COLUMNS)})")
        jobs: list[TraceJob] = []
        for line, row in enumerate(reader, start=2):
            if limit is not None and len(jobs) >= limit:
                break
            jobs.append(_trace_job(len(jobs), row, path, line))
    return sorted(jobs, key=lambda j: (j.submit, j.id))


def _trace_job(index: int, row: dict[str, str], path: Path, line: int) -> TraceJob:
    try:
        job = TraceJob(index, float(row["submit_time_s"]), float(row["duration_s"]), int(row["num_gpus"]), row["user"])
    except (TypeError, ValueError) as err:
        raise TraceError(f"{path}:{line}: {err}") from err
    if job.gpu_count < 1 or job.duration < 0 or not math.isfinite(job.submit) or not job.user:
        raise TraceError(f"{path}:{line}: needs num_gpus >= 1, duration_s >= 0 and a user")
    fraction = _optional_number(row, FRACTION_COLUMN, f"{path}:{line}")
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise TraceError(f"{path}:{line}: {FRACTION_COLUMN} must be in (0, 1], got {row[FRACTION_COLUMN].strip()}")
        if fraction < 1 and job.gpu_count != 1:
            raise TraceError(f"{path}:{line}: {FRACTION_COLUMN} below 1 needs num_gpus 1 (got {job.gpu_count})")
        job.fraction = fraction
    job.group = (row.get(GROUP_COLUMN) or "").strip() or None
    job.limit = _optional_number(row, LIMIT_COLUMN, f"{path}:{line}")
    if job.limit is not None and not (job.limit > 0 and math.isfinite(job.limit)):
        raise TraceError(
            f"{path}:{line}: {LIMIT_COLUMN} must be a positive number of seconds, got {row[LIMIT_COLUMN].strip()}"
        )
    return job


def _optional_number(row: dict[str, str], column: str, where: str) -> float | None:
    """The number in an optional column; None when the column is absent or empty."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{where}: {column} {text!r} is not a number") from None
