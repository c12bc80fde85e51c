"""A job's artifacts and whole log, to take home: list, one file (with ranges), a folder or
everything as a .tar.gz stream."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path as FsPath
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel
from sqlalchemy import select

from service import joblog
from service.api.deps import CallerDep, ContextDep, SessionDep, SettingsDep
from service.artifacts import list_artifacts, resolve_artifact, tar_gz_stream
from service.exceptions import NotFoundError
from service.jobs import get_job
from service.models import LogLine
from worker.trainer.paths import JOB_LOG_FILE, job_folder

router = APIRouter(prefix="/api/jobs", tags=["artifacts"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="job id")]


class ArtifactOut(BaseModel):
    path: str
    size: int
    modified: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactOut]
    total_bytes: int
    truncated: bool
    """More than 10,000 files: the list stops there (the .tar.gz has them all)."""


def _archive(folder: FsPath, top: str) -> StreamingResponse:
    return StreamingResponse(
        tar_gz_stream(folder, top),
        media_type="application/gzip",
        # The CLI unpacks what is marked a folder; a user's own .tar.gz file comes as it is.
        headers={"Content-Disposition": f'attachment; filename="{top}.tar.gz"', "X-Towerq-Archive": "folder"},
    )


@router.get("/{job_id}/artifacts", response_model=ArtifactList)
def artifacts(job_id: JobId, session: SessionDep, settings: SettingsDep, _: CallerDep) -> dict[str, object]:
    """The job's files: checkpoints, TensorBoard events, the exported model, its log."""
    get_job(session, job_id)
    return list_artifacts(job_folder(settings.artifacts_dir, job_id))


@router.get("/{job_id}/artifacts.tar.gz", response_class=StreamingResponse)
def everything(job_id: JobId, session: SessionDep, settings: SettingsDep, _: CallerDep) -> StreamingResponse:
    """All of the job's artifacts as one .tar.gz stream (the folder `job-<id>/`)."""
    get_job(session, job_id)
    folder = job_folder(settings.artifacts_dir, job_id)
    if not folder.is_dir():
        raise NotFoundError(f"job {job_id} has no artifacts yet")
    return _archive(folder, f"job-{job_id}")


@router.get("/{job_id}/artifacts/{path:path}", response_model=None)
def artifact(
    job_id: JobId, path: str, session: SessionDep, settings: SettingsDep, _: CallerDep
) -> FileResponse | StreamingResponse:
    """One file (HTTP ranges supported, so a download can resume), or a folder as .tar.gz."""
    get_job(session, job_id)
    found = resolve_artifact(job_folder(settings.artifacts_dir, job_id), path)
    if found.is_dir():
        return _archive(found, f"job-{job_id}-{found.name}")
    return FileResponse(found, filename=found.name)


@router.get("/{job_id}/logs.txt", response_class=Response)
def whole_log(job_id: JobId, session: SessionDep, ctx: ContextDep, _: CallerDep) -> Response:
    """The job's whole log as text: every line of every attempt."""
    get_job(session, job_id)
    file = job_folder(ctx.settings.artifacts_dir, job_id) / JOB_LOG_FILE
    if file.is_file():
        return FileResponse(file, media_type="text/plain; charset=utf-8")

    def from_database() -> Iterator[bytes]:  # no file (the job never ran here): the stored lines
        with ctx.db.read() as reading:
            rows = reading.scalars(select(LogLine).where(LogLine.job_id == job_id).order_by(LogLine.id))
            for row in rows:
                yield joblog.format_line(row.time, row.attempt, row.level, row.message).encode()

    return StreamingResponse(from_database(), media_type="text/plain; charset=utf-8")
