"""The job spec: one typed contract from the API to the trainer.

`JobSpec` is what a user submits (what to train, and where/when it may run); the API
stores its validated dump. The worker turns a stored spec into the trainer's input with
`trainer_input` (the training half, `TrainSpec` in `towerq.contract.training`, plus this
attempt's `RuntimeSpec`, both in `towerq.contract.runtime`), and the trainer validates that
file again before it builds anything. Everything the trainer would refuse for a reason known
at submit time is refused here, so the API answers 422 naming the field instead of accepting
a job that fails later.

Pure pydantic (no TensorFlow, no database), in the contract every side imports (the
service, the worker, the trainer, the client). Every error names the field it is about.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator, model_validator

from towerq.contract.api import field_of
from towerq.contract.program_env import (
    COMMAND_MAX_ARGS,
    ENV_MAX_ENTRIES,
    REQUIREMENTS_MAX,
    CommandArg,
    EnvName,
    EnvValue,
    Requirement,
)
from towerq.contract.signals import LimitSignal, limit_signal
from towerq.contract.times import Moment
from towerq.contract.training import TrainSpec

MAX_GPUS_PER_JOB = 64


class Priority(enum.StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Higher runs first: low 0, normal 1, high 2."""
        return {"low": 0, "normal": 1, "high": 2}[self.value]


NO_CONTROL = r"^[^\x00-\x1f]*$"
"""A name's pattern: no control character (a newline would start a line of its own in a
log or a table)."""
BUNDLE_ID = r"^[0-9a-f]{64}$"
"""A code bundle's id: the SHA-256 of its archive, in hex."""
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NO_CONTROL)]
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
Visibility = Literal["private", "lab"]
JobRef = Annotated[int, Field(ge=1, le=2**31 - 1)]
SweepRef = Annotated[str, Field(pattern=r"^sweep:[1-9][0-9]{0,9}$")]


