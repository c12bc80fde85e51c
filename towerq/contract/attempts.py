"""The attempt protocol: everything the process that supervises one attempt of one job (a
GPU host's worker, a Slurm node's batch script) asks of towerq and tells it, and nothing more.

An executor's remote side first claims its attempt on the node its cluster chose (`claim`:
what to run). The supervisor reads whether its attempt is still the job's current one and whether a stop
was asked (`status`), says the process started (`running`), reports what it printed in
batches (`report`, each fenced: an attempt the job moved on from cannot write results, and
live copies for the charts, `publish`), forgets the points a resume trains again
(`forget_after`), ends the attempt with an outcome (`end`), and takes GPUs out of use that
a process it could not kill still holds (`drain`). A notebook session's supervisor also says
where its door is, and when it is shut (`open_door`, `close_door`).

`AttemptChannel` is the interface; `service.core.attempts.LocalChannel` implements it in
the supervisor's own process, over the database and Redis. Every call that writes checks in
its transaction that the attempt is current, else raises `StaleAttempt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from towerq.contract.events import Custom, Number, Step
from towerq.contract.times import Moment, limit_text, span_text

Stop = Literal["cancel", "sweep", "preempt", "gpu_idle", "time_limit"]
"""A stop towerq asks of an attempt: a cancel, an adaptive sweep's stop of a setting behind
(the job ends succeeded), a preemption (the job resumes later from its checkpoint), the
lab's stop of a job over several hosts whose GPUs every rank found idle for
TOWERQ_GPU_IDLE_STOP_S (the job fails, saying so), the job's time limit reached since the
attempt's start (every rank of a job over several hosts stops at once: each counting from
its own start, one would stop first and its peers' programs end as if it crashed)."""

MAX_FOLDER_BYTES = 2**50
"""The most a report says a job folder holds: a pebibyte, far above any a lab's disk holds
(a runner says at most this). Unbounded, a figure past 64 bits failed the write (a 500, found
by the schemathesis run), and 8,192 such folders still sum within 64 bits (the storage
report's total per member)."""

Ending = Literal["succeeded", "failed", "cancelled", "queued"]
"""How an attempt ends: the job's final state, or queued again for its next attempt."""


GPU_BUSY_PCT = 5.0
"""A GPU whose utilization NVML reports at or above this is in use, not idle (a job's idle
GPUs, a notebook session's idle end)."""


def time_limit_text(limit_s: int) -> str:
    """Why an attempt stopped at its time limit (the step it reached is said after), the
    limit as the job's log says it elsewhere (`1h30m`)."""
    return f"time limit of {limit_text(limit_s)} reached"


def idle_stop_text(idle_s: float, stop_s: float, hosts: int = 1) -> str:
    """Why a job whose GPUs stayed idle `idle_s` was stopped, the lab stopping such jobs at
    `stop_s` (TOWERQ_GPU_IDLE_STOP_S); `hosts`: the job's, where it runs over several."""
    where = f" on each of its {hosts} hosts" if hosts > 1 else ""
    return (
        f"stopped: its GPUs were idle for {span_text(idle_s)}{where} (busy under {GPU_BUSY_PCT:g}% at "
        f"every sample; the lab stops a job whose GPUs stay idle {limit_text(round(stop_s))}: TOWERQ_GPU_IDLE_STOP_S)"
    )


