"""The lab as the API shows it: GPUs and workers, groups, reservations, users and tokens, the caller."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AliasPath, BaseModel, Field

from service.core.schemas import Out
from towerq.contract.spec import Priority


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
    no_notebooks: str | None = None
    """Why its host runs no notebook sessions, as its worker said (None: it runs them)."""
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
    job_disk: str | None = None
    """`image`: its job folders are disk images of their limit while attempts run (a hard
    size); `measure`: measured (TOWERQ_JOB_DISK); None: the worker did not say."""
    no_notebooks: str | None = None
    """Why it runs no notebook sessions (`info.no_notebooks`, its worker's word when it
    registered); None: it runs them (or, a worker from before, did not say)."""


class MemberOut(BaseModel):
    user: str
    default: bool = Field(description="their jobs run in this group when they name none")


class GroupOut(BaseModel):
    name: str
    share: float
    max_gpus: float | None
    max_gpu_hours_week: float | None
    gpu_hours_week: float = Field(description="GPU hours its jobs held in the last 7 days")
    members: list[MemberOut]
    created_at: datetime


class KeptGpu(BaseModel):
    host: str
    index: int


class HolderOut(BaseModel):
    job_id: int
    host: str
    gpu: int
    ends_at: datetime | None = Field(description="when its time limit ends it; null: it has none")


class ReservationOut(BaseModel):
    id: int
    group: str
    gpus: list[KeptGpu]
    start_at: datetime
    end_at: datetime
    active: bool = Field(description="its window has begun")
    note: str
    created_by: str
    created_at: datetime


class NewReservation(ReservationOut):
    held_past_start: list[HolderOut] = Field(
        description="jobs on the kept GPUs that may still run when the window starts: they are not stopped "
        "(unless TOWERQ_PREEMPTION is on and they were lent the GPUs), so the group may wait for them"
    )


class Me(BaseModel):
    user: str
    is_admin: bool
    token_id: int
    """The token this call was made with (the dashboard's: the one its session holds)."""
    places_jobs: bool = True
    """True where towerq's scheduler places each job on the lab's GPU hosts (a dispatched job
    is starting); False where it hands jobs to a cluster that places them (Slurm: a
    dispatched job may wait there, and can be held)."""


class UserOut(Out):
    name: str
    is_admin: bool
    gpu_limit: int | None
    share: float
    max_priority: Priority = Field(
        validation_alias="allowed_priority", description="the highest priority the user may give a job"
    )
    may_use_network: bool = Field(description="its jobs may ask for the network (admins: always)")
    tokens: int = Field(validation_alias="active_tokens", description="tokens not revoked")
    created_at: datetime


class TokenOut(Out):
    id: int
    user: str = Field(validation_alias=AliasPath("user", "name"))
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class NewToken(TokenOut):
    token: str = Field(description="the secret; shown only in this answer")
