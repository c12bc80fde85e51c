"""Code bundles: upload a model's code once, list and read its files, run jobs on it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Path, Query, UploadFile
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.api.deps import CallerDep, SessionDep, SettingsDep
from service.core.exceptions import ForbiddenError
from service.core.schemas.files import BundleOut
from service.core.settings import Settings
from service.jobs import privacy
from service.jobs.read import get_job
from service.lab.auth import Caller
from service.uploads import code as bundles
from towerq.contract.spec import BUNDLE_ID

router = APIRouter(prefix="/api/code", tags=["code"])

BundleId = Annotated[str, Path(pattern=BUNDLE_ID, description="a bundle id (SHA-256)")]


@router.post("", status_code=201, response_model=BundleOut, responses={200: {"model": BundleOut}, 413: {}})
async def upload(settings: SettingsDep, caller: CallerDep, file: Annotated[UploadFile, File()]) -> JSONResponse:
    """Upload a `.py` file, or a `.zip` / `.tar.gz` of a folder (multipart field `file`).
    201 with the new bundle; 200 when the same code is stored already (same id). The
    bundle is private to its uploaders (and readers of the jobs that run on it)."""
    limits = bundles.Limits(settings.max_code_bytes, settings.max_code_files, settings.max_code_unpacked_bytes)
    described, new = await run_in_threadpool(
        bundles.store,
        file.file,
        file.filename or "",
        settings.code_dir,
        limits,
        caller.name,
        settings.user_code_quota_bytes,
    )
    body = BundleOut.model_validate(described).model_dump()
    return JSONResponse(body, status_code=201 if new else 200)


ViaJob = Annotated[int | None, Query(ge=1, le=2**31 - 1, description="a job that runs on this bundle")]


@router.get("/{bundle_id}", response_model=BundleOut)
def show(
    bundle_id: BundleId, settings: SettingsDep, session: SessionDep, caller: CallerDep, job: ViaJob = None
) -> BundleOut:
    """The bundle's files and size (its uploaders, admins, and readers of `job` that runs on it)."""
    return BundleOut.model_validate(_check_reader(bundle_id, settings, session, caller, job))


@router.get("/{bundle_id}/files/{path:path}", response_class=FileResponse)
def read(
    bundle_id: BundleId, path: str, settings: SettingsDep, session: SessionDep, caller: CallerDep, job: ViaJob = None
) -> FileResponse:
    """One file of the bundle, as text when it is text."""
    _check_reader(bundle_id, settings, session, caller, job)
    found = bundles.bundle_file(settings.code_dir, bundle_id, path)
    return FileResponse(found, media_type="text/plain; charset=utf-8" if _texty(path) else "application/octet-stream")


def _check_reader(
    bundle_id: str, settings: Settings, session: Session, caller: Caller, job_id: int | None
) -> dict[str, Any]:
    """The bundle's manifest if `caller` may read it (404 before 403: no such bundle)."""
    found = bundles.manifest(settings.code_dir, bundle_id)
    if caller.is_admin or bundles.owns(settings.code_dir, caller.name, bundle_id):
        return found
    if job_id is not None:
        job = get_job(session, job_id)
        if job.spec.get("code") == bundle_id and privacy.may_read_outputs(job, caller):
            return found
    raise ForbiddenError(
        f"code bundle {bundle_id[:12]}… is private to the members who uploaded it"
        + (" (and readers of the jobs that run on it: add ?job=ID)" if job_id is None else "")
    )


def _texty(path: str) -> bool:
    return path.rsplit(".", 1)[-1].lower() in {"py", "txt", "md", "json", "yaml", "yml", "toml", "cfg", "ini", "csv"}