def _one_of_refs(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:  # pydantic would say why it is neither, once per kind
        raise ValueError(f"{value!r} is neither a job's id nor sweep:ID") from None


Dependency = Annotated[JobRef | SweepRef, WrapValidator(_one_of_refs)]
GROUP_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
GroupName = Annotated[str, Field(pattern=GROUP_NAME_PATTERN)]
MAX_DEPENDENCIES = 64
AfterCondition = Literal["afterok", "afterany"]


OMITTED_WHEN_UNSET = ("kind", "idle_timeout_s", "signal", "begin_at", "requirements")
"""Fields a stored spec has only where they are set (`JobSpec.stored`)."""
MODEL_ONLY_FIELDS = (
    "dataset_options",
    "hyperparameters",
    "variable_device",
    "tower_weights",
    "precision",
    "jit_compile",
    "memory_growth",
)
"""Fields that configure towerq's own trainer: a command job refuses them."""
NOTEBOOK_MIN_IDLE_S = 10


class JobSpec(TrainSpec):
    """A job as submitted: what to run (a model for towerq's trainer, `TrainSpec`, or a
    `command` from a code bundle) and where/when it may run."""

    model: str | None = Field(  # type: ignore[assignment]
        default=None, min_length=1, max_length=200, description="built-in name or module:function (or: command)"
    )
    dataset: str | None = Field(  # type: ignore[assignment]
        default=None,
        min_length=1,
        max_length=1024,
        description="a name, or kind:PATH under TOWERQ_DATA_DIR (a command job: optional, an upload, read only)",
    )
    kind: Literal["model", "command", "notebook"] | None = Field(
        default=None,
        description=(
            "what runs: a model in towerq's trainer, your own command, or a notebook session (JupyterLab on its "
            "GPUs, docs/notebooks.md); default: command when command is given, else model"
        ),
    )
    idle_timeout_s: int | None = Field(
        default=None,
        ge=NOTEBOOK_MIN_IDLE_S,
        le=365 * 24 * 3600,
        description=(
            "a notebook session ends after this long idle: no kernel busy, no browser connected, its GPUs unused "
            "(default and most: the lab's TOWERQ_NOTEBOOK_IDLE_TIMEOUT_S and TOWERQ_NOTEBOOK_MAX_IDLE_TIMEOUT_S)"
        ),
    )
    command: list[CommandArg] | None = Field(
        default=None,
        min_length=1,
        max_length=COMMAND_MAX_ARGS,
        description="your own program instead of a model: argv run without a shell in the code bundle's folder",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=ENV_MAX_ENTRIES, description="a command job's environment variables"
    )
    requirements: list[Requirement] | None = Field(
        default=None,
        min_length=1,
        max_length=REQUIREMENTS_MAX,
        description=(
            "a command job or notebook session: packages it runs with besides the lab's, from the lab's index "
            "(wheels only), "
            'as pip names them: ["einops", "transformers==4.46.1"]; installed once per host and list, and kept'
        ),
    )
    processes: Literal["one", "per_gpu"] = Field(
        default="one",
        description=(
            "a command job: one process that sees all its GPUs, or one per GPU (each sees its own) with RANK, "
            "WORLD_SIZE, MASTER_ADDR/PORT and TF_CONFIG"
        ),
    )
    resumable: bool = Field(
        default=False,
        description=(
            "a command job that resumes from TOWERQ_CHECKPOINT_DIR: only such jobs are preempted or time sliced "
            "(model jobs always resume)"
        ),
    )
    name: Name | None = Field(default=None, description="default: model-dataset, or the command")
    gpus: list[GpuIndex] | None = Field(
        default=None, min_length=1, max_length=MAX_GPUS_PER_JOB, description="these GPU indices (with host)"
    )
    gpu_count: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_JOB,
        description=(
            "any this many GPUs of one host (default 1); more than a host has: whole hosts of the "
            "largest size, one trainer (rank) on each (docs/multihost.md; a command job also needs network)"
        ),
    )
    min_gpu_count: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_JOB,
        description=(
            "elastic: it may start on as few GPUs of one host as this, grow to gpu_count and shrink back, "
            "restarting from its checkpoint; a step's batch stays gpu_count's (docs/scheduling.md)"
        ),
    )
    host: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(default=None, description="run only there")
    gpu_memory_fraction: float = Field(default=1.0, gt=0, le=1, description="below 1: share GPUs with other jobs")
    memory_growth: bool = Field(default=False, description="let TensorFlow take GPU memory as it needs it")
    priority: Priority = Field(default=Priority.NORMAL, description="high is for admins and users allowed it")
    time_limit_s: int | None = Field(
        default=None, ge=1, le=365 * 24 * 3600, description="stopped (after a checkpoint) when it runs longer"
    )
    signal: Annotated[LimitSignal, Field(max_length=32)] | None = Field(
        default=None,
        description=(
            "a command job: this signal to its program that many seconds before its time limit stops it, "
            "as sbatch --signal: USR1@600 (USR1, USR2, HUP, INT or ALRM; 60 s when no @)"
        ),
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="crashes before it fails (default TOWERQ_MAX_ATTEMPTS; members: ≤ TOWERQ_MAX_ATTEMPTS_LIMIT)",
    )
    notify_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description=(
            "POST a JSON notification here when the job ends, and while it runs when its GPUs have been idle "
            "for the lab's TOWERQ_GPU_IDLE_WARN_S (besides the lab's TOWERQ_WEBHOOK_URL)"
        ),
    )
    network: bool = Field(
        default=False,
        description=(
            "in the sandbox, reach the network (a model downloading weights, a command job's ranks over "
            "several hosts); an admin's grant per member, and only where Redis and the database ask for "
            "passwords; default: loopback only"
        ),
    )
    code: str | None = Field(
        default=None,
        pattern=BUNDLE_ID,
        description="a code bundle's id (POST /api/code): `model` is then `module:function` inside it",
    )
    begin_at: Moment | None = Field(
        default=None,
        description=(
            "it starts no earlier than this (an ISO time; one without a zone is UTC), as sbatch --begin; "
            "the time until then is no wait"
        ),
    )
    hold: bool = Field(
        default=False,
        description="queue it on hold: it starts only once released (towerq release ID), as sbatch --hold",
    )
    visibility: Visibility = Field(
        default="private",
        description="who reads its log, artifacts and code: private (owner and admins) or lab (every member)",
    )
    after: list[Dependency] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="jobs (ids) or sweeps ('sweep:ID', all its jobs) it waits for; their folders are its inputs",
    )
    after_condition: AfterCondition = Field(
        default="afterok",
        description="afterok: each must succeed (one that fails or is cancelled cancels this job); afterany: end",
    )
    group: GroupName | None = Field(
        default=None, description="the group whose share and quotas it runs under (default: your default group)"
    )

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
        if self.min_gpu_count is not None:
            self._check_elastic()
        if self.kind == "notebook":
            self._check_notebook()
        elif self.idle_timeout_s is not None:
            raise ValueError("idle_timeout_s: applies to notebook sessions only (kind: notebook)")
        if self.kind == "command" and self.command is None:
            raise ValueError("command: kind command runs your own program: give its command")
        if self.kind == "model" and self.command is not None:
            raise ValueError("command: kind model runs a model in towerq's trainer: give model, not command")
        if self.kind == "notebook":
            pass
        elif self.command is not None:
            self._check_command()
        elif self.model is None:
            raise ValueError("model: give model (a Keras model for towerq's trainer) or command (your own program)")
        elif self.dataset is None:
            raise ValueError("dataset: a model job needs a dataset")
        elif self.env:
            raise ValueError("env: applies to command jobs only (a model reads model_options)")
        elif self.processes != "one":
            raise ValueError("processes: applies to command jobs only (a model job has a tower per GPU)")
        elif self.code is not None and ":" not in self.model:
            raise ValueError("with code, model names a function in the bundle: module:function")
        if self.signal is not None:
            self._check_signal()
        if self.requirements is not None and self.command is None and not self.is_notebook:
            raise ValueError(
                "requirements: applies to command jobs and notebook sessions (a model runs in towerq's trainer)"
            )
        if len(set(self.after)) != len(self.after):
            raise ValueError("after: each job or sweep may be named only once")
        if self.name is None and self.kind == "notebook":
            self.name = "notebook"
        elif self.name is None:
            shown = " ".join(self.command) if self.command is not None else f"{self.model}-{self.dataset}"
            self.name = "".join(c if c.isprintable() else " " for c in shown)[:128]
        return self

    def _check_elastic(self) -> None:
        """An elastic job (`min_gpu_count`) is resized by a stop at a checkpoint and a start
        from it on other GPUs: it must resume, and may run on any GPUs of a host."""
        assert self.min_gpu_count is not None and self.gpu_count is not None
        if self.min_gpu_count > self.gpu_count:
            raise ValueError(f"min_gpu_count: {self.min_gpu_count} is above gpu_count ({self.gpu_count})")
        if self.gpus is not None:
            raise ValueError("min_gpu_count: a job on the GPUs it names (gpus) runs on exactly those, never fewer")
        if self.tower_weights is not None:
            raise ValueError("min_gpu_count: tower_weights fit one size of job; an elastic job's size changes")
        if self.kind == "notebook":
            raise ValueError("min_gpu_count: a notebook session is never stopped to be resized (docs/notebooks.md)")
        if self.command is not None and not self.resumable:
            raise ValueError(
                "min_gpu_count: a command job is resized by a stop and a restart from its checkpoint: "
                "it must resume (resumable: true, reading TOWERQ_CHECKPOINT_DIR and the GPUs it is given)"
            )

    def _check_signal(self) -> None:
        assert self.signal is not None
        if self.command is None:
            raise ValueError(
                "signal: applies to command jobs only (a model job checkpoints on its own when its time limit stops it)"
            )
        name, before = limit_signal(self.signal)
        if self.time_limit_s is not None and before >= self.time_limit_s:
            raise ValueError(
                f"signal: SIG{name} {before} s before the time limit would come at the start: "
                f"time_limit_s is {self.time_limit_s}"
            )

    def _check_command(self) -> None:
        if self.model is not None:
            raise ValueError("command: give model or command, not both")
        if self.code is None:
            raise ValueError(
                "code: a command runs a program from a code bundle: upload its folder (POST /api/code, "
                "or `towerq run`) and give the bundle's id"
            )
        if not self.command or not self.command[0]:
            raise ValueError("command: its first entry names the program to run")
        for field in MODEL_ONLY_FIELDS:
            if field in self.model_fields_set:
                raise ValueError(f"{field}: applies to model jobs only, not to a command job")
        if self.dataset is not None and self.dataset_path is None:
            raise ValueError(
                f"dataset: {self.dataset!r} is towerq's trainer's own; a command job reads an upload "
                "(npz:PATH, tfrecord:PATH or images:FOLDER under TOWERQ_DATA_DIR)"
            )

    def _check_notebook(self) -> None:
        for field, value in (("model", self.model), ("command", self.command)):
            if value is not None:
                raise ValueError(f"{field}: a notebook session runs JupyterLab: give neither model nor command")
        for field in MODEL_ONLY_FIELDS:
            if field in self.model_fields_set:
                raise ValueError(f"{field}: applies to model jobs only, not to a notebook session")
        if self.processes != "one":
            raise ValueError("processes: a notebook session is one JupyterLab server that sees all its GPUs")
        if self.resumable:
            raise ValueError("resumable: a notebook session is never stopped to be resumed (docs/notebooks.md)")
        if self.dataset is not None and self.dataset_path is None:
            raise ValueError(
                f"dataset: {self.dataset!r} is towerq's trainer's own; a session reads an upload "
                "(npz:PATH, tfrecord:PATH or images:FOLDER under TOWERQ_DATA_DIR)"
            )

    @property
    def is_command(self) -> bool:
        return self.command is not None

    @property
    def is_notebook(self) -> bool:
        return self.kind == "notebook"

    def stored(self) -> dict[str, Any]:
        """The spec as the API stores it, defaults resolved; a command job's and a notebook
        session's without the trainer's fields, which they do not have; `kind`,
        `idle_timeout_s`, `signal` and `begin_at` only where they say something (a spec
        without them reads as before they existed, to a worker not yet upgraded too)."""
        unset = {name for name in OMITTED_WHEN_UNSET if getattr(self, name) is None}
        if self.command is None and not self.is_notebook:
            return self.model_dump(mode="json", exclude=unset)
        return self.model_dump(mode="json", exclude={"model", *MODEL_ONLY_FIELDS, *unset})

    def train_spec(self) -> TrainSpec:
        return TrainSpec.model_validate(self.model_dump(include=set(TrainSpec.model_fields)))


