"""What a worker adds to a stored spec to run one attempt (`RuntimeSpec`: devices, memory
limits, folders), and the trainer's input file built from both (`TrainerInput`, made only
by `trainer_input`)."""

from __future__ import annotations

from typing import Any, Self

from pydantic import (
    Field,
    model_validator,
)

from towerq.contract.spec import JobSpec
from towerq.contract.training import PositiveInt, Strict, TrainSpec
from towerq.contract.versions import ADMITTED_UNDER, upgraded

MIN_MEMORY_LIMIT_MB = 256
"""A shared GPU's slice must leave at least this much to the job after the per-process cost."""


def memory_limit_mb(fraction: float, total_mb: int, reserved_mb: int, process_overhead_mb: int) -> int:
    """The framework memory limit of a job given `fraction` of a GPU it may share.

    The card is never wholly free (`reserved_mb`: what the driver uses with no process on
    it), and every process pays for its CUDA context outside any framework limit
    (`process_overhead_mb`). So the limit is f × (total − reserved) − overhead: jobs whose
    fractions sum to at most 1 then fit together, context and all."""
    return int(fraction * (total_mb - reserved_mb)) - process_overhead_mb


class RuntimeSpec(Strict):
    """Where and how this attempt runs; written by the worker, not by the user."""

    job_id: int | None = None
    attempt: int = Field(default=1, ge=1)
    artifacts_dir: str
    data_dir: str
    models_path: str
    code_path: str | None = Field(default=None, description="the job's code bundle, first on the import path")
    simulated: bool = True
    num_devices: PositiveInt = 1
    batch_gpus: PositiveInt | None = Field(
        default=None,
        description=(
            "the job's full size: a step's global batch is batch_size × this on any number of devices "
            "(a job resumed on fewer gives each a larger slice); None: num_devices"
        ),
    )
    gpu_memory_fraction: float = Field(default=1.0, gt=0, le=1)
    gpu_memory_total_mb: list[int] = Field(default_factory=list)
    gpu_memory_reserved_mb: int = Field(default=0, ge=0, description="used on a card with no process on it")
    gpu_process_overhead_mb: int = Field(default=0, ge=0, description="what a process's CUDA context costs")
    memory_growth: bool = False
    parent_pid: int | None = Field(default=None, description="the trainer exits if this process is gone")
    nice: int = Field(default=0, ge=0, le=19, description="CPU niceness the trainer runs at")
    inputs: dict[str, str] = Field(
        default_factory=dict, description="the folders of the jobs it waited for (`after`), by job id; read-only"
    )
    cluster: list[str] = Field(
        default_factory=list, max_length=256, description="a job over several hosts: every rank's host:port, by rank"
    )
    rank: int = Field(default=0, ge=0, description="this trainer's place in `cluster` (0 writes the job's files)")
    collective_timeout_s: float = Field(default=20.0, gt=0, le=3600, description="how long a rank waits for the others")
    rank_tunnel: str | None = Field(
        default=None,
        max_length=256,
        description="a sandboxed rank: its worker's control socket, through which it reaches the other ranks",
    )


class TrainerInput(Strict):
    """The whole spec file given to `python -m worker.trainer SPEC.json`."""

    train: TrainSpec
    runtime: RuntimeSpec

    @model_validator(mode="after")
    def _weights_match_devices(self) -> Self:
        weights = self.train.tower_weights
        if weights is not None and len(weights) != self.runtime.num_devices:
            raise ValueError(
                f"tower_weights has {len(weights)} entries but the job has {self.runtime.num_devices} towers"
            )
        size, devices = self.runtime.batch_gpus, self.runtime.num_devices
        if size is not None and size != devices:
            if size < devices:
                raise ValueError(f"{devices} devices for a job of {size} GPUs (batch_gpus)")
            if weights is not None:
                raise ValueError("tower_weights fit one size of job: a job on fewer GPUs than batch_gpus has none")
            if self.runtime.cluster:
                raise ValueError("a job over several hosts runs at its full size: batch_gpus is its devices")
        if self.runtime.cluster and not self.runtime.rank < len(self.runtime.cluster):
            raise ValueError(f"rank {self.runtime.rank} of a cluster of {len(self.runtime.cluster)}")
        if self.runtime.memory_growth and self.runtime.gpu_memory_fraction < 1:
            raise ValueError(
                "memory_growth cannot be combined with gpu_memory_fraction < 1: TensorFlow "
                "applies a memory limit through a logical device, which excludes memory growth"
            )
        return self


def admitted_spec(stored: dict[str, Any], version: int) -> JobSpec:
    """A stored spec (a `JobSpec` dump) read by the rules of the version that admitted it
    (`towerq.contract.versions`): a rule made stricter since does not refuse it. Raises
    pydantic's ValidationError, or NewerSpecError for a spec of a newer towerq."""
    return JobSpec.model_validate(upgraded(stored, version), context={ADMITTED_UNDER: version})


def trainer_input(stored: dict[str, Any], runtime: RuntimeSpec, version: int) -> TrainerInput:
    """The trainer's spec file for one attempt of a job whose spec was stored as `stored`,
    admitted under the spec rules' `version` (`admitted_spec`)."""
    job = admitted_spec(stored, version)
    update: dict[str, Any] = {"memory_growth": job.memory_growth}
    if not runtime.cluster:  # a step's batch is the job's full size's, whatever it runs on
        update["batch_gpus"] = job.gpu_count
    runtime = runtime.model_copy(update=update)
    return TrainerInput(train=job.train_spec(), runtime=runtime)
