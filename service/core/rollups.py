"""Metric rollups: each job's series summarised in buckets of `ROLLUP_STEPS` steps (the
steps of the lowest and the highest loss in each), kept up to date as rows are written, so
that a chart of a 100,000-step job is drawn from ~1,600 summary rows instead of a scan of
100,000 (`GET /api/jobs/{id}/metrics?points=N`).

The relay folds every batch it writes into the rollups in the same transaction
(`fold`); a resumed attempt that drops the steps after its checkpoint drops their rollups
and rebuilds the bucket it cut through (`forget_after`). A series without rollups (rows
written before they existed) is down-sampled by a window query instead (the API's
fallback).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import case, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.core.models import Metric, MetricRollup

ROLLUP_STEPS = 64
Extremes = tuple[int, float, int, float]
"""(step of the lowest loss, lowest loss, step of the highest loss, highest loss)."""


def _merge(a: Extremes | None, b: Extremes) -> Extremes:
    if a is None:
        return b
    low = (a[0], a[1]) if a[1] <= b[1] else (b[0], b[1])
    high = (a[2], a[3]) if a[3] >= b[3] else (b[2], b[3])
    return (low[0], low[1], high[0], high[1])


def fold(session: Session, rows: Iterable[Mapping[str, Any]]) -> None:
    """Fold metric rows (dicts with job_id, split, step, loss) into their buckets: one
    upsert that keeps the lower minimum and the higher maximum of what is stored and what
    comes (no read first: the relay calls this for every batch it writes)."""
    found: dict[tuple[int, str, int], Extremes] = {}
    for row in rows:
        loss = row.get("loss")
        if loss is None:
            continue
        key = (row["job_id"], row["split"], row["step"] // ROLLUP_STEPS)
        found[key] = _merge(found.get(key), (row["step"], loss, row["step"], loss))
    if not found:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(MetricRollup)
    new, old = insert.excluded, MetricRollup.__table__.c
    lower, higher = new.min_loss < old.min_loss, new.max_loss > old.max_loss
    statement = insert.on_conflict_do_update(
        index_elements=[old.job_id, old.split, old.bucket],
        set_={
            "min_step": case((lower, new.min_step), else_=old.min_step),
            "min_loss": case((lower, new.min_loss), else_=old.min_loss),
            "max_step": case((higher, new.max_step), else_=old.max_step),
            "max_loss": case((higher, new.max_loss), else_=old.max_loss),
        },
    )
    values = [
        {"job_id": key[0], "split": key[1], "bucket": key[2], **_columns(extremes)} for key, extremes in found.items()
    ]
    session.execute(statement, values)


def _columns(extremes: Extremes) -> dict[str, Any]:
    return {"min_step": extremes[0], "min_loss": extremes[1], "max_step": extremes[2], "max_loss": extremes[3]}


def forget_after(session: Session, job_id: int, step: int) -> None:
    """The rows after `step` are gone: so are their buckets; the one `step` falls in is rebuilt."""
    cut = step // ROLLUP_STEPS
    session.execute(delete(MetricRollup).where(MetricRollup.job_id == job_id, MetricRollup.bucket >= cut))
    kept = session.execute(
        select(Metric.job_id, Metric.split, Metric.step, Metric.loss).where(
            Metric.job_id == job_id, Metric.step >= cut * ROLLUP_STEPS, Metric.step <= step
        )
    )
    fold(session, [row._asdict() for row in kept])


def overview(session: Session, job_id: int, split: str, after: int, until: int | None, points: int) -> list[int] | None:
    """The steps to show of one split in (after, until]: per one of `points / 2` equal
    spans, its lowest- and highest-loss steps, from the rollups (and, for the partial
    buckets at the edges, from the rows). None when the series has no rollups."""
    steps = select(Metric.step).where(Metric.job_id == job_id, Metric.split == split, Metric.step > after)
    if until is not None:
        steps = steps.where(Metric.step <= until)
    # Two index look-ups: min() and max() in one query make SQLite scan the whole range.
    low = session.scalar(steps.order_by(Metric.step).limit(1))
    high = session.scalar(steps.order_by(Metric.step.desc()).limit(1))
    if low is None or high is None:
        return []
    first, last = -(-low // ROLLUP_STEPS), (high + 1) // ROLLUP_STEPS - 1  # whole buckets inside
    columns = (MetricRollup.min_step, MetricRollup.min_loss, MetricRollup.max_step, MetricRollup.max_loss)
    rollups = session.execute(
        select(*columns).where(
            MetricRollup.job_id == job_id,
            MetricRollup.split == split,
            MetricRollup.bucket >= first,
            MetricRollup.bucket <= last,
        )
    ).all()
    if not rollups and last >= first:
        return None
    parts: list[Extremes] = []
    for start, end in ((low, min(high, first * ROLLUP_STEPS - 1)), (max(low, (last + 1) * ROLLUP_STEPS), high)):
        if start > end or (start, end) == (low, high) and parts:
            continue
        edge = session.execute(  # two index ranges: an OR of them would scan the whole series
            select(Metric.step, Metric.loss).where(
                Metric.job_id == job_id, Metric.split == split, Metric.step >= start, Metric.step <= end
            )
        )
        parts += [(s, loss, s, loss) for s, loss in edge if loss is not None]
    parts += [(r[0], r[1], r[2], r[3]) for r in rollups]
    spans = max(1, points // 2)
    picked: dict[int, Extremes] = {}
    for part in parts:
        span = (part[0] - low) * spans // (high - low + 1)
        picked[span] = _merge(picked.get(span), part)
    return sorted({step for extremes in picked.values() for step in (extremes[0], extremes[2])})
