"""Jobs, their sweeps and rungs, their history of states, and a running job's ETA."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.core.models.base import HOLDING_STATES, Base, JobState, utcnow

if TYPE_CHECKING:  # mapped by name at run time; these for the type checker
    from service.core.models.hosts import Allocation
    from service.core.models.people import User
from towerq.contract.attempts import GPU_BUSY_PCT
from towerq.contract.spec import Priority
from towerq.contract.times import span_text
from towerq.contract.versions import SPEC_VERSION


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("user_id", "idempotency_key", name="uq_jobs_user_idempotency"),
        Index("ix_jobs_state_created", "state", "created_at"),
        Index("ix_jobs_finished", "finished_at"),  # jobs that ran lately (a Slurm cluster's, for usage)
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    state: Mapped[str] = mapped_column(String(16), default=JobState.QUEUED)
    spec: Mapped[dict[str, Any]] = mapped_column()
    spec_version: Mapped[int] = mapped_column(Integer, default=SPEC_VERSION, server_default="1")
    """The version of the spec's rules it was admitted under (`towerq.contract.versions`)."""
    attempt_token_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    """SHA-256 of the token its current attempt's remote side reports with (`/api/attempts`,
    `service.core.attempts`); None when it has none, and once the attempt ended."""
    attempt_reports: Mapped[int | None] = mapped_column(Integer, default=None)
    """The number of the last report over HTTP stored for the token's attempt: one sent again
    (its answer was lost) is stored once."""
    priority: Mapped[str] = mapped_column(String(8), default=Priority.NORMAL)
    gpu_count: Mapped[int] = mapped_column(Integer)
    min_gpu_count: Mapped[int | None] = mapped_column(Integer, default=None)
    """An elastic job's least size (its spec's `min_gpu_count`, below `gpu_count`); None: not elastic."""
    resize_to: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """An elastic job the scheduler stopped to resize: `{"host", "gpus", "for"}`, the GPUs its
    next attempt starts on (as many of them as are free then, at least its minimum) and the
    job a shrink made room for (None: it grows). Cleared when it is dispatched again."""
    run_served_gpu_s: Mapped[float | None] = mapped_column(Float, default=None)
    """GPU-seconds the job had served when its current run began, the last time it left the
    queue: an elastic job's resize starts a new attempt but goes on with the run, and time
    slicing counts the run (`service.scheduler.costs.sliceable_from`). None: never set
    (a row from before it was kept)."""
    resumed_steps: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """The step each resumed attempt started from, by attempt number (`{"2": 1200}`): where
    its job page's charts mark the attempt (a resize, a preemption, a crash)."""
    gpu_memory_fraction: Mapped[float] = mapped_column(Float, default=1.0)
    requested_host: Mapped[str | None] = mapped_column(String(128), default=None)
    requested_gpus: Mapped[list[Any] | None] = mapped_column(default=None)
    time_limit_s: Mapped[int | None] = mapped_column(Integer, default=None)
    total_steps: Mapped[int | None] = mapped_column(Integer, default=None)
    """The steps a job of towerq's trainer runs (`hyperparameters.steps`); None for a command
    job or a notebook session, whose program alone knows how long it runs."""
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"), default=None, index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), default=None)
    after_jobs: Mapped[list[Any] | None] = mapped_column(default=None)
    """The jobs it waits for (its spec's `after`, sweeps resolved to their jobs at submit)."""
    after_condition: Mapped[str | None] = mapped_column(String(16), default=None)
    """`afterok` (each must succeed) or `afterany` (each must end); None: it waits for none."""
    group: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    """The group it runs in (its spec's `group`, or its owner's default group at submit);
    a name, not a key, so usage by group outlives a deleted group."""

    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """The current attempt's number: 1 at submit, raised each time the job is requeued."""
    crashes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Attempts lost to a crash (dead host or worker); planned stops do not count."""
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    """The job fails once this many attempts have crashed."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    preempt_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    """The scheduler asked this attempt to make room for another job (preemption, time slicing)."""
    stop_reason: Mapped[str | None] = mapped_column(String(512), default=None)
    """Why the stop of the current attempt was asked for (cancel, preemption, time slice): the
    worker reads it here; a control message only tells it to look."""
    folder_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """What the job's folder held on disk when its worker last measured it."""
    gpu_use: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """What its GPUs did, by "attempt.rank": the `GpuUse` its runner last reported for that
    attempt and rank (`worker.gpu_use`); `gpu_use_summary` sums them up. None: no sample
    (not run yet, or on simulated GPUs)."""
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """What its log lines took (their text and a line's overhead), all attempts together:
    the database's rows and `log.txt` both hold them. Capped by TOWERQ_JOB_LOG_MAX_MB."""
    log_trimmed_through: Mapped[int | None] = mapped_column(BigInteger, default=None)
    """The newest of its log lines trimmed from the database (`attempts.trim_logs`; its
    `log.txt` keeps them all): a reader after an older line missed some. None: none was."""
    metric_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Metric points stored for it, all attempts together."""
    on_hold_by: Mapped[str | None] = mapped_column(String(64), default=None)
    """Who put the queued job on hold (`service.jobs.holds`): it waits, left out of every
    pass, until they or an admin release it. None: not on hold."""
    on_hold_at: Mapped[datetime | None] = mapped_column(default=None)
    held_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Seconds it could not start by its owner's or an admin's word: on hold, every hold
    together but the current one, and before its `begin_at`. Not counted as waiting (the
    scheduler's aging and order read it as submitted that much later)."""
    wait_held_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """Of `held_s`, the seconds on hold before its first start: the wait figures (submit to
    first start: `towerq usage`, Prometheus' queue wait) leave them out (`wait_start`)."""
    begin_at: Mapped[datetime | None] = mapped_column(default=None)
    """It may not start before this (`begin_at` in its spec, as `sbatch --begin`): each pass
    leaves it out until then. The time from its submit to then is no wait: it is in `held_s`
    and `wait_held_s` from the submit (`service.jobs.begin`)."""

    # What the scheduler says about a queued job.
    queue_position: Mapped[int | None] = mapped_column(Integer, default=None)
    pending_reason: Mapped[str | None] = mapped_column(Text, default=None)
    reserved_start_at: Mapped[datetime | None] = mapped_column(default=None)
    expected_start_at: Mapped[datetime | None] = mapped_column(default=None)
    """When the scheduler's forward replay expects it to start (`service.scheduler.forecast`)."""
    expected_host: Mapped[str | None] = mapped_column(String(128), default=None)
    requirements_failed_on: Mapped[list[Any] | None] = mapped_column(default=None)
    """The hosts whose latest build ahead of its requirements failed while it waited
    (`worker.prepare`; its log says pip's reason): started there as things are, it fails. A
    host that builds them later comes off. None: none failed."""

    # What the current (or last) attempt saw and did.
    host_name: Mapped[str | None] = mapped_column(String(128), default=None)
    pid: Mapped[int | None] = mapped_column(Integer, default=None)
    cuda_visible_devices: Mapped[str | None] = mapped_column(String(256), default=None)
    towers: Mapped[int | None] = mapped_column(Integer, default=None)
    devices: Mapped[list[Any] | None] = mapped_column(default=None)
    memory_limit_enforced: Mapped[bool | None] = mapped_column(Boolean, default=None)
    batch_norm: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """{"synchronized": [...], "per_tower": [...]}: batch-norm layers, as the trainer ran them."""
    artifacts_dir: Mapped[str | None] = mapped_column(Text, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)

    # The latest numbers, kept on the row so that a list of jobs needs no metric query.
    step: Mapped[int | None] = mapped_column(Integer, default=None)
    loss: Mapped[float | None] = mapped_column(Float, default=None)
    accuracy: Mapped[float | None] = mapped_column(Float, default=None)
    eval_loss: Mapped[float | None] = mapped_column(Float, default=None)
    eval_accuracy: Mapped[float | None] = mapped_column(Float, default=None)
    examples_per_sec: Mapped[float | None] = mapped_column(Float, default=None)
    step_time_s: Mapped[float | None] = mapped_column(Float, default=None)
    custom_metrics: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """The model's own metrics (`metrics()` of a code bundle) at the latest train point."""
    eval_custom_metrics: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """The same at the latest evaluation."""
    pace_s: Mapped[float | None] = mapped_column(Float, default=None)
    """Wall-clock seconds per step of the current attempt over the later half of the steps it
    trained (`worker.pace.Pace`), with its evaluations, checkpoints and pauses: what its
    expected end is told from (the trainer's `step_time_s` counts training alone, and an ETA
    from it was 3-4x too soon)."""
    step_at: Mapped[datetime | None] = mapped_column(default=None)
    """When its worker received the latest train point."""

    user: Mapped[User] = relationship()
    allocations: Mapped[list[Allocation]] = relationship(back_populates="job", order_by="Allocation.id")
    events: Mapped[list[JobEvent]] = relationship(order_by="JobEvent.id")

    @property
    def latest_metrics(self) -> Job:
        """The latest figures are columns of the job itself (`LatestMetrics` reads them)."""
        return self

    @property
    def gpu_use_summary(self) -> dict[str, Any] | None:
        """Its GPU use over every attempt: the mean busy share weighted by samples and GPUs,
        the memory peak, the smallest GPU (`GpuUseOut`); None without a sample. While it
        runs, since when its GPUs have been idle, where each rank's have been long enough."""
        return gpu_use_summary(self.gpu_use, self.attempts if self.state == JobState.RUNNING else None)

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at is not None

    @property
    def expected_end_at(self) -> datetime | None:
        """A running job: when its last step will be trained at its pace so far."""
        return expected_end_at(self.state, self.step, self.step_at, self.pace_s, self.total_steps)

    @property
    def reason(self) -> str | None:
        """Why the job is where it is: what failed it, who or what cancelled it, why it
        waits, why it is being stopped; None for a job that runs or succeeded as asked."""
        if self.state == JobState.FAILED:
            return self.error or "failed"
        if self.state == JobState.CANCELLED:
            return self.error or self.stop_reason or "cancelled"
        if self.state == JobState.QUEUED:
            # what fails it when it starts goes first: a list cuts a reason short
            return "; ".join(filter(None, (failed_text(self.requirements_failed_on), self.pending_reason))) or None
        if self.stop_reason and self.state in HOLDING_STATES:
            return f"stopping: {self.stop_reason}"
        if self.state == JobState.DISPATCHED:
            return self.pending_reason  # what an executor's cluster says of it (Slurm's reason), if any
        if self.state == JobState.RUNNING and (idle := idle_text(self.gpu_use_summary)):
            return idle
        return None


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    spec: Mapped[dict[str, Any]] = mapped_column()
    grid: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    user: Mapped[User] = relationship()


