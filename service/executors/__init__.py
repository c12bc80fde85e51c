"""Executors: the one seam between "the policy placed this attempt on these GPUs" and "a
trainer runs somewhere". `local` (the default) is the lab's own hosts, each with a
`towerq worker` on an RQ queue; `slurm` is an existing Slurm cluster. They are found by
name in a registry (`EXECUTORS`, `register`), and `executor_for` builds the one
`TOWERQ_EXECUTOR` names: a new executor (Kubernetes, a cloud) registers itself, with no
branch to add here or in the settings."""

from __future__ import annotations

from collections.abc import Callable

import redis

from service.core.settings import Settings
from service.executors.base import Attempt, Capacity, Ended, Executor, ExecutorError, Seen
from service.executors.local import LocalExecutor
from service.executors.slurm import SlurmExecutor

__all__ = [
    "EXECUTORS",
    "Attempt",
    "Capacity",
    "Ended",
    "Executor",
    "ExecutorError",
    "LocalExecutor",
    "Seen",
    "SlurmExecutor",
    "UnknownExecutorError",
    "executor_for",
    "known_executor",
    "register",
]

Factory = Callable[[Settings, redis.Redis], Executor]
"""Builds an executor from the lab's settings and its Redis connection."""

EXECUTORS: dict[str, Factory] = {}
"""Every executor towerq knows, by the name `TOWERQ_EXECUTOR` gives it."""


class UnknownExecutorError(ValueError):
    """`TOWERQ_EXECUTOR` names no registered executor."""


def register(name: str, factory: Factory) -> None:
    """Make an executor known by `name` (one name, one executor)."""
    if name in EXECUTORS and EXECUTORS[name] is not factory:
        raise ValueError(f"an executor named {name!r} is already registered")
    EXECUTORS[name] = factory


register("local", lambda settings, connection: LocalExecutor(connection))
register("slurm", lambda settings, connection: SlurmExecutor(settings))


def known_executor(name: str) -> Factory:
    """The registered executor named `name`; a process refuses to start on any other."""
    factory = EXECUTORS.get(name)
    if factory is None:
        known = ", ".join(sorted(EXECUTORS))
        raise UnknownExecutorError(f"TOWERQ_EXECUTOR: no executor named {name!r} (known: {known})")
    return factory


def executor_for(settings: Settings, connection: redis.Redis) -> Executor:
    """The executor the lab's settings name (`TOWERQ_EXECUTOR`)."""
    return known_executor(settings.executor)(settings, connection)
