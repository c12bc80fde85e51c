"""What jobs report: metric points and their rollups, log lines; notifications owed."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.core.models.base import Base, utcnow


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "split", "step", name="uq_metrics_point"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(8))
    loss: Mapped[float | None] = mapped_column(Float)
    accuracy: Mapped[float | None] = mapped_column(Float)
    learning_rate: Mapped[float | None] = mapped_column(Float)
    examples_per_sec: Mapped[float | None] = mapped_column(Float)
    custom: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """A user model's own metrics at this point, by name (`metrics(labels, logits)`)."""
    time: Mapped[datetime] = mapped_column()


class MetricRollup(Base):
    """One bucket of `service.core.rollups.ROLLUP_STEPS` steps of a job's series: the steps of
    its lowest and highest loss (kept as rows are written; charts of long jobs read these)."""

    __tablename__ = "metric_rollups"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    split: Mapped[str] = mapped_column(String(8), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    min_step: Mapped[int] = mapped_column(Integer)
    min_loss: Mapped[float] = mapped_column(Float)
    max_step: Mapped[int] = mapped_column(Integer)
    max_loss: Mapped[float] = mapped_column(Float)


class LogLine(Base):
    __tablename__ = "log_lines"
    __table_args__ = (Index("ix_log_lines_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    time: Mapped[datetime] = mapped_column()
    level: Mapped[str] = mapped_column(String(8))
    message: Mapped[str] = mapped_column(Text)


JOB_FINISHED = "job.finished"
JOB_IDLE = "job.idle"


class NotificationState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Notification(Base):
    """A webhook owed for a finished job (or the sweep it finished), or a running job gone
    idle: written in the transaction that ends the job or stores the report that says so (so
    none is lost or made twice), sent in the background by the scheduler process."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    url: Mapped[str | None] = mapped_column(Text, default=None)
    """The job's (or its sweep's) `notify_url`; None: the lab's TOWERQ_WEBHOOK_URL."""
    event: Mapped[str] = mapped_column(String(16), default=JOB_FINISHED)
    """job.finished; job.idle: the running job's GPUs have been idle `TOWERQ_GPU_IDLE_WARN_S`
    (owed once for each idle stretch, as its reports say it); or sweep.finished: the sweep of
    the job (its last to end) has ended, to the sweep's URL
    (`service.notifications.webhooks.owe_sweep_notifications`)."""
    state: Mapped[str] = mapped_column(String(16), default=NotificationState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
