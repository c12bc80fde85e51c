"""Server-sent events: one job's metrics, logs and states; or every job's state changes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from service.api.deps import CallerDep, DatabaseDep, SettingsDep
from service.api.hub import END, StreamHub, StreamSlots
from service.core import keys
from service.core.db import Database
from service.core.exceptions import AuthError, NotFoundError
from service.core.sharing import error_category
from service.jobs import privacy
from service.jobs.read import get_job
from service.lab.auth import Caller, caller_of_token

router = APIRouter(tags=["stream"])

KEEPALIVE_S = 15.0
RECHECK_S = 3.0
"""How often an open stream asks again whether its reader may read it (a revoked token, a
job made private): a revoked reader reads at most this much longer."""
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


Check = Callable[[], Awaitable[bool | None]]
"""Asked every `RECHECK_S` while a stream is open: None ends it (its token or its job is
gone), else whether its log lines are to be hidden now."""


async def relay(request: Request, channel: str, caller: Caller, check: Check, life_s: float) -> AsyncIterator[str]:
    """Forward a Redis channel as SSE until the client goes away (or holds too many), the
    stream's `check` says it may no longer be read, or it has lived `life_s`
    (`TOWERQ_STREAM_MAX_LIFE_S`)."""
    hub: StreamHub = request.app.state.hub
    slots: StreamSlots = request.app.state.stream_slots
    hide_logs = await check()
    if hide_logs is None:
        raise AuthError("token revoked")
    slot = await slots.take(caller.token_id, caller.user_id)
    return _forward(request, hub, slots, channel, caller, slot, check, hide_logs, life_s)


async def _forward(
    request: Request,
    hub: StreamHub,
    slots: StreamSlots,
    channel: str,
    caller: Caller,
    slot: str,
    check: Check,
    hide_logs: bool,
    life_s: float,
) -> AsyncIterator[str]:
    opened = last_check = last_sent = time.monotonic()
    try:
        async with hub.subscribe(channel) as queue:
            yield ": connected\n\n"
            while not hub.ending and not await request.is_disconnected():
                now = time.monotonic()
                if now - opened >= life_s:
                    return  # the client reconnects, and is asked for its token again
                if now - last_check >= RECHECK_S:
                    last_check = now
                    still = await check()
                    if still is None:
                        return
                    hide_logs = still
                try:
                    kind, data = await asyncio.wait_for(queue.get(), min(RECHECK_S, opened + life_s - now))
                except TimeoutError:
                    if time.monotonic() - last_sent >= KEEPALIVE_S:
                        await slots.refresh(caller.token_id, caller.user_id, slot)
                        last_sent = time.monotonic()
                        yield ": keepalive\n\n"
                    continue
                if (kind, data) == END:
                    return
                if hide_logs and kind == "log":
                    continue
                if hide_logs and kind == "state":
                    data = _without_error_text(data)
                last_sent = time.monotonic()
                yield f"event: {kind}\ndata: {data}\n\n"
    finally:
        with anyio.CancelScope(shield=True):  # a client gone cancels this; the slot still goes back
            await slots.give_back(caller.token_id, caller.user_id, slot)


def _without_error_text(data: str) -> str:
    """A `state` event as a member who may not read the job's outputs sees it: a failed
    job's message (its error, the trainer's words) as a category."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return data
    if not isinstance(event, dict) or event.get("state") != "failed":
        return data
    return json.dumps({**event, "message": error_category(event.get("message"))})


@router.get("/api/jobs/{job_id}/stream")
async def job_stream(
    job_id: JobId, request: Request, db: DatabaseDep, caller: CallerDep, settings: SettingsDep
) -> StreamingResponse:
    """SSE: `metric`, `eval`, `state`, `log` events of one job as they happen."""
    # A session of its own per check, closed at once: a session from a dependency would be
    # held (a pooled connection, an open read snapshot) for as long as the page stays open.

    async def check() -> bool | None:
        return await run_in_threadpool(_hides_logs, db, job_id, caller.token_id)

    await run_in_threadpool(_exists, db, job_id)  # 404 naming it, not the "token revoked" of a job gone later
    events = await relay(request, keys.job_channel(job_id), caller, check, settings.stream_max_life_s)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


def _hides_logs(db: Database, job_id: int, token_id: int) -> bool | None:
    """Whether the holder of `token_id` must not see the job's log lines now; None when the
    token is revoked or the job gone (the stream ends)."""
    with db.read() as session:
        now = caller_of_token(session, token_id)
        if now is None:
            return None
        try:
            return not privacy.may_read_outputs(get_job(session, job_id), now)
        except NotFoundError:
            return None


def _exists(db: Database, job_id: int) -> None:
    with db.read() as session:
        get_job(session, job_id)


def _token_live(db: Database, token_id: int) -> bool | None:
    with db.read() as session:
        return None if caller_of_token(session, token_id) is None else False


@router.get("/api/stream")
async def jobs_stream(request: Request, db: DatabaseDep, caller: CallerDep, settings: SettingsDep) -> StreamingResponse:
    """SSE: `state` events of every job, for live lists."""

    async def check() -> bool | None:
        return await run_in_threadpool(_token_live, db, caller.token_id)

    events = await relay(request, keys.JOBS_CHANNEL, caller, check, settings.stream_max_life_s)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
