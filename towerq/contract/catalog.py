"""What a job may ask for: the built-in models, the datasets, and the options each takes.

The spec (`towerq.contract.spec`) validates against these tables, the trainer builds from
them, and `GET /api/catalog` shows them: a model or dataset option is listed here once.
Pure Python: no TensorFlow, no database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Task = Literal["classification", "regression"]
Optimizer = Literal["sgd", "momentum", "adam"]
VariableDevice = Literal["cpu", "gpu0"]
Precision = Literal["float32", "mixed_float16", "mixed_bfloat16"]
PRECISION_NOTES = {
    "float32": "every op and variable in float32",
    "mixed_float16": "ops in float16, variables in float32, dynamic loss scaling (Volta and newer GPUs)",
    "mixed_bfloat16": "ops in bfloat16, variables in float32, no loss scaling needed (Ampere and newer GPUs)",
}


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    task: Task
    options: tuple[str, ...] = ()
    """The `model_options` the builder reads; any other is refused at submit time."""


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    description: str
    task: Task | None
    """None: decided by the data (an npz file's labels may be classes or values)."""
    options: tuple[str, ...]
    """The `dataset_options` that apply; any other left off its default is refused."""
    file_kind: bool = False
    """Named as `kind:PATH` under TOWERQ_DATA_DIR."""
    required: tuple[str, ...] = ()


MODELS: dict[str, ModelEntry] = {
    m.name: m
    for m in (
        ModelEntry("mlp", "two hidden dense layers", "classification", ("hidden",)),
        ModelEntry("lenet5", "LeNet-5: conv-pool ×2, dense ×3", "classification"),
        ModelEntry("cifar_cnn", "the classic CIFAR-10 tutorial net: conv-pool-norm ×2, dense ×3", "classification"),
        ModelEntry("resnet20", "ResNet-20 with batch normalisation", "classification", ("bn_momentum",)),
        ModelEntry("poly2", "regression y = a·x² + b·x + c (dataset quadratic)", "regression"),
    )
}

DATASETS: dict[str, DatasetEntry] = {
    d.name: d
    for d in (
        DatasetEntry(
            "synthetic",
            "random images; shape and classes from dataset_options",
            "classification",
            ("shape", "classes", "train_examples", "test_examples"),
        ),
        DatasetEntry(
            "digits",
            "scikit-learn's 1,797 8×8 digits",
            "classification",
            ("train_examples", "test_examples", "test_fraction"),
        ),
        DatasetEntry(
            "fashion_mnist",
            "Fashion-MNIST (Debian package dataset-fashion-mnist)",
            "classification",
            ("train_examples", "test_examples"),
        ),
        DatasetEntry(
            "quadratic",
            "points of y = a·x² + b·x + c with noise",
            "regression",
            ("coefficients", "noise", "train_examples", "test_examples"),
        ),
        DatasetEntry(
            "npz",
            "arrays x_train, y_train, x_test, y_test (or x, y) in an .npz file",
            None,
            ("train_examples", "test_examples", "test_fraction"),
            file_kind=True,
        ),
        DatasetEntry(
            "tfrecord",
            "tf.train.Examples with image (PNG/JPEG bytes) and label (int64)",
            "classification",
            ("classes", "image_size", "test_path", "test_fraction", "train_examples"),
            file_kind=True,
            required=("classes",),
        ),
        DatasetEntry(
            "images",
            "a folder with one sub-folder of images per class",
            "classification",
            ("image_size", "test_path", "test_fraction"),
            file_kind=True,
        ),
    )
}

BUILTIN_MODELS = tuple(MODELS)
BUILTIN_DATASETS = tuple(name for name, d in DATASETS.items() if not d.file_kind)
FILE_DATASET_KINDS = tuple(name for name, d in DATASETS.items() if d.file_kind)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
VARIABLE_DEVICES: tuple[str, ...] = get_args(VariableDevice)
PRECISIONS: tuple[str, ...] = get_args(Precision)
SYNTHETIC_MAX_VALUES = 2**28
"""A synthetic dataset is made in memory: its shape × examples stays under this many values."""
