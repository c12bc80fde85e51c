"""What every executor does: eight calls, and the types they speak.

- `submit(attempt)`: the pass has written the attempt's allocation (state `dispatched`);
  the executor gets a trainer started on those GPUs. It does not wait for the start: the
  trainer's side reports `running` through the core (`service.core.lifecycle`), as it
  reports metrics, logs and the end.
- `observe(attempt)`: what the executor knows of an attempt: whether it still holds it
  (queued, to start, or running), and, where it can say, why it waits and when it expects
  to start it. An attempt it no longer holds and that never reported is lost: the
  reconciler resubmits it, then requeues the job. An executor whose cluster can end an
  attempt on its own (Slurm: a time limit, a failed node, an admin's `scancel`) says how,
  in `Seen.ended`; the reconciler records that end where the attempt did not record its own.
- `stop(message)`: a stop the database already records (a cancel, a preemption or a time
  slice's end: `lifecycle.request_cancel` / `request_preemption`) is delivered to where the
  attempt runs; the trainer checkpoints and exits. The message only wakes the other side:
  what to do, and why, it reads from the job's row.
- `hold(attempt, held)`: keep an attempt handed to the executor's cluster, not started yet,
  from starting (`towerq hold` of a dispatched job), or let it start again; raises
  `ExecutorError` where it cannot (it started meanwhile). Slurm: `scontrol hold` / `release`.
  Local: never (a dispatched attempt is starting already; only a queued job is held).
- `retime(attempt)`: a started attempt's job has a new time limit (`attempt.time_limit_s`,
  `towerq update --time-limit`): the cluster's own limit on it follows, before the change
  commits; raises `ExecutorError` where the cluster refuses (Slurm: `scontrol update
  TimeLimit=`, which takes a Slurm operator to lengthen). Local: nothing to do (its runner
  reads the limit from the job's row every second).
- `capacity(session)`: the hosts and GPUs jobs can be placed on, for the checks at submit.
- `runs_on(job_id, attempt, claimed)`: where the executor's cluster runs an attempt now, in
  its own word (asked afresh unless a recent answer confirms `claimed`): the API takes an
  attempt's claim over HTTP (the node it says it runs on) only of that node. None where
  the executor has no word of its own (local: its workers are towerq's own and claim their
  attempts in-process, never over HTTP).
- `reach(node)`: the address the API reaches a node of its cluster at, for the door of a
  notebook session that runs there (Slurm: the node's `NodeAddr`, which is its name unless
  slurm.conf gives it an address of its own). Local: the name as said (never asked: its
  workers open their doors in-process, at their own address).
- `places_jobs`: True where towerq's own policy places each attempt on the hosts and GPUs
  `capacity` lists (local); False where the executor's cluster decides where and when
  (Slurm): the scheduler then hands each queued job over as it comes.

An executor is built once per process (`service.executors.executor_for`) and is safe to
call from several threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    """Local: the host it was placed on (its GPUs are the allocation's rows). Slurm: the node
    the job asked for, or ""."""
    gpu_count: int = 0
    """How many GPUs it asks for (an executor that places them itself reads this)."""
    time_limit_s: int | None = None
    rank: int = 0
    """A job over several hosts: which of its hosts this is (one trainer per host)."""
    token: str | None = field(default=None, repr=False)
    """The attempt's own token for the attempt protocol over HTTP (`/api/attempts`), minted
    for this submission: what an executor's remote side holds instead of any credential."""


@dataclass(frozen=True)
class Ended:
    """How the executor's cluster ended an attempt that may not have recorded its end."""

    outcome: str
    """`cancelled`, `failed`, `requeue` (a crash: the job queues again and resumes from its
    checkpoint; it counts against `max_attempts`) or `preempted` (the same, not counted)."""
    message: str


@dataclass(frozen=True)
class Seen:
    """What an executor knows of an attempt that has not started."""

    held: bool
    """It holds the attempt and will start it (local: its launch waits on the host's queue)."""
    reason: str | None = None
    """Why it waits, in the executor's words, where it says."""
    expected_start: datetime | None = None
    expected_host: str | None = None
    """Where it expects to start it, where it says."""
    ended: Ended | None = None
    """Not held because the cluster ended it, and how."""


@dataclass(frozen=True)
class Capacity:
    """One host's GPUs as jobs may ask for them."""

    gpus: tuple[int, ...]
    """The indices of its present GPUs."""
    smallest_gpu_mb: int | None
    """The memory of its smallest real GPU (None: simulated GPUs, no real limit)."""


class ExecutorError(RuntimeError):
    """The executor's cluster refused a request or could not be asked (its own words)."""

    def __init__(self, message: str, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting
        """The request itself is wrong (a partition that does not exist): asking again will
        not help, so the job fails with this message. Otherwise (the controller does not
        answer) the attempt is asked for again later."""


class Executor(Protocol):
    name: str
    places_jobs: bool

    def submit(self, attempt: Attempt) -> None: ...

    def observe(self, attempt: Attempt) -> Seen: ...

    def stop(self, message: StopMessage) -> None: ...

    def hold(self, attempt: Attempt, held: bool) -> None: ...

    def retime(self, attempt: Attempt) -> None: ...

    def capacity(self, session: Session) -> dict[str, Capacity]: ...

    def runs_on(self, job_id: int, attempt: int, claimed: str | None = None) -> str | None: ...

    def reach(self, node: str) -> str: ...
