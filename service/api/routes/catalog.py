"""What a job may ask for: models, datasets, optimizers, defaults (the submit form reads it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api.deps import CallerDep, SettingsDep
from service.models import Priority
from worker.trainer.spec import BUILTIN_DATASETS, BUILTIN_MODELS, FILE_DATASET_KINDS, Hyperparameters

router = APIRouter(prefix="/api", tags=["catalog"])

MODEL_NOTES = {
    "mlp": "two hidden dense layers",
    "lenet5": "LeNet-5: conv-pool ×2, dense ×3",
    "cifar_cnn": "the classic CIFAR-10 tutorial net: conv-pool-norm ×2, dense ×3",
    "resnet20": "ResNet-20 with batch normalisation",
    "poly2": "regression y = a·x² + b·x + c (dataset quadratic)",
}
DATASET_NOTES = {
    "synthetic": "random images; shape and classes from dataset_options",
    "digits": "scikit-learn's 1,797 8×8 digits",
    "fashion_mnist": "Fashion-MNIST (Debian package dataset-fashion-mnist)",
    "quadratic": "points of y = a·x² + b·x + c with noise",
}


@router.get("/catalog")
def catalog(_: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """Models, datasets, optimizers, priorities and hyperparameter defaults."""
    return {
        "models": [{"name": m, "description": MODEL_NOTES[m]} for m in BUILTIN_MODELS] + _user_models(settings),
        "datasets": [{"name": d, "description": DATASET_NOTES[d]} for d in BUILTIN_DATASETS] + _files(settings),
        "dataset_kinds": list(FILE_DATASET_KINDS),
        "optimizers": ["sgd", "momentum", "adam"],
        "priorities": [p.value for p in Priority],
        "variable_devices": ["cpu", "gpu0"],
        "hyperparameters": Hyperparameters.model_json_schema()["properties"],
    }


def _user_models(settings: SettingsDep) -> list[dict[str, str]]:
    root = settings.models_path
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.rglob("*.py"))[:200]:
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        found.append({"name": f"{module}:build", "description": f"user model in {path.relative_to(root)}"})
    return found


def _files(settings: SettingsDep) -> list[dict[str, str]]:
    root = settings.data_dir
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.rglob("*"))[:500]:
        relative = path.relative_to(root).as_posix()
        if path.suffix == ".npz":
            found.append({"name": f"npz:{relative}", "description": "arrays in an .npz file"})
        elif path.suffix in (".tfrecord", ".tfrecords"):
            found.append({"name": f"tfrecord:{relative}", "description": "TFRecord file"})
    return found
