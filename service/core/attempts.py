"""The attempt protocol (`towerq.contract.attempts`) in the supervisor's own process: each
call is a transaction on the database (and a publish on Redis), fenced by the attempt."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from pathlib import Path

import redis
from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from service.core import keys, rollups
from service.core.context import Context
from service.core.db import insert_ignoring_duplicates
from service.core.exceptions import AuthError, SpecError, StaleAttemptError
from service.core.gpu_use import store_gpu_use
from service.core.gpus import set_drained
from service.core.lifecycle import (
    current_attempt,
    finish,
    last_run_attempt,
    mark_running,
    requeue,
)
from service.core.models import (
    HOLDING_STATES,
    Allocation,
    Gpu,
    Host,
    Job,
    JobState,
    LogLine,
    Metric,
    RankAddress,
    Sweep,
)
from service.core.publish import sweeps_due
from service.core.results import metric_split, rung_steps
from service.core.sharing import shares_outputs
from service.core.stops import asked_stop, crash_as_stop
from towerq.contract.api import LOG_LINES_KEPT
from towerq.contract.attempts import (
    REPORTED_FIELDS,
    AttemptEnd,
    AttemptStatus,
    Claim,
    GpuUse,
    Report,
    Stored,
)
from towerq.contract.paths import job_folder
from towerq.contract.spec import is_command, is_notebook

log = logging.getLogger(__name__)


def job_inputs(session: Session, job: Job, artifacts_root: Path) -> tuple[list[tuple[int, Path]], list[str]]:
    """The folders of the jobs `job` waited for, read-only inputs of its trainer: those its
    owner may read now (a folder made private since the submit is left out, and said)."""
    inputs: list[tuple[int, Path]] = []
    notes: list[str] = []
    for dependency_id in job.after_jobs or []:
        dependency = session.get(Job, dependency_id)
        folder = job_folder(artifacts_root, dependency_id)
        if dependency is None or not folder.is_dir():
            notes.append(f"job {dependency_id} left no folder: no input from it")
        elif not shares_outputs(dependency, job.user_id, job.user.is_admin):
            notes.append(f"job {dependency_id}'s folder is private to its owner now: not given as an input")
        else:
            inputs.append((dependency_id, folder))
    return inputs, notes


def waiting_to_start(session: Session, job_id: int, attempt: int) -> Job:
    """The job's row while the attempt waits to be claimed; `StaleAttemptError` otherwise
    (towerq moved on, or it was claimed already)."""
    job = current_attempt(session, job_id, attempt)
    if job.state != JobState.DISPATCHED:
        raise StaleAttemptError(f"job {job_id} attempt {attempt} is already {job.state}")
    return job


def claim_attempt(session: Session, job_id: int, attempt: int, node: str, artifacts_root: Path) -> Claim:
    """An executor's cluster started the attempt on `node`: the job's row names the node;
    what it runs. `StaleAttemptError` when it is not waiting to start (towerq moved on, or
    it was claimed already)."""
    job = waiting_to_start(session, job_id, attempt)
    job.host_name = node
    job.pending_reason = None
    job.expected_start_at = None
    job.expected_host = None
    inputs, notes = job_inputs(session, job, artifacts_root)
    return Claim(
        spec=job.spec,
        spec_version=job.spec_version,
        fraction=job.gpu_memory_fraction,
        time_limit_s=job.time_limit_s,
        inputs=[(job_id, str(folder)) for job_id, folder in inputs],
        notes=notes,
    )


def attempt_status(session: Session, job_id: int, attempt: int, *, idle_stop_s: float) -> AttemptStatus:
    """`idle_stop_s`: the lab's TOWERQ_GPU_IDLE_STOP_S. A job over several hosts is asked to
    stop once every rank's figures say its GPUs have been idle that long (each host's worker
    sees only its own: one idle rank of a gang whose others work is not stopped); a job on one
    host is stopped by its worker (`worker.gpu_use`)."""
    row = session.execute(
        select(
            Job.state,
            Job.attempts,
            Job.cancel_requested_at,
            Job.preempt_requested_at,
            Job.stop_reason,
            Job.time_limit_s,
            Job.gpu_use,
        ).where(Job.id == job_id)
    ).one_or_none()
    if row is None or row.attempts != attempt or row.state not in HOLDING_STATES:
        return AttemptStatus(current=False)
    stop, reason = asked_stop(session, job_id, attempt, row, idle_stop_s)
    return AttemptStatus(current=True, stop=stop, reason=reason, time_limit_s=row.time_limit_s, limit_known=True)


def sweep_rungs(session: Session, job_id: int) -> tuple[str, list[int]]:
    """The split of the job's adaptive sweep's metric and its rungs' steps ("" and none
    outside such a sweep)."""
    job = session.get(Job, job_id)
    sweep = session.get(Sweep, job.sweep_id) if job is not None and job.sweep_id is not None else None
    if sweep is None:
        return "", []
    early = sweep.spec.get("early_stopping") or {}
    top = early.get("max_steps") or job.total_steps  # type: ignore[union-attr]
    steps = rung_steps(early["min_steps"], early["reduction_factor"], top) if early and top else []
    return metric_split(sweep.spec["metric"]), steps


def write_report(
    session: Session, job_id: int, attempt: int, report: Report, number: int | None = None, *, idle_warn_s: float
) -> None:
    """Store a batch: fenced by the attempt. Once the job has moved on, what rank 0's worker
    had read before it knew (`held`) is still stored while no later attempt has started;
    last words keep their lines only. A report over HTTP is numbered (1, 2, ... an attempt's
    token): one whose number was stored already is a resend after a lost answer, and is not
    stored again. `idle_warn_s`: the lab's TOWERQ_GPU_IDLE_WARN_S (`store_gpu_use`)."""
    unknown = set(report.fields) - REPORTED_FIELDS
    if unknown:
        raise ValueError(f"a report may not set {', '.join(sorted(unknown))}")
    try:
        job: Job | None = current_attempt(session, job_id, attempt)
    except StaleAttemptError:
        job = last_run_attempt(session, job_id, attempt) if report.held else None
        if job is None and not report.last_words:
            raise
    if job is not None and number is not None:
        if number <= (job.attempt_reports or 0):
            return
        job.attempt_reports = number
    if report.logs:
        session.execute(insert(LogLine), report.logs)
    if job is None:
        return
    if report.metrics:
        session.execute(insert_ignoring_duplicates(session, Metric), report.metrics)
        rollups.fold(session, report.metrics)
    for field, value in report.fields.items():
        if field == "total_steps" and not is_command(job.spec or {}):
            continue  # a model job's is its spec's: a line its model printed does not change it
        if field == "gpu_use":
            if value is not None:
                store_gpu_use(session, job, attempt, GpuUse.model_validate(value), idle_warn_s)
            continue
        setattr(job, field, value)
    # what it holds of the lab's disk and database, for its cap and the Usage page
    job.log_bytes = (job.log_bytes or 0) + report.log_bytes
    job.metric_points = (job.metric_points or 0) + len(report.metrics)
    if report.metrics and report.rung:
        sweeps_due(session)


