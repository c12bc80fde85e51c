"""Code bundles: upload a model's code once, list and read its files, run jobs on it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Path, UploadFile
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from service import code as bundles
from service.api.deps import CallerDep, SettingsDep

router = APIRouter(prefix="/api/code", tags=["code"])

BundleId = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="a bundle id (SHA-256)")]


class BundleFile(BaseModel):
    path: str
    size: int


class BundleOut(BaseModel):
    id: str
    files: list[BundleFile]
    size: int
    """Bytes unpacked."""


@router.post("", status_code=201, response_model=BundleOut, responses={200: {"model": BundleOut}, 413: {}})
async def upload(settings: SettingsDep, _: CallerDep, file: Annotated[UploadFile, File()]) -> JSONResponse:
    """Upload a `.py` file, or a `.zip` / `.tar.gz` of a folder (multipart field `file`).
    201 with the new bundle; 200 when the same code is stored already (same id)."""
    limits = bundles.Limits(settings.max_code_bytes, settings.max_code_files, settings.max_code_unpacked_bytes)
    described, new = await run_in_threadpool(bundles.store, file.file, file.filename or "", settings.code_dir, limits)
    body = BundleOut.model_validate(described).model_dump()
    return JSONResponse(body, status_code=201 if new else 200)


@router.get("/{bundle_id}", response_model=BundleOut)
def show(bundle_id: BundleId, settings: SettingsDep, _: CallerDep) -> BundleOut:
    """The bundle's files and size."""
    return BundleOut.model_validate(bundles.manifest(settings.code_dir, bundle_id))


@router.get("/{bundle_id}/files/{path:path}", response_class=FileResponse)
def read(bundle_id: BundleId, path: str, settings: SettingsDep, _: CallerDep) -> FileResponse:
    """One file of the bundle, as text when it is text."""
    found = bundles.bundle_file(settings.code_dir, bundle_id, path)
    return FileResponse(found, media_type="text/plain; charset=utf-8" if _texty(path) else "application/octet-stream")


def _texty(path: str) -> bool:
    return path.rsplit(".", 1)[-1].lower() in {"py", "txt", "md", "json", "yaml", "yml", "toml", "cfg", "ini", "csv"}
