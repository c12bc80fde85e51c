"""A job's artifacts and whole log, to take home: list, one file (with ranges), a folder or
everything as a .tar.gz stream."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse, Response, StreamingResponse
from sqlalchemy import select
from starlette.types import Receive, Scope, Send

from service.api.deps import CallerDep, ContextDep, SessionDep, SettingsDep
from service.core import joblog
from service.core.exceptions import NotFoundError
from service.core.models import LogLine
from service.core.schemas.jobs import ArtifactList
from service.jobs import privacy
from service.jobs.read import get_job
from service.uploads.artifacts import list_artifacts, open_artifact, open_log, tar_gz_stream, tensorboard_stream
from towerq.contract.paths import job_folder, job_log


class HandleResponse(FileResponse):
    """A file response over an open handle (closed once sent), so what is sent is the file
    that was checked, not whatever its name points at by then. Starlette reopens the file by
    path for each range: `/proc/self/fd/N` reopens this very file, never a name in the job
    folder."""

    def __init__(self, fd: int, filename: str | None = None, media_type: str | None = None) -> None:
        self.fd = fd
        super().__init__(f"/proc/self/fd/{fd}", filename=filename, media_type=media_type, stat_result=os.fstat(fd))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:  # never sent (an error came first): the handle still goes
        self.close()


router = APIRouter(prefix="/api/jobs", tags=["artifacts"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="job id")]


def _archive(stream: Iterator[bytes], top: str) -> StreamingResponse:
    return StreamingResponse(
        stream,
        media_type="application/gzip",
        # The CLI unpacks what is marked a folder; a user's own .tar.gz file comes as it is.
        headers={"Content-Disposition": f'attachment; filename="{top}.tar.gz"', "X-Towerq-Archive": "folder"},
    )


@router.get("/{job_id}/artifacts", response_model=ArtifactList)
def artifacts(job_id: JobId, session: SessionDep, settings: SettingsDep, caller: CallerDep) -> dict[str, object]:
    """The job's files: checkpoints, TensorBoard events, the exported model, its log."""
    privacy.check_outputs(get_job(session, job_id), caller)
    return list_artifacts(job_folder(settings.artifacts_dir, job_id), job_log(settings.artifacts_dir, job_id))


@router.get("/{job_id}/artifacts.tar.gz", response_class=StreamingResponse)
def everything(job_id: JobId, session: SessionDep, settings: SettingsDep, caller: CallerDep) -> StreamingResponse:
    """All of the job's artifacts as one .tar.gz stream (the folder `job-<id>/`)."""
    privacy.check_outputs(get_job(session, job_id), caller)
    folder = job_folder(settings.artifacts_dir, job_id)
    if not folder.is_dir():
        raise NotFoundError(f"job {job_id} has no artifacts yet")
    top = f"job-{job_id}"
    return _archive(tar_gz_stream(folder, "", top, job_log(settings.artifacts_dir, job_id)), top)


@router.get("/{job_id}/tensorboard.tar.gz", response_class=StreamingResponse)
def tensorboard_events(
    job_id: JobId, session: SessionDep, settings: SettingsDep, caller: CallerDep
) -> StreamingResponse:
    """Every TensorBoard event file of the job, wherever in its folder it wrote them, in
    their folders, as one .tar.gz stream (`job-<id>/`): what `towerq tensorboard` reads."""
    privacy.check_outputs(get_job(session, job_id), caller)
    return _archive(tensorboard_stream(job_folder(settings.artifacts_dir, job_id), job_id), f"job-{job_id}-tensorboard")


@router.get("/{job_id}/artifacts/{path:path}", response_model=None)
def artifact(
    job_id: JobId, path: str, session: SessionDep, settings: SettingsDep, caller: CallerDep
) -> FileResponse | StreamingResponse:
    """One file (HTTP ranges supported, so a download can resume), or a folder as .tar.gz."""
    privacy.check_outputs(get_job(session, job_id), caller)
    root, log = job_folder(settings.artifacts_dir, job_id), job_log(settings.artifacts_dir, job_id)
    name = path.rstrip("/").rpartition("/")[2]
    fd = open_artifact(root, path.rstrip("/"), log)
    if fd is None:
        top = f"job-{job_id}-{name}"
        return _archive(tar_gz_stream(root, path.rstrip("/"), top, log), top)
    return HandleResponse(fd, filename=name)


@router.get("/{job_id}/logs.txt", response_class=Response)
def whole_log(job_id: JobId, session: SessionDep, ctx: ContextDep, caller: CallerDep) -> Response:
    """The job's whole log as text: every line of every attempt."""
    privacy.check_outputs(get_job(session, job_id), caller)
    fd = open_log(job_folder(ctx.settings.artifacts_dir, job_id), job_log(ctx.settings.artifacts_dir, job_id))
    if fd is not None:
        return HandleResponse(fd, media_type="text/plain; charset=utf-8")

    def from_database() -> Iterator[bytes]:  # no file (the job never ran here): the stored lines
        with ctx.db.read() as reading:
            rows = reading.scalars(select(LogLine).where(LogLine.job_id == job_id).order_by(LogLine.id))
            for row in rows:
                yield joblog.format_line(row.time, row.attempt, row.level, row.message).encode()

    return StreamingResponse(from_database(), media_type="text/plain; charset=utf-8")