def forget_after(session: Session, job_id: int, attempt: int, step: int) -> None:
    """Forget the job's points past `step` (a resumed attempt trains them again); they no
    longer count in its `metric_points`."""
    job = current_attempt(session, job_id, attempt)
    if attempt > 1:  # where the attempt starts on its job page's charts
        job.resumed_steps = {**(job.resumed_steps or {}), str(attempt): max(0, step)}
    gone = session.execute(delete(Metric).where(Metric.job_id == job_id, Metric.step > step))
    job.metric_points = max(0, (job.metric_points or 0) - max(0, gone.rowcount or 0))  # type: ignore[attr-defined]
    rollups.forget_after(session, job_id, step)


def end_attempt(session: Session, job_id: int, attempt: int, end: AttemptEnd, *, idle_stop_s: float) -> None:
    """Record the attempt's end: the job's final state, or queued for its next attempt. A
    stop every rank was asked for is recorded so, though a rank ends with a crash: its
    program may have seen the other ranks go (stopped) before its own worker read the stop
    (`service.core.stops.crash_as_stop`; `idle_stop_s`: the lab's TOWERQ_GPU_IDLE_STOP_S)."""
    if end.ending == "queued":
        job = current_attempt(session, job_id, attempt)
        stopped = crash_as_stop(session, job, attempt, idle_stop_s) if end.crashed else None
        if stopped is not None and stopped[0] == JobState.QUEUED:
            requeue(session, job, stopped[1], crashed=False)
        elif stopped is not None:
            finish(session, job_id, attempt, stopped[0], error=stopped[1], exit_code=end.exit_code)
        else:
            if end.out_of_memory:
                job.gpu_memory_fraction = 1.0  # its next attempt gets whole GPUs
            requeue(session, job, end.message or "interrupted", crashed=end.crashed)
    else:
        finish(session, job_id, attempt, JobState(end.ending), error=end.message, exit_code=end.exit_code)
    trim_logs(session, job_id)


def trim_logs(session: Session, job_id: int) -> None:
    """Keep the newest `LOG_LINES_KEPT` lines of the job's log in the database (its
    `log.txt` artifact keeps them all), and the newest trimmed (`Job.log_trimmed_through`)."""
    cutoff = session.scalar(
        select(LogLine.id).where(LogLine.job_id == job_id).order_by(LogLine.id.desc()).offset(LOG_LINES_KEPT).limit(1)
    )
    if cutoff is not None:
        session.execute(delete(LogLine).where(LogLine.job_id == job_id, LogLine.id <= cutoff))
        session.execute(update(Job).where(Job.id == job_id).values(log_trimmed_through=cutoff))


def drain_held(session: Session, job_id: int, attempt: int, host: str, indices: list[int]) -> list[int]:
    """Drain those of `indices` on `host` that the attempt was given (its allocation rows,
    released or not): the GPUs found drained."""
    given = session.scalars(
        select(Gpu.index)
        .join(Allocation, Allocation.gpu_id == Gpu.id)
        .join(Host, Host.id == Gpu.host_id)
        .where(Allocation.job_id == job_id, Allocation.attempt == attempt, Host.name == host)
    ).all()
    held = sorted(set(indices) & set(given))
    return [gpu.index for gpu in set_drained(session, host, held, True)] if held else []


