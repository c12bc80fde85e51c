"""The runner of an attempt, by what its job runs: a notebook session's (`worker.notebook`),
a command job's program's (`worker.program`), or a model in towerq's trainer's
(`worker.runner`). A GPU host's worker (`worker.agent`) and a Slurm node's attempt
(`worker.slurm`) both start theirs here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.core.context import Context
from service.core.settings import Settings
from towerq.contract.attempts import AttemptChannel
from towerq.contract.spec import is_command, is_notebook
from worker.attempt import AttemptRunner
from worker.inventory import Inventory
from worker.launch import Launch
from worker.notebook import NotebookRunner
from worker.pool import TrainerPool
from worker.program import ProgramRunner
from worker.runner import JobRunner


def runner_for(
    ctx: Context | None,
    inventory: Inventory,
    launch: Launch,
    on_exit: Callable[[Any], None],
    sandboxed: bool,
    pool: TrainerPool | None = None,
    *,
    channel: AttemptChannel | None = None,
    settings: Settings | None = None,
) -> AttemptRunner:
    """The runner of the attempt `launch` (`AttemptRunner`'s arguments; `pool`: the host's
    warm trainers, for a model's)."""
    if is_notebook(launch.spec):
        return NotebookRunner(ctx, inventory, launch, on_exit, sandboxed, channel=channel, settings=settings)
    if is_command(launch.spec):
        return ProgramRunner(ctx, inventory, launch, on_exit, sandboxed, channel=channel, settings=settings)
    return JobRunner(ctx, inventory, launch, on_exit, sandboxed, pool, channel=channel, settings=settings)
