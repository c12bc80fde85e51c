"""Executors: the one seam between "the policy placed this attempt on these GPUs" and "a
trainer runs somewhere". `local` (the default) is the lab's own hosts, each with a
`towerq worker` on an RQ queue; `slurm` is an existing Slurm cluster; `executor_for` picks
the one `TOWERQ_EXECUTOR` names."""

from __future__ import annotations

import redis

from service.core.settings import Settings
from service.executors.base import Attempt, Capacity, Ended, Executor, ExecutorError, Seen
from service.executors.local import LocalExecutor
from service.executors.slurm import SlurmExecutor

__all__ = [
    "Attempt",
    "Capacity",
    "Ended",
    "Executor",
    "ExecutorError",
    "LocalExecutor",
    "Seen",
    "SlurmExecutor",
    "executor_for",
]


def executor_for(settings: Settings, connection: redis.Redis) -> Executor:
    """The executor the lab's settings name (`TOWERQ_EXECUTOR`)."""
    if settings.executor == "local":
        return LocalExecutor(connection)
    if settings.executor == "slurm":
        return SlurmExecutor(settings)
    raise ValueError(f"TOWERQ_EXECUTOR: no executor named {settings.executor!r} (known: local, slurm)")
