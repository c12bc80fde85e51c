"""What a job may ask for: models, datasets, optimizers, defaults (the submit form reads it).

Everything here is derived from the spec contract (`worker.trainer.catalog` and the
pydantic models of `worker.trainer.spec`), plus the user models and data files found on
this host."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter

from service.api.deps import CallerDep, SettingsDep
from worker.trainer.catalog import DATASETS, FILE_DATASET_KINDS, MODELS, OPTIMIZERS, VARIABLE_DEVICES
from worker.trainer.spec import DatasetOptions, Hyperparameters, Priority

router = APIRouter(prefix="/api", tags=["catalog"])


@router.get("/catalog")
def catalog(_: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """Models, datasets, optimizers, priorities and hyperparameter defaults."""
    return {
        "models": [asdict(m) for m in MODELS.values()] + _user_models(settings),
        "datasets": [asdict(d) for d in DATASETS.values() if not d.file_kind] + _files(settings),
        "dataset_kinds": list(FILE_DATASET_KINDS),
        "dataset_options": {
            "properties": DatasetOptions.model_json_schema()["properties"],
            "applies_to": {d.name: list(d.options) for d in DATASETS.values()},
        },
        "optimizers": list(OPTIMIZERS),
        "priorities": [p.value for p in Priority],
        "variable_devices": list(VARIABLE_DEVICES),
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
            found.append({"name": f"npz:{relative}", "description": DATASETS["npz"].description})
        elif path.suffix in (".tfrecord", ".tfrecords"):
            found.append({"name": f"tfrecord:{relative}", "description": DATASETS["tfrecord"].description})
    return found