class SweepRung(Base):
    """One setting of an adaptive sweep at one rung (`service.jobs.asha`): the sweep's metric
    when it got there, and whether it went on. Written once; the searcher's whole state, so a
    restarted scheduler decides the same."""

    __tablename__ = "sweep_rungs"

    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rung: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    """The step of the report compared (the first at or past the rung's)."""
    value: Mapped[float | None] = mapped_column(Float)
    """None: the setting failed or was cancelled before the rung (the worst there)."""
    stopped: Mapped[bool] = mapped_column()
    cut: Mapped[float | None] = mapped_column(Float)
    """The worst value that went on at this rung when it was decided."""
    reached_at: Mapped[datetime] = mapped_column()


class JobEvent(Base):
    """One state transition of a job, with its time and why."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text, default=None)


def expected_end_at(
    state: str, step: int | None, step_at: datetime | None, pace_s: float | None, total_steps: int | None
) -> datetime | None:
    """A running job's ETA: when its last step will be trained at its pace so far (the
    worker's measure, `worker.pace.Pace`); None for a job not running or not yet measured,
    and for one whose total is its program's (a command job).
    The scheduler's expected starts take running jobs to end then (`scheduler.capacity`)."""
    if state != JobState.RUNNING or pace_s is None or step is None or step_at is None or total_steps is None:
        return None
    return step_at + timedelta(seconds=max(0, total_steps - step) * pace_s)