def is_command(spec: dict[str, Any]) -> bool:
    """A stored spec is a command job's (its program's, `JobSpec.is_command`)."""
    return spec.get("command") is not None


def is_notebook(spec: dict[str, Any]) -> bool:
    """A stored spec is a notebook session's (`JobSpec.stored`)."""
    return spec.get("kind") == "notebook"


def stoppable(spec: dict[str, Any]) -> bool:
    """Whether the scheduler may stop a job of this stored spec to run another (preemption,
    time slicing): a model job always resumes, a command job when it says it does
    (`resumable`), a notebook session never (someone is working in it)."""
    if is_notebook(spec):
        return False
    return not is_command(spec) or bool(spec.get("resumable"))


ONE_OF = re.compile(r"\^\(([\w-]+(?:\|[\w-]+)+)\)\$")
"""A pattern that is a choice of words, `^(max|min)$`."""
PATTERN_WORDS = {
    NO_CONTROL: "no control characters here (a newline, a tab)",
    BUNDLE_ID: "not a code bundle's id (64 hex digits, as POST /api/code or towerq run gives it)",
}
"""A pattern a field must match, in words (pydantic says the pattern itself)."""


def problem(error: Mapping[str, Any]) -> tuple[str, str]:
    """One of pydantic's errors as the field's dotted path (`env.TOWERQ_X`, `requirements.0`;
    empty for the whole) and what is wrong with it in words."""
    where = field_of(error.get("loc", ()))
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if error.get("type") == "string_pattern_mismatch":
        pattern = str((error.get("ctx") or {}).get("pattern"))
        if choices := ONE_OF.fullmatch(pattern):  # ^(train|eval)$
            message = f"{error.get('input')!r} is none of {', '.join(choices.group(1).split('|'))}"
        message = PATTERN_WORDS.get(pattern, message)
    elif str(error.get("type", "")).startswith(("datetime_parsing", "datetime_from_date_parsing")):
        message = f"{error.get('input')!r} is not an ISO time, as 2026-12-08T09:00Z"
    return where, message


def describe(err: ValidationError) -> str:
    """What pydantic refused, each problem naming its field: `field.path: message; ...`."""
    problems = []
    for error in err.errors():
        where, message = problem(error)
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def set_dotted(spec: dict[str, Any], path: str, value: Any) -> None:
    """`spec["a"]["b"] = value` for the field `a.b` (a sweep's setting, the CLI's `--set`),
    making the groups on the way; ValueError when one on the way is not a group."""
    *parents, last = path.split(".")
    target = spec
    for key in parents:
        nested = target.setdefault(key, {})
        if not isinstance(nested, dict):
            raise ValueError(f"{key} is not a group of fields")
        target = nested
    target[last] = value
