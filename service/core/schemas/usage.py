"""Who used what: GPU hours, fair share, the timeline, storage."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


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
    gpu_busy_pct: float | None = None
    """How busy the GPUs were, over `sampled_gpu_hours` (None: no job's GPUs were sampled)."""
    sampled_gpu_hours: float = 0.0
    """Of `gpu_hours`, those of jobs whose workers sampled their GPUs (never simulated ones)."""


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
    """Jobs waiting at this moment."""
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


class StorageRow(BaseModel):
    user: str
    datasets_bytes: int
    code_bytes: int
    job_folders_bytes: int
    """What the user's jobs' folders held when their workers last measured them."""
    log_bytes: int = 0
    """What their jobs' log lines take (the database's rows and `log.txt`), all attempts."""
    metric_points: int = 0
    """Metric points stored for their jobs, all attempts."""


class StorageOut(BaseModel):
    datasets_quota_bytes: int
    code_quota_bytes: int
    job_folder_max_bytes: int
    """Each job folder's limit (0: none); a job past it is stopped."""
    job_log_max_bytes: int = 0
    """Each job's log limit, all its attempts together (TOWERQ_JOB_LOG_MAX_MB)."""
    users: list[StorageRow]