def wait_start(created_at: datetime, wait_held_s: float) -> datetime:
    """When a job's wait for its first start began: its submit, moved later by its time on
    hold before that start (`Job.wait_held_s`), which is no wait."""
    return created_at + timedelta(seconds=wait_held_s)


def failed_text(hosts: list[Any] | None) -> str | None:
    """What a waiting job's reason adds when its requirements could not be installed on
    `hosts` (its log, the owner's, says pip's reason)."""
    if not hosts:
        return None
    return f"its requirements could not be installed on {', '.join(map(str, hosts))} (its log says why)"


def gpu_use_summary(stored: dict[str, Any] | None, running: int | None = None) -> dict[str, Any] | None:
    """Every attempt's and rank's `GpuUse` (`Job.gpu_use`) as one: the busy share over all
    their GPU-samples, the highest memory peak, the smallest GPU's memory, the samples; and
    for the attempt `running` (None: the job does not run), since when its GPUs have been
    idle: where every rank of it says so, the latest of theirs."""
    parts = [part for part in (stored or {}).values() if isinstance(part, dict) and part.get("samples")]
    if not parts:
        return None
    weights = [part["samples"] * part["gpus"] for part in parts]
    busy = sum(w * part["busy_pct"] for w, part in zip(weights, parts, strict=True)) / sum(weights)
    peaks = [part["memory_peak_mb"] for part in parts if part.get("memory_peak_mb") is not None]
    totals = [part["memory_total_mb"] for part in parts if part.get("memory_total_mb") is not None]
    return {
        "busy_pct": round(busy, 1),
        "memory_peak_mb": max(peaks) if peaks else None,
        "memory_total_mb": min(totals) if totals else None,
        "samples": sum(part["samples"] for part in parts),
        "idle_since": idle_since(stored, running),
    }


