"""Relaying what a trainer prints: Redis at once (live charts), the database in batches.

Every database write checks, in its transaction, that this attempt is still the job's
current one (fencing): an attempt the scheduler gave up on cannot write results.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from service import defaults, joblog, keys
from service.context import Context
from service.db import insert_ignoring_duplicates
from service.lifecycle import current_attempt
from service.models import Job, LogLine, Metric
from worker.trainer.paths import JOB_LOG_FILE, job_folder
from worker.trainer.protocol import read_metrics_log

log = logging.getLogger(__name__)

METRIC_FIELDS = ("loss", "accuracy", "learning_rate", "examples_per_sec")


def parse_time(value: Any) -> datetime:
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    return datetime.now(UTC)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


MAX_CUSTOM_METRICS = 16


def _custom(values: Any) -> dict[str, float | None] | None:
    """A metric line's user metrics, as numbers (at most 16, names at most 48 characters)."""
    if not isinstance(values, dict) or not values:
        return None
    return {str(name)[:48]: _number(value) for name, value in list(values.items())[:MAX_CUSTOM_METRICS]}


class MetricSink:
    """Buffers one attempt's metric points and log lines and writes them in batches."""

    def __init__(self, ctx: Context, job_id: int, attempt: int) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.attempt = attempt
        self.metrics: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.latest: dict[str, Any] = {}
        self.first_buffered: float | None = None
        self.channel = keys.job_channel(job_id)
        self.log_file = job_folder(ctx.settings.artifacts_dir, job_id) / JOB_LOG_FILE

    # -- buffering ----------------------------------------------------------------------

    def metric(self, event: dict[str, Any], publish: bool = True) -> None:
        """A `metric` (train) or `eval` line from the trainer (`publish=False`: an old point
        restored from the trainer's metrics log, stored but not streamed again)."""
        split = "eval" if event.get("event") == "eval" else "train"
        step = event.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            self.log("warning", f"metric line without an integer step ignored: {event}")
            return
        point: dict[str, Any] = {"step": step, "split": split, **{f: _number(event.get(f)) for f in METRIC_FIELDS}}
        point["custom"] = _custom(event.get("metrics"))
        when = parse_time(event.get("time"))
        if publish:
            extra = {} if split == "eval" else {"step_time_s": _number(event.get("step_time_s"))}
            self._publish(split if split == "eval" else "metric", {**point, **extra, "time": when.isoformat()})
        attempt = event.get("attempt", self.attempt) if not publish else self.attempt
        self.metrics.append({**point, "job_id": self.job_id, "attempt": attempt, "time": when})
        self._note_latest(point, event)
        self._buffered()

    def log(self, level: str, message: str, when: datetime | None = None) -> None:
        when = when or datetime.now(UTC)
        message = message[:10_000]
        self._publish("log", {"level": level, "message": message, "time": when.isoformat()})
        self.logs.append(
            {"job_id": self.job_id, "attempt": self.attempt, "time": when, "level": level, "message": message}
        )
        self._buffered()

    def _note_latest(self, point: dict[str, Any], event: dict[str, Any]) -> None:
        if point["split"] == "eval":
            self.latest.update(eval_loss=point["loss"], eval_accuracy=point["accuracy"])
            return
        self.latest.update(
            step=point["step"],
            loss=point["loss"],
            accuracy=point["accuracy"],
            examples_per_sec=point["examples_per_sec"],
            step_time_s=_number(event.get("step_time_s")),
        )

    def _buffered(self) -> None:
        if self.first_buffered is None:
            self.first_buffered = time.monotonic()

    def _publish(self, kind: str, data: dict[str, Any]) -> None:
        payload = json.dumps({"type": kind, "job_id": self.job_id, "attempt": self.attempt, **data})
        try:
            self.ctx.redis.publish(self.channel, payload)
        except redis.RedisError as err:
            log.debug("publish to %s failed: %s", self.channel, err)

    # -- writing ------------------------------------------------------------------------

    def due(self) -> bool:
        if self.first_buffered is None:
            return False
        full = len(self.metrics) + len(self.logs) >= defaults.METRIC_FLUSH_ROWS
        return full or time.monotonic() - self.first_buffered >= defaults.METRIC_FLUSH_INTERVAL_S

    def flush(self, job_updates: dict[str, Any] | None = None) -> Job:
        """Write what is buffered (and `job_updates`) if this attempt is still current.
        Raises `StaleAttemptError` otherwise; the buffers are dropped either way."""
        metrics, logs, latest = self.metrics, self.logs, self.latest
        self.metrics, self.logs, self.latest, self.first_buffered = [], [], {}, None
        with self.ctx.db.write() as session:
            job = current_attempt(session, self.job_id, self.attempt)
            if metrics:
                session.execute(insert_ignoring_duplicates(session, Metric), metrics)
            if logs:
                session.execute(insert(LogLine), logs)
            for field, value in {**latest, **(job_updates or {})}.items():
                setattr(job, field, value)
        if logs:
            self._append_log_file(logs)
        return job

    def _append_log_file(self, logs: list[dict[str, Any]]) -> None:
        """Every line also goes to the job's `log.txt` artifact: the database keeps only the
        newest lines of a long job, the file keeps them all (`GET .../logs.txt`)."""
        joblog.append(self.log_file, logs)

    def forget_after(self, step: int) -> None:
        """Delete points after `step`: a resumed attempt trains those steps again."""
        with self.ctx.db.write() as session:
            current_attempt(session, self.job_id, self.attempt)
            session.execute(delete(Metric).where(Metric.job_id == self.job_id, Metric.step > step))

    def resume(self, step: int, metrics_log: Path) -> None:
        """An attempt resumed from the checkpoint of `step`: the points after it go (they
        will be trained again), and those up to it are restored from the trainer's own log
        in the artifacts (a worker that died may not have stored them all)."""
        self.forget_after(step)
        for point in read_metrics_log(metrics_log):
            if point["step"] <= step:
                self.metric(point, publish=False)
        self.log("info", f"resumed from the checkpoint of step {step}")

    def trim_logs(self, session: Session) -> None:
        cutoff = session.scalar(
            select(LogLine.id)
            .where(LogLine.job_id == self.job_id)
            .order_by(LogLine.id.desc())
            .offset(defaults.LOG_LINES_KEPT)
            .limit(1)
        )
        if cutoff is not None:
            session.execute(delete(LogLine).where(LogLine.job_id == self.job_id, LogLine.id <= cutoff))
