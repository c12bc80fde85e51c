"""A sweep as the API shows it: its settings, their results, and an adaptive sweep's rungs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class SweepJob(BaseModel):
    id: int
    name: str
    state: str
    setting: dict[str, Any]
    result: float | None
    """The sweep's metric at the job's end (its latest value while it runs)."""
    step: int | None
    total_steps: int | None


class RungOut(BaseModel):
    """A setting of an adaptive sweep at a rung (`service.jobs.asha`)."""

    job_id: int
    rung: int
    """Counted from 1."""
    step: int
    value: float | None
    """None: the setting ended before the rung (the worst there)."""
    stopped: bool
    cut: float | None
    """The worst value that went on at the rung when this one was decided."""


class SweepOut(BaseModel):
    id: int
    name: str
    user: str
    created_at: datetime
    metric: str
    goal: str
    max_parallel: int | None
    fields: list[str]
    """The swept fields, in order."""
    counts: dict[str, int]
    """Jobs by state."""
    done: int
    total: int
    best_job: int | None
    metric_missing: str | None = None
    """Why there is no best job though jobs succeeded: none reported the metric, and how to."""
    jobs: list[SweepJob]
    early_stopping: dict[str, Any] | None = None
    """The sweep's `early_stopping` (ASHA), where it has one."""
    rungs: list[RungOut] = []
    """Where it has one: each setting at each rung it reached, in the order decided."""


class SweepList(BaseModel):
    items: list[SweepOut]
