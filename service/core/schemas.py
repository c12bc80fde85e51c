"""Pydantic schemas of what the API returns. The job spec users submit is the contract in
`towerq.contract.spec` (`JobSpec`), shared with the trainer."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasPath, BaseModel, ConfigDict, Field


class Out(BaseModel):
    """A schema read from ORM rows (`Out.model_validate(row)`), or built by field name."""

    model_config = ConfigDict(from_attributes=True, validate_by_name=True, validate_by_alias=True)


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
    reserved_start_at: datetime | None
    expected_start_at: datetime | None = Field(
        default=None, description="queued: when the scheduler's forward replay expects it to start"
    )
    expected_host: str | None = None
    folder_bytes: int | None = None
    """What its folder held on disk when its worker last measured it."""
    error: str | None
    reason: str | None = None
    """Why the job is where it is, in words: a failed job's error, who or what cancelled it,
    why a queued one waits, why a running one is being stopped."""
    exit_code: int | None
    step: int | None
    total_steps: int
    latest: LatestMetrics = Field(validation_alias="latest_metrics")
    pace_s: float | None = Field(
        default=None,
        description="running: wall-clock seconds per step of this attempt, evaluations and checkpoints included",
    )
    expected_end_at: datetime | None = Field(
        default=None, description="running: when its last step will be trained at that pace"
    )
    step_at: datetime | None = Field(default=None, description="when its worker received its latest train point")
    artifacts_dir: str | None
    sweep_id: int | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool


class NotificationOut(Out):
    url: str | None
    """None: the lab's TOWERQ_WEBHOOK_URL."""
    state: str
    attempts: int
    last_error: str | None
    delivered_at: datetime | None


class JobDetailOut(JobOut):
    events: list[JobEventOut]
    notifications: list[NotificationOut] = []
    """The webhooks sent (or being retried) since the job ended."""
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


class GpuHolder(BaseModel):
    job_id: int
    job_name: str
    user: str
    fraction: float


class GpuReservation(BaseModel):
    """The reservation that keeps a GPU for a group: the one in its window now, else the next."""

    id: int
    group: str
    start_at: datetime
    end_at: datetime
    now: bool
    """In its window now: only the group's jobs take the GPU."""


class GpuOut(BaseModel):
    host: str
    index: int
    uuid: str
    name: str
    memory_total_mb: int
    memory_used_mb: int
    utilization_pct: float | None
    simulated: bool
    drained: bool
    host_state: str
    free_fraction: float
    holders: list[GpuHolder]
    processes: list[dict[str, Any]]
    sandboxed: bool | None = None
    """Whether its host runs trainers in the sandbox (None: the worker did not say)."""
    reserved: GpuReservation | None = None
    """Kept for a group now or later: a free GPU is not free to everyone."""


class WorkerOut(BaseModel):
    name: str
    state: str
    simulated: bool
    gpus: int
    last_heartbeat_at: datetime
    heartbeat_age_s: float
    registered_at: datetime
    running_jobs: int
    info: dict[str, Any]
    sandboxed: bool | None = None
    """False: this host runs members' code unsandboxed (TOWERQ_SANDBOX=none)."""


class UsageRowOut(BaseModel):
    key: str
    """The user or host."""
    gpu_hours: float
    jobs: int
    """Jobs that held GPUs in the window."""
    started: int
    """Jobs that first started in the window: the waits are theirs."""
    median_wait_s: float | None
    p95_wait_s: float | None


class UsageOut(BaseModel):
    since: datetime
    until: datetime
    by: str
    rows: list[UsageRowOut]


class FairShareUserOut(BaseModel):
    user: str
    group: str | None = None
    """The group these figures are within (a user with jobs in several has a row in each)."""
    share: float
    usage_gpu_hours: float
    """Decayed GPU hours (half-life `TOWERQ_FAIR_SHARE_HALF_LIFE_S`)."""
    running_gpus: float
    queued_jobs: int
    owed: float | None
    """Their share among the users present (queued or running) in their group, 0..1; None
    when absent."""
    used: float | None
    """Their part of the use of those users, running jobs' likely rest included."""
    term: float | None
    """What the scheduler adds to their jobs' rank now (0 to 1, lower goes first): their own
    term within their group; when several groups are present, its mean with their group's."""


class FairShareGroupOut(BaseModel):
    group: str | None
    """None: the jobs that run in no group, as one group of share 1."""
    share: float
    usage_gpu_hours: float
    running_gpus: float
    queued_jobs: int
    owed: float | None
    """Its share among the groups present, 0..1; None when absent."""
    used: float | None
    term: float | None
    """The group's part of its users' terms (0 to 1; 0 while it is the only group present)."""
    max_gpus: float | None = None
    max_gpu_hours_week: float | None = None
    gpu_hours_week: float | None = None
    """GPU hours in the last 7 days, for a group with an hour quota."""


class FairShareOut(BaseModel):
    as_of: datetime
    half_life_s: float
    users: list[FairShareUserOut]
    groups: list[FairShareGroupOut] = []
    """Empty while the lab has no groups."""


class HeldOut(BaseModel):
    job_id: int
    job_name: str
    user: str
    host: str
    gpu: int
    fraction: float
    start: datetime
    end: datetime | None
    """None: still held."""
    group: str | None = None
    """The group its job ran in."""


class QueueSampleOut(BaseModel):
    time: datetime
    queued: int
    started: int
    """Jobs that first started since the previous sample; `median_wait_s` is theirs."""
    median_wait_s: float | None


class TimelineOut(BaseModel):
    since: datetime
    until: datetime
    now: datetime
    gpus: int = 0
    """The lab's GPUs now (present on registered hosts): the full scale of a chart of GPUs held."""
    allocations: list[HeldOut]
    queue: list[QueueSampleOut]


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
