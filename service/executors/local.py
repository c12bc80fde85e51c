"""The local executor: the lab's own GPU hosts, each running `towerq worker`.

- submit: a launch message (job id and attempt, `service.core.launches`) on the host's RQ
  queue `towerq:host:<name>`; the host's worker starts the trainer (`worker.agent`).
- observe: whether that launch still waits on the queue.
- stop: the stop message on the host's control channel `towerq:control:<name>`; the worker
  reads the job's row and signals the trainer.
- capacity: the hosts and GPUs the workers registered (`hosts` and `gpus` rows).
- runs_on: no word of its own (a worker claims its attempts in-process, never over HTTP).
"""

from __future__ import annotations

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from service.core import keys, launches
from service.core.models import Host
from service.executors.base import Attempt, Capacity, ExecutorError, Seen
from towerq.contract.messages import StopMessage, encode


class LocalExecutor:
    name = "local"
    places_jobs = True

    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection

    def submit(self, attempt: Attempt) -> None:
        launches.send(self.connection, attempt.host, attempt.job_id, attempt.attempt, attempt.rank)

    def observe(self, attempt: Attempt) -> Seen:
        return Seen(held=launches.pending(self.connection, attempt.job_id, attempt.attempt, attempt.rank))

    def stop(self, message: StopMessage) -> None:
        if message.host:
            self.connection.publish(keys.host_control_channel(message.host), encode(message))

    def hold(self, attempt: Attempt, held: bool) -> None:
        raise ExecutorError(f"job {attempt.job_id} is starting on {attempt.host}: only a queued job is held")

    def retime(self, attempt: Attempt) -> None:
        """Nothing: the attempt's runner reads the job's time limit every second."""

    def capacity(self, session: Session) -> dict[str, Capacity]:
        hosts = session.scalars(select(Host).options(selectinload(Host.gpus)))
        return {
            host.name: Capacity(
                gpus=tuple(sorted(g.index for g in host.gpus if g.present)),
                smallest_gpu_mb=min(
                    (g.memory_total_mb for g in host.gpus if g.present and not g.simulated), default=None
                ),
            )
            for host in hosts
        }

    def runs_on(self, job_id: int, attempt: int, claimed: str | None = None) -> str | None:
        return None

    def reach(self, node: str) -> str:
        return node
