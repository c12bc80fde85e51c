"""The training half of a job spec: what towerq's own trainer trains, on what, how.

`TrainSpec` (the model, the dataset and its options, the hyperparameters, the towers) is what
a model job's trainer receives (with its attempt's `RuntimeSpec`, `towerq.contract.runtime`)
and validates again before it builds anything; `towerq.contract.spec.JobSpec` adds what to
run and where and when. Pure pydantic, as the rest of the contract; every error names its field.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

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
