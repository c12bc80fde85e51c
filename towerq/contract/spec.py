"""The job spec: one typed contract from the API to the trainer.

`JobSpec` is what a user submits (what to train, and where/when it may run); the API
stores its validated dump. The worker turns a stored spec into the trainer's input with
`trainer_input` (the training half, `TrainSpec`, plus this attempt's `RuntimeSpec`, both in
`towerq.contract.runtime`), and the trainer validates that file again before it builds anything. Everything the trainer
would refuse for a reason known at submit time is refused here, so the API answers 422
naming the field instead of accepting a job that fails later.

Pure pydantic (no TensorFlow, no database), in the contract every side imports (the
service, the worker, the trainer, the client). Every error names the field it is about.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from towerq.contract.catalog import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    DATASETS,
    FILE_DATASET_KINDS,
    MODELS,
    SYNTHETIC_MAX_VALUES,
    Optimizer,
    Precision,
    VariableDevice,
)
from towerq.contract.paths import PathEscapeError, check_relative

USER_MODEL_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
MAX_GPUS_PER_JOB = 64


class Priority(enum.StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Higher runs first: low 0, normal 1, high 2."""
        return {"low": 0, "normal": 1, "high": 2}[self.value]


PositiveInt = Annotated[int, Field(ge=1)]
OptionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
OPTION_TEXT_MAX = 256
OPTION_LIST_MAX = 64


def option_value(value: Any) -> Any:
    """A model option: a finite number, true/false, a string of at most 256 characters,
    or a list of at most 64 of those."""
    if isinstance(value, list):
        if len(value) > OPTION_LIST_MAX:
            raise ValueError(f"a list of at most {OPTION_LIST_MAX} values, got {len(value)}")
        return [_option_scalar(v) for v in value]
    return _option_scalar(value)


def _option_scalar(value: Any) -> Any:
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return finite(value, "a number")
    if isinstance(value, str):
        if len(value) > OPTION_TEXT_MAX:
            raise ValueError(f"a string of at most {OPTION_TEXT_MAX} characters, got {len(value)}")
        return value
    raise ValueError("a number, true/false, a string, or a list of those")


OptionValue = Annotated[Any, AfterValidator(option_value)]


def finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number")
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hyperparameters(Strict):
    """Training hyperparameters. `None` means "choose for me"; the resolved value is stored."""

    batch_size: int = Field(default=32, ge=1, le=65536, description="examples per tower per step")
    steps: int = Field(default=1000, ge=1, le=100_000_000, description="training steps (one update each)")
    learning_rate: float = Field(default=0.001, gt=0, le=100, description="at step 0, before any decay")
    lr_decay_rate: float = Field(default=1.0, gt=0, le=1, description="1 = no decay")
    lr_decay_steps: int = Field(default=1000, ge=1, description="the rate applies once per this many steps")
    staircase: bool = Field(default=False, description="decay in steps rather than smoothly")
    optimizer: Optimizer = "adam"
    momentum: float = Field(default=0.9, ge=0, lt=1, description="optimizer momentum only")
    weight_decay: float = Field(default=0.0, ge=0, le=1, description="L2 coefficient")
    ema_decay: float | None = Field(
        default=None, gt=0, lt=1, description="moving averages of the weights; evaluation and model.keras use them"
    )
    eval_every: int | None = Field(default=None, ge=0, description="0 = only at the end")
    log_every: int = Field(default=10, ge=1, description="a metric row every this many steps")
    checkpoint_every: int | None = Field(default=None, ge=0, description="0 = only at the end")
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="none: one is drawn and stored")
    model_options: dict[OptionName, OptionValue] = Field(
        default_factory=dict, max_length=32, description="passed to the model builder (e.g. mlp: hidden)"
    )

    @field_validator("learning_rate", "lr_decay_rate", "momentum", "weight_decay")
    @classmethod
    def _finite(cls, value: float) -> float:
        return finite(value, "value")

    @model_validator(mode="after")
    def _resolve_defaults(self) -> Self:
        if self.eval_every is None:
            self.eval_every = max(1, self.steps // 10)
        if self.checkpoint_every is None:
            self.checkpoint_every = min(1000, max(1, self.steps // 10))
        return self


class DatasetOptions(Strict):
    """Options of a dataset; each applies only to the datasets its description names."""

    shape: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None, min_length=1, max_length=3, description="synthetic: one example's shape"
    )
    classes: int | None = Field(default=None, ge=2, le=100_000, description="synthetic")
    train_examples: int | None = Field(default=None, ge=1, le=10_000_000, description="synthetic; others: at most")
    test_examples: int | None = Field(default=None, ge=1, le=10_000_000, description="synthetic")
    test_fraction: float = Field(default=0.2, gt=0, lt=1, description="datasets that have no test split of their own")
    image_size: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None, min_length=2, max_length=2, description="images: [height, width]"
    )
    test_path: str | None = Field(default=None, max_length=1024, description="tfrecord, images")
    coefficients: list[float] | None = Field(
        default=None, min_length=3, max_length=3, description="quadratic: [a, b, c]"
    )
    noise: float = Field(default=0.05, ge=0, le=100, description="quadratic")


def _check_synthetic_size(options: DatasetOptions) -> None:
    examples = (options.train_examples or 4096) + (options.test_examples or 1024)
    values = math.prod(options.shape or (28, 28, 3)) * examples
    if values > SYNTHETIC_MAX_VALUES:
        raise ValueError(
            f"a synthetic dataset of {values:,} values is too large: shape × examples must stay under "
            f"{SYNTHETIC_MAX_VALUES:,}"
        )


class TrainSpec(Strict):
    """The training half of a job spec: what to train, on what, how."""

    model: str = Field(min_length=1, max_length=200, description="built-in name or module:function")
    dataset: str = Field(min_length=1, max_length=1024, description="a name, or kind:PATH under TOWERQ_DATA_DIR")
    dataset_options: DatasetOptions = Field(default_factory=DatasetOptions, validate_default=True)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    variable_device: VariableDevice = Field(default="cpu", description="where the shared variables live")
    tower_weights: list[Annotated[float, Field(gt=0, le=1000)]] | None = Field(
        default=None, min_length=1, max_length=64, description="uneven batch slices for unequal GPUs, one per GPU"
    )
    precision: Precision = Field(
        default="float32", description="mixed_float16 (with loss scaling) or mixed_bfloat16: float32 variables"
    )
    jit_compile: bool = Field(default=False, description="compile each tower's step with XLA")

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | None) -> str | None:
        if model is None or model in BUILTIN_MODELS or USER_MODEL_PATTERN.match(model):
            return model
        raise ValueError(
            f"unknown model {model!r}: use one of {', '.join(BUILTIN_MODELS)} "
            "or module:function of a file under TOWERQ_MODELS_PATH"
        )

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, dataset: str | None) -> str | None:
        if dataset is None:
            return None
        kind, _, path = dataset.partition(":")
        if not path:
            if dataset in BUILTIN_DATASETS:
                return dataset
            raise ValueError(
                f"unknown dataset {dataset!r}: use one of {', '.join(BUILTIN_DATASETS)}, "
                "or npz:PATH, tfrecord:PATH, images:FOLDER under TOWERQ_DATA_DIR"
            )
        if kind not in FILE_DATASET_KINDS:
            raise ValueError(f"unknown dataset kind {kind!r}: use npz, tfrecord or images")
        try:
            check_relative(path)
        except PathEscapeError as err:
            raise ValueError(str(err)) from None
        return dataset

    @field_validator("dataset_options")
    @classmethod
    def _options_apply(cls, options: DatasetOptions, info: ValidationInfo) -> DatasetOptions:
        dataset = info.data.get("dataset")
        if dataset is None:
            return options
        entry = DATASETS[dataset.partition(":")[0]]
        defaults = DatasetOptions()
        for name in DatasetOptions.model_fields:
            if name not in entry.options and getattr(options, name) != getattr(defaults, name):
                takes = ", ".join(entry.options) or "none"
                raise ValueError(f"{name} does not apply to dataset {dataset!r} (it takes: {takes})")
        for name in entry.required:
            if getattr(options, name) is None:
                raise ValueError(f"dataset {entry.name!r} needs {name}")
        if entry.name == "synthetic":
            _check_synthetic_size(options)
        if options.test_path is not None:
            try:
                check_relative(options.test_path)
            except PathEscapeError as err:
                raise ValueError(f"test_path: {err}") from None
        return options

    @field_validator("hyperparameters")
    @classmethod
    def _model_options_apply(cls, hyperparameters: Hyperparameters, info: ValidationInfo) -> Hyperparameters:
        entry = MODELS.get(info.data.get("model") or "")
        if entry is None:  # a user model reads whatever options it likes
            return hyperparameters
        for name in hyperparameters.model_options:
            if name not in entry.options:
                takes = ", ".join(entry.options) or "none"
                raise ValueError(f"model_options.{name} does not apply to model {entry.name!r} (it takes: {takes})")
        return hyperparameters

    @field_validator("tower_weights")
    @classmethod
    def _finite_weights(cls, weights: list[float] | None) -> list[float] | None:
        for weight in weights or []:
            finite(weight, "a tower weight")
        return weights

    @model_validator(mode="after")
    def _model_fits_dataset(self) -> Self:
        if self.model is None or self.dataset is None:
            return self  # a command job (JobSpec) has neither
        model = MODELS.get(self.model)
        data_task = DATASETS[self.dataset_kind].task
        if model is None:
            return self
        if model.task == "regression" and data_task != "regression":
            raise ValueError(f"model {model.name} fits y = a·x² + b·x + c: use dataset 'quadratic'")
        if data_task == "regression" and model.task != "regression":
            raise ValueError(f"dataset {self.dataset!r} is a regression: use model 'poly2'")
        return self

    @property
    def dataset_kind(self) -> str:
        kind, _, path = (self.dataset or "").partition(":")
        return kind if path else (self.dataset or "")

    @property
    def dataset_path(self) -> str | None:
        return (self.dataset or "").partition(":")[2] or None


Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]*$")]
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
Visibility = Literal["private", "lab"]
JobRef = Annotated[int, Field(ge=1, le=2**31 - 1)]
SweepRef = Annotated[str, Field(pattern=r"^sweep:[1-9][0-9]{0,9}$")]
GROUP_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
GroupName = Annotated[str, Field(pattern=GROUP_NAME_PATTERN)]
MAX_DEPENDENCIES = 64
AfterCondition = Literal["afterok", "afterany"]


ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
RESERVED_ENV_PREFIXES = ("TOWERQ_", "LD_", "BASH_FUNC_", "NVIDIA_", "NCCL_", "MASTER_", "SLURM_")
RESERVED_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "TF_CONFIG",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "PYTORCH_CUDA_ALLOC_CONF",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "PYTHONHOME",
        "HOME",
    }
)
"""What a command job's `env` may not set: what towerq sets for the program (its GPUs, ranks,
folders, memory hints), and what changes how every program of the sandbox loads."""
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
COMMAND_MAX_ARGS = 1024
COMMAND_ARG_MAX = 4096
ENV_MAX_ENTRIES = 64
ENV_VALUE_MAX = 4096


