"""Datasets users upload: private to their owner, within a quota; and the lab's shared ones."""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Annotated

from fastapi import APIRouter, File, Form, Path, UploadFile
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import CallerDep, SettingsDep
from service.api.routes.catalog import shared_data
from service.core.schemas.files import DatasetList, DatasetOut
from service.uploads import datasets
from towerq.contract.api import DATASET_NAME

router = APIRouter(prefix="/api/datasets", tags=["datasets"])

DatasetName = Annotated[str, Path(pattern=DATASET_NAME.pattern)]


@router.post("", status_code=201, response_model=DatasetOut, responses={409: {}, 413: {}})
async def upload(
    settings: SettingsDep,
    caller: CallerDep,
    name: Annotated[str, Form(min_length=1, max_length=64)],
    file: Annotated[UploadFile, File()],
) -> DatasetOut:
    """Upload an .npz, a .tfrecord, or a .zip of an image folder as your dataset `name`."""
    described = await run_in_threadpool(
        datasets.store,
        file.file,
        file.filename or "",
        name,
        settings.data_dir,
        caller.name,
        settings.user_data_quota_bytes,
        settings.max_dataset_files,
    )
    return DatasetOut.model_validate(described)


@router.get("", response_model=DatasetList)
def listing(settings: SettingsDep, caller: CallerDep) -> DatasetList:
    """Your uploads, then the lab's shared data files; with your usage and quota."""
    root = settings.data_dir.resolve()
    own = [DatasetOut.model_validate(d) for d in datasets.list_own(settings.data_dir, caller.name)]
    shared = [
        DatasetOut.model_validate(
            {
                "name": path,
                "owner": "lab",
                "kind": kind,
                "dataset": entry["name"],
                "shared": True,
                "size": _size(root / path),
            }
        )
        for entry in shared_data(settings)
        for kind, _, path in [entry["name"].partition(":")]
    ]
    used = datasets.usage(settings.data_dir, caller.name)
    return DatasetList(items=own + shared, used_bytes=used, quota_bytes=settings.user_data_quota_bytes)


def _size(path: FsPath) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


@router.delete("/{name}", status_code=204, response_class=Response)
def remove(name: DatasetName, settings: SettingsDep, caller: CallerDep) -> Response:
    """Delete one of your datasets (jobs already running on it keep what they read)."""
    datasets.remove(settings.data_dir, caller.name, name)
    return Response(status_code=204)
