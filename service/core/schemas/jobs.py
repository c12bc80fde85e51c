"""A job as the API shows it: its row, attempts, events, metrics, log lines, artifacts, a dry run's answer."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasPath, BaseModel, Field

from service.core.schemas import Out


class RankOut(Out):
    """One host of a job's allocation: a job over several hosts runs a trainer (a rank) on each."""

    rank: int
    host: str
    gpus: list[int]
    gpu_uuids: list[str] = []


class AllocationOut(Out):
    host: str
    """The host (rank 0's, for a job over several hosts)."""
    gpus: list[int]
    """Its GPUs on `host`."""
    gpu_uuids: list[str]
    fraction: float
    simulated: bool
    ranks: list[RankOut] = []
    """Every host it holds GPUs on, by rank (one entry for a one-host job)."""


class HeldOut(Out):
    """What one attempt held: its GPUs, from when until when, and the step it started from."""

    attempt: int
    host: str
    """Its host (rank 0's, for a job over several hosts)."""
    gpus: int
    """How many GPUs it held, on every host."""
    since: datetime
    until: datetime | None
    """None: it holds them still."""
    from_step: int
    """The step it started after (0: from the start; a resumed attempt: its checkpoint's)."""


class JobEventOut(Out):
    time: datetime
    state: str
    attempt: int
    message: str | None


class LatestMetrics(Out):
    step: int | None
    loss: float | None
    accuracy: float | None
    eval_loss: float | None
    eval_accuracy: float | None
    examples_per_sec: float | None
    step_time_s: float | None
    custom_metrics: dict[str, float | None] | None = None
    """The model's own metrics at the latest train point (`metrics()` of a code bundle)."""
    eval_custom_metrics: dict[str, float | None] | None = None
    """The same at the latest evaluation."""


class GpuUseOut(BaseModel):
    """What a job's GPUs did over its attempts, as its workers sampled the driver (NVML)."""

    busy_pct: float = Field(
        description="the share of the time a kernel ran on its GPUs (on a shared GPU, its neighbours' too)"
    )
    memory_peak_mb: int | None = Field(description="the most GPU memory its own processes held on one GPU")
    memory_total_mb: int | None = Field(description="the memory of its smallest GPU")
    samples: int = Field(description="the samples taken (every TOWERQ_GPU_USE_SAMPLE_S, each rank)")
    idle_since: datetime | None = Field(
        default=None,
        description="running: since when its GPUs have been idle, once past TOWERQ_GPU_IDLE_WARN_S (null: busy)",
    )