def env_name(name: str) -> str:
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(f"{name} is not a job's to set: towerq sets it, or it changes how every program loads")
    return name


def no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("a NUL character cannot be passed to a program")
    return text


EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN), AfterValidator(env_name)]
EnvValue = Annotated[str, Field(max_length=ENV_VALUE_MAX), AfterValidator(no_nul)]
CommandArg = Annotated[str, Field(max_length=COMMAND_ARG_MAX), AfterValidator(no_nul)]


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
    host: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(default=None, description="run only there")
    gpu_memory_fraction: float = Field(default=1.0, gt=0, le=1, description="below 1: share GPUs with other jobs")
    memory_growth: bool = Field(default=False, description="let TensorFlow take GPU memory as it needs it")
    priority: Priority = Field(default=Priority.NORMAL, description="high is for admins and users allowed it")
    time_limit_s: int | None = Field(
        default=None, ge=1, le=365 * 24 * 3600, description="stopped (after a checkpoint) when it runs longer"
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
        description="POST a JSON notification here when the job ends (besides the lab's TOWERQ_WEBHOOK_URL)",
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
        pattern=r"^[0-9a-f]{64}$",
        description="a code bundle's id (POST /api/code): `model` is then `module:function` inside it",
    )
    visibility: Visibility = Field(
        default="private",
        description="who reads its log, artifacts and code: private (owner and admins) or lab (every member)",
    )
    after: list[JobRef | SweepRef] = Field(
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
        if len(set(self.after)) != len(self.after):
            raise ValueError("after: each job or sweep may be named only once")
        if self.name is None and self.kind == "notebook":
            self.name = "notebook"
        elif self.name is None:
            shown = " ".join(self.command) if self.command is not None else f"{self.model}-{self.dataset}"
            self.name = "".join(c if c.isprintable() else " " for c in shown)[:128]
        return self

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
        session's without the trainer's fields, which they do not have; `kind` and
        `idle_timeout_s` only where they say something (a model or command job's spec reads
        as before they existed)."""
        unset = {name for name in ("kind", "idle_timeout_s") if getattr(self, name) is None}
        if self.command is None and not self.is_notebook:
            return self.model_dump(mode="json", exclude=unset)
        return self.model_dump(mode="json", exclude={"model", *MODEL_ONLY_FIELDS, *unset})

    def train_spec(self) -> TrainSpec:
        return TrainSpec.model_validate(self.model_dump(include=set(TrainSpec.model_fields)))


def is_notebook(spec: dict[str, Any]) -> bool:
    """A stored spec is a notebook session's (`JobSpec.stored`)."""
    return spec.get("kind") == "notebook"


def stoppable(spec: dict[str, Any]) -> bool:
    """Whether the scheduler may stop a job of this stored spec to run another (preemption,
    time slicing): a model job always resumes, a command job when it says it does
    (`resumable`), a notebook session never (someone is working in it)."""
    if is_notebook(spec):
        return False
    return spec.get("command") is None or bool(spec.get("resumable"))


def describe(err: ValidationError) -> str:
    """What pydantic refused, each problem naming its field: `field.path: message; ...`."""
    problems = []
    for error in err.errors():
        where = ".".join(str(p) for p in error["loc"])
        problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
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
