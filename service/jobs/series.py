"""A job's metric series as a chart asks for it: a range of steps, whole or down-sampled on
the server (from the rollups the relay keeps where a series is long, else by a window query
over the rows), so spikes and dips survive at any zoom."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from service.core import rollups
from service.core.models import Metric

SPLITS = ("train", "eval")


def metric_rows(
    session: Session, job_id: int, *, after: int, until: int | None, split: str | None, limit: int
) -> list[Metric]:
    """The rows in step order after `after` (and up to `until`), at most `limit`."""
    query = _range(job_id, after, until, split)
    return list(session.scalars(query.order_by(Metric.step, Metric.split).limit(limit)))


def overview(
    session: Session, job_id: int, *, after: int, until: int | None, split: str | None, points: int
) -> list[Any]:
    """At most about `points` rows per split, in step order: the steps split into `points / 2`
    equal buckets, each giving its lowest- and highest-loss rows. Taken from the rollups
    where a split has them and is long enough to need them; else by a window query."""
    rows: list[Any] = []
    for one in [split] if split is not None else SPLITS:
        series = _range(job_id, after, until, one)
        steps = rollups.overview(session, job_id, one, after, until, points) if _long(session, series, points) else None
        if steps is None:
            rows += downsampled(session, series, points)
        elif steps:  # plain rows, not ORM objects: a thousand of those cost more than the query
            rows += session.execute(
                select(*Metric.__table__.c).where(Metric.job_id == job_id, Metric.split == one, Metric.step.in_(steps))
            ).all()
    return sorted(rows, key=lambda m: (m.step, m.split))


def _range(job_id: int, after: int, until: int | None, split: str | None) -> Select[Any]:
    query = select(Metric).where(Metric.job_id == job_id, Metric.step > after)
    if until is not None:
        query = query.where(Metric.step <= until)
    if split is not None:
        query = query.where(Metric.split == split)
    return query


def _long(session: Session, rows: Select[Any], points: int) -> bool:
    """More rows than a window query handles fast (4 × points), counted up to that."""
    counted = session.scalar(select(func.count()).select_from(rows.limit(4 * points + 1).subquery())) or 0
    return counted > 4 * points


def downsampled(session: Session, query: Select[Any], points: int) -> list[Metric]:
    """At most about `points` rows per split: per step bucket, the min- and max-loss rows."""
    series = query.subquery()
    spans = select(
        series.c.id,
        series.c.split,
        series.c.step,
        series.c.loss,
        func.min(series.c.step).over(partition_by=series.c.split).label("low"),
        func.max(series.c.step).over(partition_by=series.c.split).label("high"),
    ).subquery()
    buckets = max(1, points // 2)
    bucket = (spans.c.step - spans.c.low) * buckets // (spans.c.high - spans.c.low + 1)
    within = [spans.c.split, bucket]
    ranked = select(
        spans.c.id,
        func.row_number().over(partition_by=within, order_by=[spans.c.loss.asc(), spans.c.step]).label("lowest"),
        func.row_number().over(partition_by=within, order_by=[spans.c.loss.desc(), spans.c.step]).label("highest"),
    ).subquery()
    kept = (
        select(Metric)
        .join(ranked, Metric.id == ranked.c.id)
        .where((ranked.c.lowest == 1) | (ranked.c.highest == 1))
        .order_by(Metric.step, Metric.split)
    )
    return list(session.scalars(kept))
