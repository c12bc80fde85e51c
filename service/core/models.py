"""Database models: the source of truth for jobs, allocations, metrics, hosts and users."""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from towerq.contract.spec import Priority
from towerq.contract.versions import SPEC_VERSION


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC, also on SQLite (which stores it naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)


NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class JobState(enum.StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def holds_gpus(self) -> bool:
        return self in HOLDING_STATES


FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
HOLDING_STATES = (JobState.DISPATCHED, JobState.RUNNING)
"""The states of a job whose attempt holds GPUs (an allocation, a trainer starting or running)."""
UNSUCCESSFUL_STATES = frozenset({JobState.FAILED, JobState.CANCELLED})
"""The ends after which a job that waits for this one to succeed (`afterok`) never can start."""


class HostState(enum.StrEnum):
    UP = "up"
    DOWN = "down"


class Lab(Base):
    """The service's identity (one row, made by its first process): the Redis keyspace it
    claims carries it, so a second service on the same Redis is told, not mixed in
    (`service.core.keyspace`)."""

    __tablename__ = "lab"

    id: Mapped[int] = mapped_column(primary_key=True)
    identity: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_limit: Mapped[int | None] = mapped_column(Integer, default=None)
    share: Mapped[float] = mapped_column(Float, default=1.0)
    max_priority: Mapped[str | None] = mapped_column(String(8), default=None)
    """The highest priority this user may ask for; None: normal (admins: always high)."""
    may_use_network: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Whether their jobs may ask for the network (`network: true`): an admin's grant
    (admins always may). Such a job reaches what its host reaches."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user")

    @property
    def allowed_priority(self) -> str:
        return "high" if self.is_admin else self.max_priority or "normal"

    @property
    def active_tokens(self) -> int:
        return sum(1 for token in self.tokens if token.revoked_at is None)


class Group(Base):
    """A part of the lab (a sub-group, a project) that shares its GPUs by agreement: its
    share weighs it against the other groups, and its quotas cap it."""

    __tablename__ = "groups"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    share: Mapped[float] = mapped_column(Float, default=1.0)
    max_gpus: Mapped[float | None] = mapped_column(Float, default=None)
    """At most this many GPUs at once (fractions count as such); None: no cap."""
    max_gpu_hours_week: Mapped[float | None] = mapped_column(Float, default=None)
    """At most this many GPU hours in any 7 days; None: no cap."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    members: Mapped[list[GroupMember]] = relationship(
        back_populates="group", cascade="all, delete-orphan", order_by="GroupMember.id"
    )


class GroupMember(Base):
    __tablename__ = "group_members"
    __table_args__ = (UniqueConstraint("group_id", "user_id", name="uq_group_members_group_user"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    """The group the user's jobs run in when they name none."""

    group: Mapped[Group] = relationship(back_populates="members")
    user: Mapped[User] = relationship()


