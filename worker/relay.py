"""Relaying what a trainer prints: Redis at once (live charts), the database in batches.

The batches are written by a thread of their own, in order, so the thread that reads the
trainer's output never waits on the database (a write held up by a lock must not hold up
reading, or the trainer would block on a full pipe). They go through the attempt's channel
(`towerq.contract.attempts`), which checks that this attempt is still the job's current one
(fencing): an attempt the scheduler gave up on cannot write results.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from service.core import defaults, joblog
from service.core.settings import Settings
from towerq.contract import events
from towerq.contract.attempts import AttemptChannel, LogRow, MetricRow, Report, StaleAttempt, Stored
from towerq.contract.messages import LogMessage, MetricMessage, encode
from towerq.contract.paths import PathEscapeError, job_folder, job_log, lines_beneath
from worker.latest import LatestFigures
from worker.pace import Pace
from worker.trainer.protocol import METRICS_LOG

log = logging.getLogger(__name__)


EARLIEST_TIME = 946_684_800  # 2000-01-01
TIME_SKEW_S = 24 * 3600
"""A line's `time` before 2000 or this far past the worker's clock is the writer's invention
(the trainer and a program run on this host's clock): the time it was read is kept instead.
(An old one is plausible: a resumed attempt restores its job's earlier points.)"""


def program_metrics_log(attempt: int) -> str:
    """The metrics log `towerq.report()` appends to in a command job's attempt (its folder's)."""
    return f"metrics-attempt-{attempt}.jsonl"


def parse_time(value: Any) -> datetime:
    """A protocol line's `time` (Unix seconds), or now when it is not a plausible one: user
    code prints these lines too (NaN, 1e20, the year 1970 or 9999)."""
    now = datetime.now(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and EARLIEST_TIME <= value <= now.timestamp() + TIME_SKEW_S:
            return datetime.fromtimestamp(value, UTC)
    return now


def evaluation_line(point: Mapping[str, Any]) -> str:
    """An evaluation point as the job's log says it: `evaluation at step 400: loss 0.4123,
    accuracy 91.20%, top2 0.97` (the model's own metrics after its loss and accuracy)."""
    figures = [] if point["loss"] is None else [f"loss {point['loss']:.4g}"]
    if point["accuracy"] is not None:
        figures.append(f"accuracy {100 * point['accuracy']:.2f}%")
    figures += [f"{name} {value:.4g}" for name, value in sorted((point["custom"] or {}).items()) if value is not None]
    return f"evaluation at step {point['step']}: {', '.join(figures) or 'no figures'}"


class MetricSink:
    """Buffers one attempt's metric points and log lines and writes them in batches."""

    def __init__(self, channel: AttemptChannel, settings: Settings) -> None:
        self.channel = channel
        self.settings = settings
        self.job_id = channel.job_id
        self.attempt = channel.attempt
        self.prefix = ""
        """Put before every log line: `[rank r on host] ` for a job over several hosts."""
        self.metrics: list[MetricRow] = []
        self.logs: list[LogRow] = []
        self.latest: dict[str, Any] = {}
        self.figures = LatestFigures()
        """What each point makes of the job's latest figures (`self.latest` holds them until a flush)."""
        self.paces = Pace()
        self.first_buffered: float | None = None
        self.first_metric_pending = True
        self.urgent = False
        """Write at the next chance: the attempt's first train point (the figure a user waits for)."""
        self.batches: queue.Queue[Report | None] = queue.Queue()
        self.unsent: list[str] = []
        self.writer: threading.Thread | None = None
        self.last_words = False
        """The trainer said it stopped with the other ranks of its job: the lines it prints
        while it ends are written even once rank 0 has recorded the stop (the job moved on),
        as this attempt's; its numbers are not."""
        self.speaks = True
        """Its points are the job's: rank 0's sink, or a job's on one host."""
        self.moved_on = False
        """This worker learned that the job had moved on from the attempt (another rank's end,
        a host found down): what it held by then is what the attempt trained, and is still
        sent (`Report.held`); points read from then on are not the job's, and are dropped."""
        self.failure: Exception | None = None
        """What stopped the writer (`StaleAttempt`, or the channel's error): raised by `flush`."""
        self.rungs: tuple[str, list[int]] | None = None
        """The job's adaptive sweep's rungs not yet reached, and the split of the sweep's metric
        (empty: none, or not in such a sweep); read at the first write."""
        self.points = 0
        self.lines = 0
        """Metric points and log lines taken from this attempt, against their limits."""
        self.log_bytes: int | None = None
        """What the job's log took so far, all attempts together (read at the first line)."""
        self.stored_before: Stored | None = None
        """What the job's log and points took before this attempt (read at the first of either)."""
        self.points_capped = False
        self.unwritten_log_bytes = 0
        """What the buffered lines add to the job's `log_bytes` when they are written."""
        self.folder = job_folder(settings.artifacts_dir, self.job_id)
        self.log_file = job_log(settings.artifacts_dir, self.job_id)

    # -- buffering ----------------------------------------------------------------------

    def metric(self, event: events.Metric | events.Eval, publish: bool = True) -> None:
        """A `metric` (train) or `eval` line from the trainer (`publish=False`: an old point
        restored from the trainer's metrics log, stored but not streamed again)."""
        if self.moved_on:
            return
        train = isinstance(event, events.Metric)
        split: Literal["train", "eval"] = "train" if train else "eval"
        self.points += 1
        if self._past_points_cap():
            return
        # a restored point names the attempt that trained it: its trainer's word, so at most this one
        attempt = min(event.attempt or self.attempt, self.attempt) if not publish else self.attempt
        point = MetricRow(
            job_id=self.job_id,
            attempt=attempt,
            step=event.step,
            split=split,
            loss=event.loss,
            accuracy=event.accuracy,
            learning_rate=event.learning_rate if isinstance(event, events.Metric) else None,
            examples_per_sec=event.examples_per_sec if isinstance(event, events.Metric) else None,
            custom=event.metrics,
            time=parse_time(event.time),
        )
        step_time = event.step_time_s if isinstance(event, events.Metric) else None
        if isinstance(event, events.Metric) and event.total_steps is not None:
            self.latest["total_steps"] = event.total_steps
        if publish:
            fields = {"type": event.event, **point, "attempt": self.attempt, "step_time_s": step_time}
            self.unsent.append(encode(MetricMessage.model_validate(fields)))
        self.metrics.append(point)
        self.latest.update(self.figures.of(point, step_time))
        if train and publish:
            self._note_pace(event.step)
        if not train and publish:
            self.log("info", evaluation_line(point))
        self._buffered()
        if train and publish and self.first_metric_pending:
            self.first_metric_pending = False
            self.urgent = True

    def log(self, level: str, message: str, when: datetime | None = None) -> None:
        self.lines += 1
        if self.lines > defaults.LOG_LINES_PER_ATTEMPT:
            if self.lines > defaults.LOG_LINES_PER_ATTEMPT + 1:
                return
            level, message = "warning", f"more than {defaults.LOG_LINES_PER_ATTEMPT:,} log lines: the rest dropped"
        when = when or datetime.now(UTC)
        message = (self.prefix + message)[:10_000]
        size = len(message.encode()) + defaults.LOG_LINE_OVERHEAD
        over = self._past_log_cap(size)
        if over is not None:
            if not over:
                return
            level, message, size = "warning", over, len(over) + defaults.LOG_LINE_OVERHEAD
        self.unwritten_log_bytes += size
        log_message = LogMessage(job_id=self.job_id, attempt=self.attempt, level=level, message=message, time=when)
        self.unsent.append(encode(log_message))
        self.logs.append(LogRow(job_id=self.job_id, attempt=self.attempt, time=when, level=level, message=message))
        self._buffered()

    def _past_points_cap(self) -> bool:
        """Whether this point is past the attempt's or the job's limit (said once, at the first)."""
        job_cap = self.settings.job_metric_points_max
        per_attempt = defaults.METRIC_POINTS_PER_ATTEMPT
        if self.points <= per_attempt and self._stored().metric_points + self.points <= job_cap:
            return False
        if not self.points_capped:
            self.points_capped = True
            said = (
                f"more than {per_attempt:,} metric points in an attempt"
                if self.points > per_attempt
                else f"the job stored {job_cap:,} metric points (TOWERQ_JOB_METRIC_POINTS_MAX)"
            )
            self.log("warning", f"{said}: the rest dropped")
        return True

    def _stored(self) -> Stored:
        """What the job stored before this attempt's writes (read once)."""
        if self.stored_before is None:
            self.stored_before = self.channel.stored()
        return self.stored_before

    def _past_log_cap(self, size: int) -> str | None:
        """None while a line of `size` bytes fits the job's log (TOWERQ_JOB_LOG_MAX_MB, all
        attempts together); for the first line that does not, the line to say instead; then ""."""
        cap = self.settings.job_log_max_mb * 2**20
        if self.log_bytes is None:
            self.log_bytes = self._stored().log_bytes
        before, self.log_bytes = self.log_bytes, self.log_bytes + size
        if self.log_bytes <= cap:
            return None
        if before > cap:
            return ""
        return f"the job's log reached {self.settings.job_log_max_mb} MB (TOWERQ_JOB_LOG_MAX_MB): the rest dropped"

    def _note_pace(self, step: int) -> None:
        """The attempt's wall-clock pace, as this worker received its train points (the
        trainer's own times are its word): over the later half of the steps it trained so
        far, so a start-up's one-off costs (tracing the evaluation, the first checkpoint)
        fade, while the evaluations and checkpoints it repeats still count."""
        now = datetime.now(UTC)
        self.paces.note(step, now)
        # None at an attempt's first point: an earlier attempt's pace no longer holds
        self.latest.update(pace_s=self.paces.pace(), step_at=now)

    def _buffered(self) -> None:
        if self.first_buffered is None:
            self.first_buffered = time.monotonic()

    def send(self) -> None:
        """Publish what came since the last call, in one round trip: the runner calls this
        after each read of the trainer's output, so a burst of lines costs one."""
        if not self.unsent:
            return
        messages, self.unsent = self.unsent, []
        self.channel.publish(messages)

    # -- writing ------------------------------------------------------------------------

    def due(self) -> bool:
        if self.failure is not None or self.urgent:
            return True
        if self.first_buffered is None:
            return False
        full = len(self.metrics) + len(self.logs) >= defaults.METRIC_FLUSH_ROWS
        return full or time.monotonic() - self.first_buffered >= defaults.METRIC_FLUSH_INTERVAL_S

    def flush(self, job_updates: dict[str, Any] | None = None, wait: bool = False) -> None:
        """Hand what is buffered (and `job_updates`) to the writer; with `wait`, return once
        everything handed over so far is written. Raises what stopped the writer: a
        `StaleAttempt` when this attempt is no longer current (the buffers are dropped, but
        for what rank 0's sink holds: `moved_on`)."""
        self.send()
        fields = {**self.latest, **(job_updates or {})}
        batch = Report(self.metrics, self.logs, fields, self.unwritten_log_bytes)
        self.metrics, self.logs, self.latest, self.first_buffered, self.urgent = [], [], {}, None, False
        self.unwritten_log_bytes = 0
        if self._writes and (batch.metrics or batch.logs or batch.fields or batch.log_bytes):
            if self.writer is None:
                self.writer = threading.Thread(target=self._write_batches, name=f"relay-{self.job_id}", daemon=True)
                self.writer.start()
            self.batches.put(batch)
        if wait and self.writer is not None:
            self.batches.join()
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        """Stop the writer once it has written what it was given."""
        if self.writer is not None:
            self.batches.put(None)
            self.writer.join()
            self.writer = None

    def _write_batches(self) -> None:
        while True:
            batch = self.batches.get()
            try:
                if batch is not None and self._writes:
                    self._write(batch)
            except Exception as err:  # noqa: BLE001 - the reading thread raises it (flush)
                self.failure = err
            finally:
                self.batches.task_done()
            if batch is None:
                return

    def _write(self, batch: Report) -> None:
        batch.last_words, batch.held = self.last_words, self.moved_on
        batch.rung = self._reached_a_rung(batch.metrics)
        refused: StaleAttempt | None = None
        try:
            self.channel.report(batch)
        except StaleAttempt as err:
            if batch.held or not self.speaks:
                raise
            refused, batch.held = err, True
            self.job_moved_on()  # the points read from now on are not the job's
            self.channel.report(batch)  # read before the move was known: what the attempt trained
        if batch.logs:
            self._append_log_file(batch.logs)
        if refused is not None:
            raise refused  # the runner learns of the move (`flush`)

    @property
    def _writes(self) -> bool:
        """Whether batches still go out: until the writer failed, and after it for what rank
        0's sink held when the job moved on (the database decides whether to keep it)."""
        return self.failure is None or self.moved_on

    def job_moved_on(self) -> None:
        """The runner learned that the job moved on from this attempt (`moved_on`)."""
        if self.speaks:
            self.moved_on = True

    def _reached_a_rung(self, metrics: list[MetricRow]) -> bool:
        """Whether `metrics` take the job past a rung of its adaptive sweep: the scheduler then
        decides at once, not at its next look, so a setting left behind stops seconds sooner.
        Each rung counts once: the trainer's lines can ask for at most one look a rung."""
        if not metrics:
            return False
        if self.rungs is None:
            self.rungs = self.channel.rungs()
        split, left = self.rungs
        reached = max((m["step"] for m in metrics if m["split"] == split), default=None)
        if not left or reached is None or reached < left[0]:
            return False
        self.rungs = (split, [step for step in left if step > reached])
        return True

    def _append_log_file(self, logs: list[LogRow]) -> None:
        """Every line also goes to the job's `log.txt` artifact: the database keeps only the
        newest lines of a long job, the file keeps them all (`GET .../logs.txt`)."""
        joblog.append(self.log_file, logs)

    def forget_after(self, step: int) -> None:
        """Delete points after `step`: a resumed attempt trains those steps again."""
        self.flush(wait=True)
        self.channel.forget_after(step)

    def resume(self, step: int) -> None:
        """An attempt resumed from the checkpoint of `step`: the points after it go (they
        will be trained again), and those up to it are restored from the trainer's own log
        in the artifacts (a worker that died may not have stored them all). The trainer wrote
        that file, so it is read without following links and only up to a bound."""
        self.forget_after(step)
        self._restore(step)
        self.log("info", f"attempt {self.attempt} resumed from the checkpoint of step {step}")

    def replace_from(self, step: int) -> None:
        """A command job's resumed attempt reported `step` first: the points from it on go
        (the program reports them again: a chart never shows a step twice), and those before
        it that a dead worker had not stored come back from the metrics logs `towerq.report()`
        keeps, one per attempt (`program_metrics_log`), the newest first: the database keeps
        the first point of a step it is given, and a step's stored point is already the
        newest attempt's (each resume deleted the older ones from its first step on)."""
        self.forget_after(step - 1)
        for attempt in range(self.attempt - 1, 0, -1):
            self._restore(step - 1, program_metrics_log(attempt))
        self.log("info", f"attempt {self.attempt} reports from step {step} on: the earlier points from there go")

    def _restore(self, up_to: int, name: str = METRICS_LOG) -> None:
        """The points up to `up_to` of a metrics log in the job's folder, a batch at a time;
        the trainer or the program wrote it, so it is read without following links and only
        up to a bound."""
        bounds = defaults.METRICS_LOG_READ_BYTES, defaults.METRICS_LOG_LINE_BYTES
        lines = lines_beneath(self.folder, name, *bounds)
        try:
            for line in lines:
                point = events.decode(line)
                if isinstance(point, events.Metric | events.Eval) and point.step <= up_to:
                    self.metric(point, publish=False)
                    if len(self.metrics) >= defaults.METRIC_FLUSH_ROWS:  # the worker holds a batch, never the file
                        self.flush(wait=True)
        except (OSError, PathEscapeError) as err:
            self.log("warning", f"{name} not read: {err}")
