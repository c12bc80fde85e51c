"""The FastAPI application: REST API under /api, the dashboard at /."""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import json
import logging
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import errors
from service.api.deps import get_caller, get_context
from service.api.hub import StreamHub, StreamSlots
from service.api.routes import (
    artifacts,
    attempts,
    catalog,
    code,
    datasets,
    gpus,
    groups,
    health,
    jobs,
    reservations,
    session,
    sessions,
    stream,
    sweeps,
    usage,
    users,
    workers,
)
from service.core.context import Context
from service.core.exceptions import AuthError
from service.core.lifetime import die_with_parent
from service.core.settings import Settings
from service.executors import executor_for
from service.jobs.intake import SubmissionWriter
from service.lab.auth import TokenChecker
from service.lab.hosts import HostInventory

log = logging.getLogger(__name__)


def dashboard_dir() -> Path:
    """The dashboard's static files: `service/web` in an installed wheel, `web/` in a checkout."""
    installed = Path(__file__).resolve().parents[1] / "web"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "web"


MULTIPART_OVERHEAD_BYTES = 64 * 1024
"""Room for a multipart upload's headers and boundaries around the file itself."""


class AuthBeforeUpload:
    """An upload's token is checked before its body is read: FastAPI reads a multipart body
    (into temporary files, up to the route's limit) before any dependency runs, so an
    unauthenticated client could fill the API's disk before its 401."""

    def __init__(self, app: ASGIApp, paths: set[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            request = Request(scope)
            try:
                await get_caller(request, await get_context(request))
            except AuthError as err:
                refused = JSONResponse({"detail": str(err)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


class NoReferrer:
    """`Referrer-Policy: no-referrer` on every response: no page of towerq's tells another
    site (or a proxy's log) where it was, an old `?token=` login link included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"referrer-policy", b"no-referrer")]
            await send(message)

        await self.app(scope, receive, with_policy)


class BodySizeLimit:
    """Refuses request bodies over their limit with 413, before anyone parses them: `limit`
    (TOWERQ_MAX_REQUEST_BYTES), or for an upload route in `uploads` that route's own."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        uploads: dict[str, tuple[int, str]] | None = None,
        prefixes: dict[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.uploads = uploads or {}
        self.prefixes = prefixes or {}
        """Limits of the paths under a prefix (a notebook session's: JupyterLab's own uploads)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        under = next((v for prefix, v in self.prefixes.items() if scope["path"].startswith(prefix)), None)
        limit, setting = self.uploads.get(scope["path"], under or (self.limit, "TOWERQ_MAX_REQUEST_BYTES"))
        allowed = limit + (MULTIPART_OVERHEAD_BYTES if scope["path"] in self.uploads else 0)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > allowed):
            await self._refuse(send, limit, setting)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > allowed:
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(send, limit, setting)

    async def _refuse(self, send: Send, limit: int, setting: str) -> None:
        body = json.dumps({"detail": f"request body larger than {limit} bytes ({setting})"}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


TOKEN_USE_EVERY_S = 10.0


def end_streams_on_exit_signals(hub: StreamHub) -> None:
    """When the server is told to stop (SIGINT, SIGTERM), end the live streams at once, then
    let the server's own handler stop it: its graceful shutdown waits for open connections,
    and a dashboard's stream never closes by itself. Only where signals can be handled (the
    server's main thread), so not under a test client's thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)

        def handle(number: int, frame: FrameType | None, previous: Any = previous) -> None:
            loop.call_soon_threadsafe(hub.end_streams)
            if callable(previous):
                previous(number, frame)

        signal.signal(signum, handle)


async def record_token_use(tokens: TokenChecker, ctx: Context) -> None:
    """Write the tokens' last use now and then, in a worker thread."""
    while True:
        await asyncio.sleep(TOKEN_USE_EVERY_S)
        try:
            await run_in_threadpool(tokens.flush_last_used, ctx.db)
        except Exception:
            log.exception("recording token use failed")


def installed_version() -> str:
    """towerq's version, as pyproject.toml says it (written once, there)."""
    try:
        return importlib.metadata.version("towerq")
    except importlib.metadata.PackageNotFoundError:  # a checkout that was never installed
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for `settings` (read from the environment when not given)."""
    settings = settings or Settings()
    if settings.api_parent_pid is not None:  # one of `towerq api`'s worker processes
        die_with_parent(settings.api_parent_pid)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.context = Context.open(settings)
        app.state.aioredis = aioredis.Redis.from_url(settings.redis_url)
        app.state.hub = StreamHub(app.state.aioredis)
        caps = settings.max_streams_per_token, settings.max_streams_per_member
        app.state.stream_slots = StreamSlots(app.state.aioredis, *caps)
        app.state.tokens = TokenChecker()
        app.state.executor = executor_for(settings, app.state.context.redis)
        app.state.inventory = HostInventory(app.state.context.db, app.state.executor)
        app.state.writer = SubmissionWriter(app.state.context.db)
        recorder = asyncio.create_task(record_token_use(app.state.tokens, app.state.context))
        end_streams_on_exit_signals(app.state.hub)
        # Everything loaded so far lives as long as the process: keep it out of the garbage
        # collector's full passes, which otherwise walk it all in the middle of requests.
        gc.freeze()
        try:
            yield
        finally:
            recorder.cancel()
            await app.state.hub.close()
            await app.state.aioredis.aclose()
            app.state.context.close()

    app = FastAPI(
        title="towerq",
        version=installed_version(),
        description="Multi-GPU training service: job queue, fair-share scheduler, live metrics.",
        lifespan=lifespan,
    )
    errors.install(app)
    for module in (
        jobs, artifacts, code, datasets, sweeps, stream, gpus, workers, users, groups, reservations, health,
        session, catalog, usage, sessions, attempts,
    ):  # fmt: skip
        app.include_router(module.router)
    uploads = {
        "/api/code": (settings.max_code_bytes, "TOWERQ_MAX_CODE_BYTES"),
        "/api/datasets": (settings.user_data_quota_bytes, "TOWERQ_USER_DATA_QUOTA_BYTES"),
    }
    sessions_limit = (sessions.SESSION_MAX_REQUEST_BYTES, "towerq's limit for a notebook session's requests")
    app.add_middleware(
        BodySizeLimit, limit=settings.max_request_bytes, uploads=uploads, prefixes={"/sessions/": sessions_limit}
    )
    app.add_middleware(AuthBeforeUpload, paths=set(uploads))
    app.add_middleware(NoReferrer)
    web = dashboard_dir()
    if (web / "index.html").is_file():
        app.mount("/", StaticFiles(directory=web, html=True), name="web")
    else:
        log.error("the dashboard's files are missing (looked in %s): serving the API only", web)
    return app
