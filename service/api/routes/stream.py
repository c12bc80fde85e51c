"""Server-sent events: one job's metrics, logs and states; or every job's state changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from service.api.deps import CallerDep, DatabaseDep
from service.api.hub import END, StreamHub, StreamSlots
from service.core import keys
from service.core.db import Database
from service.jobs import privacy
from service.jobs.read import get_job
from service.lab.auth import Caller

router = APIRouter(tags=["stream"])

KEEPALIVE_S = 15.0
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def relay(request: Request, channel: str, caller: Caller, hide_logs: bool = False) -> AsyncIterator[str]:
    """Forward a Redis channel as SSE until the client goes away (or holds too many)."""
    hub: StreamHub = request.app.state.hub
    slots: StreamSlots = request.app.state.stream_slots
    slot = await slots.take(caller.token_id)
    return _forward(request, hub, slots, channel, caller.token_id, slot, hide_logs)


async def _forward(
    request: Request, hub: StreamHub, slots: StreamSlots, channel: str, token_id: int, slot: str, hide_logs: bool
) -> AsyncIterator[str]:
    try:
        async with hub.subscribe(channel) as queue:
            yield ": connected\n\n"
            while not hub.ending and not await request.is_disconnected():
                try:
                    kind, data = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    await slots.refresh(token_id, slot)
                    yield ": keepalive\n\n"
                    continue
                if (kind, data) == END:
                    return
                if hide_logs and kind == "log":
                    continue
                yield f"event: {kind}\ndata: {data}\n\n"
    finally:
        with anyio.CancelScope(shield=True):  # a client gone cancels this; the slot still goes back
            await slots.give_back(token_id, slot)


@router.get("/api/jobs/{job_id}/stream")
async def job_stream(job_id: JobId, request: Request, db: DatabaseDep, caller: CallerDep) -> StreamingResponse:
    """SSE: `metric`, `eval`, `state`, `log` events of one job as they happen."""
    # A session of its own, closed before streaming: a session from a dependency would be
    # held (a pooled connection, an open read snapshot) for as long as the page stays open.
    hide_logs = not await run_in_threadpool(_sees_logs, db, job_id, caller)
    events = await relay(request, keys.job_channel(job_id), caller, hide_logs)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


def _sees_logs(db: Database, job_id: int, caller: Caller) -> bool:
    with db.read() as session:
        return privacy.may_read_outputs(get_job(session, job_id), caller)


@router.get("/api/stream")
async def jobs_stream(request: Request, caller: CallerDep) -> StreamingResponse:
    """SSE: `state` events of every job, for live lists."""
    events = await relay(request, keys.JOBS_CHANNEL, caller)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
