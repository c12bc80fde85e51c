"""What a job may ask for: models, datasets, optimizers, defaults (the submit form reads it).

Everything here is derived from the spec contract (`towerq.contract.catalog` and the
pydantic models of `towerq.contract.spec`), plus the user models and data files found on
this host."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter

from service.api.deps import CallerDep, SettingsDep
from service.core import defaults
from service.core.settings import Settings
from service.uploads import datasets
from towerq.contract.catalog import (
    DATASETS,
    FILE_DATASET_KINDS,
    MODELS,
    OPTIMIZERS,
    PRECISION_NOTES,
    VARIABLE_DEVICES,
)
from towerq.contract.spec import Priority
from towerq.contract.training import DatasetOptions, Hyperparameters

router = APIRouter(prefix="/api", tags=["catalog"])
SCAN_LIMIT_MODELS = 200
SCAN_LIMIT_ENTRIES = 20_000
"""A scan of the data folder looks at this many entries at most (an image folder may hold millions)."""


@router.get("/catalog")
def catalog(caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """Models, datasets (built-in, the lab's shared files, your uploads), optimizers,
    priorities, precisions and hyperparameter defaults."""
    own = [
        {"name": d["dataset"], "description": f"your upload {d['name']} ({d['kind']})"}
        for d in datasets.list_own(settings.data_dir, caller.name)
    ]
    return {
        "models": [asdict(m) for m in MODELS.values()] + _user_models(settings),
        "datasets": [asdict(d) for d in DATASETS.values() if not d.file_kind] + shared_data(settings) + own,
        "dataset_kinds": list(FILE_DATASET_KINDS),
        "dataset_options": {
            "properties": DatasetOptions.model_json_schema()["properties"],
            "applies_to": {d.name: list(d.options) for d in DATASETS.values()},
        },
        "optimizers": list(OPTIMIZERS),
        "priorities": [p.value for p in Priority],
        "variable_devices": list(VARIABLE_DEVICES),
        "precisions": [{"name": name, "description": note} for name, note in PRECISION_NOTES.items()],
        "hyperparameters": Hyperparameters.model_json_schema()["properties"],
    }


def _user_models(settings: SettingsDep) -> list[dict[str, str]]:
    return FOUND.get(settings.models_path, _scan_models)


def shared_data(settings: Settings) -> list[dict[str, str]]:
    """The lab's data files in TOWERQ_DATA_DIR (users' private uploads left out)."""
    return FOUND.get(settings.data_dir, _scan_files)


class Found:
    """What a scan of a folder found, kept for `max_age_s`: the catalog is read by every
    submit form, and a lab's data folder may hold many thousands of files."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self.scans: dict[tuple[Path, Callable[..., object]], tuple[float, list[dict[str, str]]]] = {}
        self.lock = threading.Lock()

    def get(self, root: Path, scan: Callable[[Path], list[dict[str, str]]]) -> list[dict[str, str]]:
        now = time.monotonic()
        with self.lock:
            cached = self.scans.get((root, scan))
            if cached is not None and now - cached[0] < self.max_age_s:
                return cached[1]
        found = scan(root) if root.is_dir() else []
        with self.lock:
            self.scans[(root, scan)] = (now, found)
        return found


FOUND = Found(defaults.CATALOG_SCAN_MAX_AGE_S)


def _scan_models(root: Path) -> list[dict[str, str]]:
    found = []
    for path in sorted(itertools.islice(root.rglob("*.py"), SCAN_LIMIT_MODELS)):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        found.append({"name": f"{module}:build", "description": f"user model in {path.relative_to(root)}"})
    return found


def _scan_files(root: Path) -> list[dict[str, str]]:
    found = []
    for path in sorted(itertools.islice(root.rglob("*"), SCAN_LIMIT_ENTRIES)):
        relative = path.relative_to(root).as_posix()
        if relative == datasets.USERS or relative.startswith(f"{datasets.USERS}/"):
            continue
        if path.suffix == ".npz":
            found.append({"name": f"npz:{relative}", "description": DATASETS["npz"].description})
        elif path.suffix in (".tfrecord", ".tfrecords"):
            found.append({"name": f"tfrecord:{relative}", "description": DATASETS["tfrecord"].description})
    return found
