"""Pydantic schemas of the API: the job spec users submit and what the API returns.

The training half of a spec (`TrainSpec`) belongs to the trainer, so that the API and the
trainer validate with the same rules; `JobSpec` adds how the job is scheduled.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.models import Priority
from worker.trainer.spec import TrainSpec

MAX_GPUS_PER_JOB = 64
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]*$")]


class JobSpec(TrainSpec):
    """A job as submitted: what to train (`TrainSpec`) and where/when it may run."""

    name: Name | None = None
    gpus: list[GpuIndex] | None = Field(default=None, min_length=1, max_length=MAX_GPUS_PER_JOB)
    gpu_count: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_JOB)
    host: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    gpu_memory_fraction: float = Field(default=1.0, gt=0, le=1)
    memory_growth: bool = False
    priority: Priority = Priority.NORMAL
    time_limit_s: int | None = Field(default=None, ge=1, le=365 * 24 * 3600)
    max_attempts: int | None = Field(default=None, ge=1, le=100)

    @model_validator(mode="after")
    def _gpus_and_count_agree(self) -> Self:
        if self.gpus is not None:
            if len(set(self.gpus)) != len(self.gpus):
                raise ValueError("gpus: each GPU may be named only once")
            if self.gpu_count is not None and self.gpu_count != len(self.gpus):
                raise ValueError(f"gpu_count is {self.gpu_count} but gpus names {len(self.gpus)} GPUs")
            self.gpu_count = len(self.gpus)
        elif self.gpu_count is None:
            self.gpu_count = 1
        if self.tower_weights is not None and len(self.tower_weights) != self.gpu_count:
            raise ValueError(f"tower_weights has {len(self.tower_weights)} entries for {self.gpu_count} GPUs")
        if self.memory_growth and self.gpu_memory_fraction < 1:
            raise ValueError("memory_growth cannot be combined with gpu_memory_fraction < 1")
        if self.name is None:
            self.name = f"{self.model}-{self.dataset}"[:128]
        return self

    def train_spec(self) -> TrainSpec:
        return TrainSpec.model_validate(self.model_dump(include=set(TrainSpec.model_fields)))


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class AllocationOut(Out):
    host: str
    gpus: list[int]
    gpu_uuids: list[str]
    fraction: float
    simulated: bool


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


class JobOut(Out):
    id: int
    name: str
    user: str
    state: str
    priority: str
    spec: dict[str, Any]
    gpu_count: int
    gpu_memory_fraction: float
    allocation: AllocationOut | None
    cuda_visible_devices: str | None
    towers: int | None
    devices: list[str] | None
    memory_limit_enforced: bool | None
    attempts: int
    crashes: int
    max_attempts: int
    queue_position: int | None
    pending_reason: str | None
    reserved_start_at: datetime | None
    error: str | None
    exit_code: int | None
    step: int | None
    total_steps: int
    latest: LatestMetrics
    artifacts_dir: str | None
    sweep_id: int | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool


class JobDetailOut(JobOut):
    events: list[JobEventOut]


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