def open_door(session: Session, job_id: int, attempt: int, address: str, key: str) -> None:
    """Where the session's door is and its secret (rank 0's `RankAddress` of the attempt,
    where the API's proxy reads it); a job that is not a notebook session has no door."""
    job = current_attempt(session, job_id, attempt)
    if not is_notebook(job.spec):
        raise SpecError("address", f"job {job_id} is not a notebook session: it has no door")
    session.merge(RankAddress(job_id=job_id, attempt=attempt, rank=0, address=address, key=key))


def close_door(session: Session, job_id: int, attempt: int) -> None:
    session.execute(delete(RankAddress).where(RankAddress.job_id == job_id, RankAddress.attempt == attempt))


class LocalChannel:
    """`towerq.contract.attempts.AttemptChannel` over this process's own database and Redis."""

    def __init__(self, ctx: Context, job_id: int, attempt: int) -> None:
        self.ctx = ctx
        self.job_id = job_id
        self.attempt = attempt
        self.channel = keys.job_channel(job_id)

    def claim(self, node: str) -> Claim:
        with self.ctx.db.write() as session:
            return claim_attempt(session, self.job_id, self.attempt, node, self.ctx.settings.artifacts_dir)

    def status(self) -> AttemptStatus:
        with self.ctx.db.read() as session:
            return attempt_status(session, self.job_id, self.attempt, idle_stop_s=self.ctx.settings.gpu_idle_stop_s)

    def running(self, pid: int, cuda_visible_devices: str, artifacts_dir: str) -> None:
        started = {"pid": pid, "cuda_visible_devices": cuda_visible_devices, "artifacts_dir": artifacts_dir}
        with self.ctx.db.write() as session:
            mark_running(session, self.job_id, self.attempt, started)

    def stored(self) -> Stored:
        with self.ctx.db.read() as session:
            row = session.execute(select(Job.log_bytes, Job.metric_points).where(Job.id == self.job_id)).first()
        return Stored(log_bytes=row[0] or 0, metric_points=row[1] or 0) if row is not None else Stored(0, 0)

    def rungs(self) -> tuple[str, list[int]]:
        with self.ctx.db.read() as session:
            return sweep_rungs(session, self.job_id)

    def report(self, report: Report) -> None:
        with self.ctx.db.write() as session:
            write_report(session, self.job_id, self.attempt, report, idle_warn_s=self.ctx.settings.gpu_idle_warn_s)

    def publish(self, payloads: list[str]) -> None:
        try:
            pipe = self.ctx.redis.pipeline(transaction=False)
            for payload in payloads:
                pipe.publish(self.channel, payload)
            pipe.execute()
        except redis.RedisError as err:
            log.debug("publish to %s failed: %s", self.channel, err)

    def forget_after(self, step: int) -> None:
        with self.ctx.db.write() as session:
            forget_after(session, self.job_id, self.attempt, step)

    def end(self, end: AttemptEnd) -> None:
        with self.ctx.db.write() as session:
            end_attempt(session, self.job_id, self.attempt, end, idle_stop_s=self.ctx.settings.gpu_idle_stop_s)

    def drain(self, host: str, indices: list[int]) -> None:
        with self.ctx.db.write() as session:
            drain_held(session, self.job_id, self.attempt, host, indices)

    def open_door(self, address: str, key: str) -> None:
        with self.ctx.db.write() as session:
            open_door(session, self.job_id, self.attempt, address, key)

    def close_door(self) -> None:
        with self.ctx.db.write() as session:
            close_door(session, self.job_id, self.attempt)


# -- the token of an attempt's remote side ---------------------------------------------------

ATTEMPT_TOKEN_PREFIX = "tqa_"


def mint_attempt_token(session: Session, job_id: int, attempt: int) -> str:
    """A new token for the attempt's remote side (a Slurm node's batch script), the only one
    valid for it from now on (a resubmission gets a new one, the old one dies); raises
    `StaleAttemptError` if the attempt is no longer current."""
    job = current_attempt(session, job_id, attempt)
    token = ATTEMPT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    job.attempt_token_hash = hashlib.sha256(token.encode()).hexdigest()
    job.attempt_reports = None
    return token


def check_attempt_token(session: Session, job_id: int, attempt: int, token: str | None) -> None:
    """`AuthError` unless `token` is the one of this job's attempt `attempt`, which has not
    ended (an attempt's end clears it: `lifecycle.release_allocations`)."""
    stored = session.execute(select(Job.attempts, Job.attempt_token_hash).where(Job.id == job_id)).one_or_none()
    given = hashlib.sha256((token or "").encode()).hexdigest()
    if (
        token is None
        or stored is None
        or stored.attempts != attempt
        or stored.attempt_token_hash is None
        or not hmac.compare_digest(stored.attempt_token_hash, given)
    ):
        raise AuthError(f"not a live token of job {job_id} attempt {attempt}")