class JobOut(Out):
    """A job as the API shows it, read from a `Job` row (`JobOut.model_validate(job)`); the
    allocation comes from the allocations table (`service.jobs.read.allocations_of`)."""

    id: int
    name: str
    user: str = Field(validation_alias=AliasPath("user", "name"))
    group: str | None = Field(default=None, description="the group it runs in (its share and quotas)")
    state: str
    priority: str
    spec: dict[str, Any]
    gpu_count: int
    min_gpu_count: int | None = Field(
        default=None, description="an elastic job's least size: it runs on this many to gpu_count GPUs (None: rigid)"
    )
    gpu_memory_fraction: float
    allocation: AllocationOut | None = None
    cuda_visible_devices: str | None
    towers: int | None
    devices: list[str] | None
    memory_limit_enforced: bool | None
    batch_norm: dict[str, list[str]] | None = Field(
        default=None, description="batch-norm layers synchronised across towers, and those run per tower"
    )
    attempts: int
    crashes: int
    max_attempts: int
    queue_position: int | None
    pending_reason: str | None
    on_hold_by: str | None = Field(
        default=None, description="queued: who put it on hold (towerq hold; it waits until released); None: not on hold"
    )
    on_hold_at: datetime | None = Field(default=None, description="queued, on hold: when this hold began")
    held_s: float = Field(
        default=0.0,
        description=(
            "seconds it could not start by its owner's or an admin's word, no wait: on hold (every hold but a "
            "current one) and from its submit to its begin_at"
        ),
    )
    reserved_start_at: datetime | None
    expected_start_at: datetime | None = Field(
        default=None, description="queued: when the scheduler's forward replay expects it to start"
    )
    expected_host: str | None = None
    requirements_failed_on: list[str] | None = Field(
        default=None,
        description=(
            "the hosts where its requirements could not be installed while it waited (their latest try; its log "
            "says pip's reason): started there as things are, it fails"
        ),
    )
    folder_bytes: int | None = None
    """What its folder held on disk when its worker last measured it."""
    gpu_use: GpuUseOut | None = Field(
        default=None,
        validation_alias="gpu_use_summary",
        description="how busy its GPUs were and the most memory it held there (null: no sample, or simulated GPUs)",
    )
    error: str | None
    reason: str | None = None
    """Why the job is where it is, in words: a failed job's error, who or what cancelled it,
    why a queued one waits, why a running one is being stopped."""
    exit_code: int | None
    step: int | None
    total_steps: int | None = Field(
        description=(
            "the steps a model job runs; a command job's as its program last said (towerq.report(total_steps=)), "
            "null until it does; null for a notebook"
        )
    )
    latest: LatestMetrics = Field(validation_alias="latest_metrics")
    pace_s: float | None = Field(
        default=None,
        description="running: wall-clock seconds per step of this attempt, evaluations and checkpoints included",
    )
    expected_end_at: datetime | None = Field(
        default=None, description="running: when its last step will be trained at that pace"
    )
    step_at: datetime | None = Field(default=None, description="when its worker received its latest train point")
    artifacts_dir: str | None = Field(
        description=(
            "the job's folder on its host, once it started; shown to admins only (null for members, "
            "whose way to its files is /api/jobs/{id}/artifacts)"
        )
    )
    sweep_id: int | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool


class NotificationOut(Out):
    id: int
    """The delivery's number, as its body says it (`delivery`); a failed one is sent again by
    `POST /api/jobs/{id}/notifications/{delivery}/resend`."""
    url: str | None
    """None: the lab's TOWERQ_WEBHOOK_URL."""
    event: str
    """job.finished, job.idle (its GPUs idle past the lab's warning time) or sweep.finished."""
    state: str
    attempts: int
    last_error: str | None
    delivered_at: datetime | None


class JobDetailOut(JobOut):
    events: list[JobEventOut]
    held: list[HeldOut] = []
    """The GPUs each attempt held, the first attempt first (the job page's "GPUs held")."""
    notifications: list[NotificationOut] = []
    """The webhooks sent (or being retried): since the job ended, and when it went idle."""
    outputs_readable: bool = True
    """Whether the caller may read the job's log, artifacts and code (service/jobs/privacy.py)."""
    url: str | None = None
    """A notebook session: where its JupyterLab opens, a path of the API (owner and admins)."""


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class MetricOut(Out):
    step: int
    split: Literal["train", "eval"]
    loss: float | None
    accuracy: float | None
    learning_rate: float | None
    examples_per_sec: float | None
    custom: dict[str, float | None] | None = None
    """The user model's own metrics (`metrics(labels, logits)` in its module), by name."""
    time: datetime
    attempt: int


class LogLineOut(Out):
    id: int
    time: datetime
    level: str
    message: str
    attempt: int


class DryRunOut(BaseModel):
    """`POST /api/jobs?dry_run=true`: nothing stored; when the job would likely start."""

    dry_run: bool
    starts_now: bool
    expected_start_at: datetime | None
    """None: not within the forecast's reach (a host down, a queue too long, a month out)."""
    expected_host: str | None
    queue_position: int | None
    reason: str | None
    """Why it would wait, as the queue would say."""
    starts_on: int | None = None
    """How many GPUs it would start on now (an elastic job: maybe fewer than gpu_count)."""


class ArtifactOut(BaseModel):
    path: str
    size: int
    modified: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactOut]
    total_bytes: int
    truncated: bool
    """More than 10,000 files: the list stops there (the .tar.gz has them all)."""
