"""A job's result by a sweep's metric, and a sweep's best job: what the sweep's page, its
webhook and `towerq sweep` say; an adaptive sweep's rungs and the split its metric is in."""

from __future__ import annotations

import math

from service.core.models import Job, JobState


def result_of(job: Job, metric: str) -> float | None:
    """The job's latest value of the sweep's metric: a column (loss, accuracy, eval_loss,
    eval_accuracy), else one it reports by name (`eval_` for its evaluation's)."""
    if metric in STANDARD_METRICS:
        value = getattr(job, metric, None)
    elif metric.startswith("eval_"):
        value = (job.eval_custom_metrics or {}).get(metric.removeprefix("eval_"))
    else:
        value = (job.custom_metrics or {}).get(metric)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


STANDARD_METRICS = ("eval_accuracy", "eval_loss", "accuracy", "loss")


def best_job(jobs: list[Job], metric: str, goal: str) -> int | None:
    scored = [(result_of(j, metric), j.id) for j in jobs if j.state == JobState.SUCCEEDED.value]
    scored = [(value, job_id) for value, job_id in scored if value is not None]
    if not scored:
        return None
    return (max if goal == "max" else min)(scored)[1]


def metric_missing(jobs: list[Job], metric: str) -> str | None:
    """Why the sweep has no best job when its jobs ended well: none of them has `metric`.
    How a program reports it, and where they reported a training value of that very name
    (a Hugging Face `eval_accuracy`), that an `eval_` one is read from evaluations."""
    done = [job for job in jobs if job.state == JobState.SUCCEEDED.value]
    if not done or any(result_of(job, metric) is not None for job in done):
        return None
    name = metric.removeprefix("eval_")
    split = ', split="eval"' if metric.startswith("eval_") else ""
    said = (
        f"no job that succeeded reported {metric}: a program reports it with towerq.report(step=...{split}, {name}=...)"
    )
    if split and any(metric in (job.custom_metrics or {}) for job in done):
        said += f"; they reported {metric} as a training value, and an eval_ metric is read from evaluations"
    return said


def counts_by_state(jobs: list[Job]) -> dict[str, int]:
    """A sweep's jobs, how many in each state."""
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    return counts


MAX_RUNGS = 20


def rung_steps(min_steps: int, reduction_factor: int, top: int) -> list[int]:
    """An adaptive sweep's rungs for a setting of `top` steps: m, m·r, m·r², ... below `top`."""
    found: list[int] = []
    step = min_steps
    while step < top and len(found) < MAX_RUNGS:
        found.append(step)
        step *= reduction_factor
    return found


def metric_split(metric: str) -> str:
    """The metric rows a sweep's metric is read from: `eval_` ones from evaluations."""
    return "eval" if metric.startswith("eval_") else "train"