class GpuUse(BaseModel):
    """What one rank's GPUs did over one attempt, as the driver (NVML) said at each of the
    worker's samples (`worker.gpu_use`): how busy they were, and the most memory the
    attempt's own processes held on one of them."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0, le=1023)
    gpus: int = Field(ge=1, le=1024)
    """How many GPUs the samples cover."""
    samples: int = Field(ge=1, lt=2**31)
    busy_pct: float = Field(ge=0, le=100)
    """The share of the time a kernel ran on them (NVML's utilization), mean over the
    samples and the GPUs; on a GPU shared with other jobs, theirs too."""
    memory_peak_mb: int | None = Field(default=None, ge=0, lt=2**31)
    """The most its processes held on one GPU at a sample (None: the driver did not say)."""
    memory_total_mb: int | None = Field(default=None, ge=0, lt=2**31)
    """The smallest of its GPUs' memory."""
    idle_since: Moment | None = None
    """Since when its GPUs have been idle (busy under GPU_BUSY_PCT at every sample), once that has
    lasted the lab's warning time (TOWERQ_GPU_IDLE_WARN_S); None while they are busy."""
    idle_stop_since: Moment | None = None
    """The same, once it has lasted the lab's stop time (TOWERQ_GPU_IDLE_STOP_S; None where the
    lab stops none): a job over several hosts is stopped once every rank says so."""


class Figures(BaseModel):
    """The job's fields a report may set: nothing else of its row is the supervisor's to write."""

    model_config = ConfigDict(extra="forbid")

    # the newest train and evaluation figures, and the pace (`worker.relay.MetricSink`)
    step: Step | None = None
    loss: Number = None
    accuracy: Number = None
    examples_per_sec: Number = None
    step_time_s: Number = None
    custom_metrics: Custom = None
    eval_loss: Number = None
    eval_accuracy: Number = None
    eval_custom_metrics: Custom = None
    pace_s: Number = None
    step_at: Moment | None = None
    total_steps: Annotated[int, Field(ge=1, lt=2**62)] | None = None
    """A command job's program said how many steps it runs (the service takes it from a
    command job only: a model job's is its spec's)."""
    # what the attempt's folder holds (`worker.folder`)
    folder_bytes: Annotated[int, Field(ge=0, le=MAX_FOLDER_BYTES)] | None = None
    # what a trainer's `started` line says (`towerq.contract.events.Started.job_fields`)
    towers: Annotated[int, Field(ge=1, le=1024)] | None = None
    devices: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=1024)
    cuda_visible_devices: str | None = Field(default=None, max_length=256)
    memory_limit_enforced: bool | None = None
    batch_norm: dict[str, list[str]] | None = None
    # what its GPUs did (`worker.gpu_use`): kept per attempt and rank (`Job.gpu_use`)
    gpu_use: GpuUse | None = None


REPORTED_FIELDS = frozenset(Figures.model_fields)


class StaleAttempt(Exception):  # noqa: N818 - the name says what happened, as the service's StaleAttemptError
    """The job has moved on from this attempt: what it reports is refused (fencing)."""


class Refused(Exception):  # noqa: N818 - the name says what happened
    """towerq did not take what the attempt said, in towerq's words: a claim of a node its
    executor's cluster does not run it on, a door elsewhere than on its node and a rank
    port. `passing`: it could not be taken now (the cluster or the API could not be asked);
    another attempt may do."""

    def __init__(self, message: str, passing: bool = False) -> None:
        super().__init__(message)
        self.passing = passing


@dataclass(frozen=True)
class AttemptStatus:
    current: bool
    """The attempt still holds its GPUs (the job is dispatched or running, at this attempt)."""
    stop: Stop | None = None
    reason: str | None = None
    """Why the stop was asked, in words (None: no stop, or none given)."""
    time_limit_s: int | None = None
    """The job's time limit as it is now (`towerq update` changes a started job's), read
    only where `limit_known`: None, then, is no limit."""
    limit_known: bool = False
    """towerq said the time limit (False: the question went unanswered; the runner keeps
    the limit it had)."""


class MetricRow(TypedDict):
    """A train or evaluation point, as stored."""

    job_id: int
    attempt: int
    step: int
    split: Literal["train", "eval"]
    loss: float | None
    accuracy: float | None
    learning_rate: float | None
    examples_per_sec: float | None
    custom: dict[str, float | None] | None
    time: datetime


class LogRow(TypedDict):
    """A line of the job's log, as stored."""

    job_id: int
    attempt: int
    time: datetime
    level: str
    message: str


@dataclass
class Report:
    """One batch of what an attempt printed: its points, its log lines, the job fields they
    change (`REPORTED_FIELDS`) and the bytes the lines add to the job's log."""

    metrics: list[MetricRow]
    logs: list[LogRow]
    fields: dict[str, Any]
    log_bytes: int
    last_words: bool = False
    """The trainer said it stopped with the other ranks of its job: its lines are kept even
    once the job moved on from this attempt (its points and fields are not)."""
    held: bool = False
    """Rank 0's worker read these before it learned that the job had moved on from the
    attempt (another rank's end, a host found down): what the attempt trained. Kept whole
    while the job has started no later attempt (a resumed one forgets the points past its
    checkpoint at its start); refused once one has."""
    rung: bool = False
    """The points take the job past a rung of its adaptive sweep: the scheduler decides now."""


@dataclass(frozen=True)
class Stored:
    """What a job stored so far, every attempt together, against its limits."""

    log_bytes: int
    """Its log's bytes (TOWERQ_JOB_LOG_MAX_MB)."""
    metric_points: int
    """Its metric points (TOWERQ_JOB_METRIC_POINTS_MAX)."""


@dataclass(frozen=True)
class AttemptEnd:
    ending: Ending
    message: str | None = None
    exit_code: int | None = None
    crashed: bool = False
    """For `queued`: the attempt crashed (counts against the job's `max_attempts`)."""
    out_of_memory: bool = False
    """For `queued`: it ran out of GPU memory on a shared GPU; its next attempt gets whole GPUs."""


