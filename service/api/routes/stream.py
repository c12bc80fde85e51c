"""Server-sent events: one job's metrics, logs and states; or every job's state changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

import redis.asyncio as aioredis
from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse

from service import keys
from service.api.deps import CallerDep, DatabaseDep
from service.jobs import get_job

router = APIRouter(tags=["stream"])

KEEPALIVE_S = 15.0
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def relay(request: Request, channel: str) -> AsyncIterator[str]:
    """Forward a Redis channel as SSE until the client goes away."""
    client: aioredis.Redis = request.app.state.aioredis
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    try:
        yield ": connected\n\n"
        while not await request.is_disconnected():
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=KEEPALIVE_S)
            if message is None:
                yield ": keepalive\n\n"
                continue
            data = message["data"].decode() if isinstance(message["data"], bytes) else str(message["data"])
            yield f"event: {_event_type(data)}\ndata: {data}\n\n"
    except asyncio.CancelledError:
        raise
    finally:
        await pubsub.unsubscribe(channel)
        await pubsub.aclose()


def _event_type(data: str) -> str:
    # Payloads are JSON objects starting with {"type": "<kind>", ...} (see service.notify).
    start = data.find('"type": "')
    if start < 0:
        return "message"
    start += len('"type": "')
    return data[start : data.find('"', start)]


@router.get("/api/jobs/{job_id}/stream")
def job_stream(job_id: JobId, request: Request, db: DatabaseDep, _: CallerDep) -> StreamingResponse:
    """SSE: `metric`, `eval`, `state`, `log` events of one job as they happen."""
    # A session of its own, closed before streaming: a session from a dependency would be
    # held (a pooled connection, an open read snapshot) for as long as the page stays open.
    with db.read() as session:
        get_job(session, job_id)
    return StreamingResponse(
        relay(request, keys.job_channel(job_id)), media_type="text/event-stream", headers=SSE_HEADERS
    )


@router.get("/api/stream")
def jobs_stream(request: Request, _: CallerDep) -> StreamingResponse:
    """SSE: `state` events of every job, for live lists."""
    return StreamingResponse(relay(request, keys.JOBS_CHANNEL), media_type="text/event-stream", headers=SSE_HEADERS)
