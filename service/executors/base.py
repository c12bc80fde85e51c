"""What every executor does: four calls, and the types they speak.

- `submit(attempt)`: the pass has written the attempt's allocation (state `dispatched`);
  the executor gets a trainer started on those GPUs. It does not wait for the start: the
  trainer's side reports `running` through the core (`service.core.lifecycle`), as it
  reports metrics, logs and the end.
- `observe(attempt)`: what the executor knows of an attempt that has not reported
  `running` yet: whether it still holds it (queued, to start), and, where it can say, why it
  waits and when it expects to start it. An attempt it no longer holds and that never
  reported is lost: the reconciler resubmits it, then requeues the job.
- `stop(message)`: a stop the database already records (a cancel, a preemption or a time
  slice's end: `lifecycle.request_cancel` / `request_preemption`) is delivered to where the
  attempt runs; the trainer checkpoints and exits. The message only wakes the other side:
  what to do, and why, it reads from the job's row.
- `capacity(session)`: the hosts and GPUs jobs can be placed on, for the checks at submit.

An executor is built once per process (`service.executors.executor_for`) and is safe to
call from several threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session

from towerq.contract.messages import StopMessage


@dataclass(frozen=True)
class Attempt:
    """One attempt of one job, as the pass placed it."""

    job_id: int
    attempt: int
    host: str
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Seen:
    """What an executor knows of an attempt that has not started."""

    held: bool
    """It holds the attempt and will start it (local: its launch waits on the host's queue)."""
    reason: str | None = None
    """Why it waits, in the executor's words, where it says."""
    expected_start: datetime | None = None


@dataclass(frozen=True)
class Capacity:
    """One host's GPUs as jobs may ask for them."""

    gpus: tuple[int, ...]
    """The indices of its present GPUs."""
    smallest_gpu_mb: int | None
    """The memory of its smallest real GPU (None: simulated GPUs, no real limit)."""


class Executor(Protocol):
    name: str

    def submit(self, attempt: Attempt) -> None: ...

    def observe(self, attempt: Attempt) -> Seen: ...

    def stop(self, message: StopMessage) -> None: ...

    def capacity(self, session: Session) -> dict[str, Capacity]: ...