class AttemptChannel(Protocol):
    """What one attempt's supervisor may ask of towerq (`job_id`, `attempt`: which one)."""

    job_id: int
    attempt: int

    def claim(self, node: str) -> Claim:
        """An executor's remote side: its attempt starts on `node` (its cluster's choice);
        what it runs. Raises `StaleAttempt` when the attempt is not waiting to start,
        `Refused` when the cluster does not say it runs on `node`."""

    def status(self) -> AttemptStatus: ...

    def running(self, pid: int, cuda_visible_devices: str, artifacts_dir: str) -> None:
        """The attempt's process started (raises `StaleAttempt` if it should not have)."""

    def stored(self) -> Stored:
        """What the job's log and metric points took so far, every attempt together."""

    def rungs(self) -> tuple[str, list[int]]:
        """The split of the job's adaptive sweep's metric and the steps of its rungs (empty
        when it is in no such sweep)."""

    def report(self, report: Report) -> None: ...

    def publish(self, payloads: list[str]) -> None:
        """Live copies of points and lines for the charts (`towerq.contract.messages`), at
        most once: a lost one is not sent again (the report stores them)."""

    def forget_after(self, step: int) -> None:
        """Delete the job's points after `step`: a resumed attempt trains those again."""

    def end(self, end: AttemptEnd) -> None: ...

    def drain(self, host: str, indices: list[int]) -> None:
        """No new work on these GPUs of `host`: a process of the attempt that could not be
        killed still holds them."""

    def open_door(self, address: str, key: str) -> None:
        """A notebook session's way in (`worker.door.Door`): where the API reaches it
        (`host:port`) and the secret the API proves it knows before it is let through.
        Raises `Refused` when towerq does not take it."""

    def close_door(self) -> None:
        """The session's door is shut: where it was, and its secret, are forgotten."""


# -- over HTTP (`/api/attempts/{job}/{attempt}/...`) ---------------------------------------

REPORT_ROWS = 5_000
"""Points, and lines, one report may carry (a batch is a few hundred)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PointIn(_Body):
    attempt: Annotated[int, Field(ge=1, le=10_000)]
    """The attempt that trained it: this one, or an earlier one whose points a resume restores."""
    step: Step
    split: Literal["train", "eval"]
    loss: Number = None
    accuracy: Number = None
    learning_rate: Number = None
    examples_per_sec: Number = None
    custom: Custom = None
    time: Moment


class LineIn(_Body):
    time: Moment
    level: Literal["debug", "info", "warning", "error"]
    message: str = Field(max_length=10_000)


class ReportIn(_Body):
    number: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    """1, 2, ... for each report of the attempt's token: a resend (its answer was lost) is stored once."""
    metrics: list[PointIn] = Field(default_factory=list, max_length=REPORT_ROWS)
    logs: list[LineIn] = Field(default_factory=list, max_length=REPORT_ROWS)
    fields: Figures = Field(default_factory=Figures)
    log_bytes: Annotated[int, Field(ge=0, le=2**40)] = 0
    last_words: bool = False
    held: bool = False
    rung: bool = False


class RunningIn(_Body):
    pid: Annotated[int, Field(ge=1, le=2**31)]
    cuda_visible_devices: str = Field(max_length=256)
    artifacts_dir: str = Field(max_length=4096)


class EndIn(_Body):
    ending: Ending
    message: str | None = Field(default=None, max_length=10_000)
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None
    crashed: bool = False
    out_of_memory: bool = False


class DoorIn(_Body):
    address: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,253}:\d{1,5}$")
    """`node:port`: the node the attempt claimed, a port of `TOWERQ_RANK_PORTS`."""
    key: str = Field(pattern=r"^[0-9a-f]{64}$")


class ClaimIn(_Body):
    node: str = Field(min_length=1, max_length=128)


class Claim(BaseModel):
    """What an attempt runs, as its claim answers it."""

    spec: dict[str, Any]
    spec_version: int
    fraction: float
    time_limit_s: int | None
    inputs: list[tuple[int, str]]
    """The folders of the jobs it waited for that its owner may read: (job id, folder)."""
    notes: list[str]
    """What the attempt's log should say of its launch (a dependency's folder left out, and why)."""


class StatusOut(BaseModel):
    current: bool
    stop: Stop | None = None
    reason: str | None = None
    time_limit_s: int | None = None
    limit_known: bool = False
    """False from an API older than the field: the runner keeps the limit it started with."""


class RungsOut(BaseModel):
    split: str
    steps: list[int]