class Reservation(Base):
    """GPUs kept for a group over a window: from `start_at` only its jobs use them; before,
    others' jobs use them only if they are sure to end in time."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(primary_key=True)
    group: Mapped[str] = mapped_column(String(64), index=True)
    gpus: Mapped[list[Any]] = mapped_column()
    """The GPUs kept, chosen at creation: [[host, index], ...]."""
    start_at: Mapped[datetime] = mapped_column()
    end_at: Mapped[datetime] = mapped_column(index=True)
    note: Mapped[str] = mapped_column(String(200), default="")
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    user: Mapped[User] = relationship(back_populates="tokens")


class Host(Base):
    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=HostState.UP)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)

    gpus: Mapped[list[Gpu]] = relationship(back_populates="host", order_by="Gpu.index")


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("host_id", "index", name="uq_gpus_host_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    memory_total_mb: Mapped[int] = mapped_column(Integer)
    memory_used_mb: Mapped[int] = mapped_column(Integer, default=0)
    utilization_pct: Mapped[float | None] = mapped_column(Float, default=None)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    processes: Mapped[list[Any]] = mapped_column(default=list)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    host: Mapped[Host] = relationship(back_populates="gpus")


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
    gpu_memory_fraction: Mapped[float] = mapped_column(Float, default=1.0)
    requested_host: Mapped[str | None] = mapped_column(String(128), default=None)
    requested_gpus: Mapped[list[Any] | None] = mapped_column(default=None)
    time_limit_s: Mapped[int | None] = mapped_column(Integer, default=None)
    total_steps: Mapped[int] = mapped_column(Integer)
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
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """What its log lines took (their text and a line's overhead), all attempts together:
    the database's rows and `log.txt` both hold them. Capped by TOWERQ_JOB_LOG_MAX_MB."""
    metric_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Metric points stored for it, all attempts together."""
    """What the job's folder held on disk when its worker last measured it."""

    # What the scheduler says about a queued job.
    queue_position: Mapped[int | None] = mapped_column(Integer, default=None)
    pending_reason: Mapped[str | None] = mapped_column(Text, default=None)
    reserved_start_at: Mapped[datetime | None] = mapped_column(default=None)
    expected_start_at: Mapped[datetime | None] = mapped_column(default=None)
    """When the scheduler's forward replay expects it to start (`service.scheduler.forecast`)."""
    expected_host: Mapped[str | None] = mapped_column(String(128), default=None)

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
    trained (`worker.relay.Pace`), with its evaluations, checkpoints and pauses: what its
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
            return self.pending_reason
        if self.stop_reason and self.state in HOLDING_STATES:
            return f"stopping: {self.stop_reason}"
        if self.state == JobState.DISPATCHED:
            return self.pending_reason  # what an executor's cluster says of it (Slurm's reason), if any
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


class Allocation(Base):
    """One GPU (or a fraction of it) held by one attempt of one job."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_gpu_active", "gpu_id", "released_at"),
        Index("ix_allocations_released", "released_at"),  # what was held lately: usage, quotas, fair share
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"))
    fraction: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(default=None)

    job: Mapped[Job] = relationship(back_populates="allocations")
    gpu: Mapped[Gpu] = relationship()
    host: Mapped[Host] = relationship()


class RankAddress(Base):
    """Where one rank of a job over several hosts listens, for one attempt (`address:port`):
    its worker writes it and the other ranks' workers read it (`worker.rendezvous`). It is in
    the database, not in Redis, because it decides whom a trainer sends its gradients to and
    takes them from: whoever reaches Redis must not be able to point a rank elsewhere."""

    __tablename__ = "rank_addresses"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    address: Mapped[str] = mapped_column(String(300))
    key: Mapped[str] = mapped_column(String(64), default="", server_default="")
    """The rank's secret for this attempt: a peer's worker proves it knows it before its
    connection reaches the rank's trainer (`worker.trainer.tunnel`)."""


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


class NotificationState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Notification(Base):
    """A webhook owed for a finished job (or the sweep it finished): written in the
    transaction that ends the job (so none is lost or made twice), sent in the background by
    the scheduler process."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    url: Mapped[str | None] = mapped_column(Text, default=None)
    """The job's (or its sweep's) `notify_url`; None: the lab's TOWERQ_WEBHOOK_URL."""
    event: Mapped[str] = mapped_column(String(16), default="job.finished")
    """job.finished, or sweep.finished: the sweep of the job (its last to end) has ended, to
    the sweep's URL (`service.notifications.webhooks.owe_sweep_notifications`)."""
    state: Mapped[str] = mapped_column(String(16), default=NotificationState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)


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
    state: str, step: int | None, step_at: datetime | None, pace_s: float | None, total_steps: int
) -> datetime | None:
    """A running job's ETA: when its last step will be trained at its pace so far (the
    worker's measure, `worker.relay.Pace`); None for a job not running or not yet measured.
    The scheduler's expected starts take running jobs to end then (`scheduler.capacity`)."""
    if state != JobState.RUNNING or pace_s is None or step is None or step_at is None:
        return None
    return step_at + timedelta(seconds=max(0, total_steps - step) * pace_s)