def idle_since(stored: dict[str, Any] | None, running: int | None) -> str | None:
    """Since when the GPUs of the attempt `running` (None: the job does not run) have been
    idle, where every rank of it says so in `Job.gpu_use`: the latest of theirs."""
    now = [part for key, part in (stored or {}).items() if running is not None and key.startswith(f"{running}.")]
    idle = [part.get("idle_since") for part in now]
    return max(idle, key=datetime.fromisoformat) if idle and all(idle) else None


def idle_stop_since(stored: dict[str, Any] | None, attempt: int, ranks: int) -> datetime | None:
    """Since when the GPUs of every one of the `ranks` ranks of `attempt` have been idle,
    where each rank's figures in `Job.gpu_use` say that has lasted the lab's stop time: the
    latest of theirs (None: a rank is busy, or has not said)."""
    parts = [part for key, part in (stored or {}).items() if key.startswith(f"{attempt}.")]
    since = [part.get("idle_stop_since") for part in parts]
    if len(since) < ranks or not all(since):
        return None
    return max(datetime.fromisoformat(moment) for moment in since)


def idle_text(use: dict[str, Any] | None) -> str | None:
    """`its GPUs have been idle for 35m (busy under 5% at every sample)` for a running job
    whose GPUs its workers found idle past the lab's warning time; else None."""
    since = (use or {}).get("idle_since")
    if not since:
        return None
    seconds = (utcnow() - datetime.fromisoformat(since)).total_seconds()
    return f"its GPUs have been idle for {span_text(seconds)} (busy under {GPU_BUSY_PCT:g}% at every sample)"
