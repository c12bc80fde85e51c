"""A notebook session's JupyterLab, through towerq: `/sessions/{job_id}/...`, HTTP and WebSocket.

The session listens on no port a member reaches: its worker holds the session's door
(`worker.notebook`), a TCP port it pipes to JupyterLab's socket for whoever proves they know
the attempt's secret (in the database, `RankAddress` rank 0). This proxy alone knows it. It
lets in the session's owner and admins, by their towerq login (a bearer token, or the
dashboard's session cookie for a browser), and sends JupyterLab neither: the `Authorization`
header and towerq's cookie are taken out of what is forwarded, and a cookie of that name
JupyterLab would set is dropped.

What JupyterLab serves is the member's to shape (their notebooks' outputs run in the browser
of whoever opens the session, an admin's too), on towerq's origin. So each response says,
besides what JupyterLab says: fetches, WebSockets, frames and forms reach only this
session's path (`Content-Security-Policy` by path), no plugin objects, and a window it opens
is severed from it (`Cross-Origin-Opener-Policy: same-origin`): a session's page cannot call
towerq's API with the visitor's login.

Each request and each WebSocket takes a connection of its own to the door (none kept
alive), so the door's count of open connections is the count of clients at work: what tells
an idle session. The proxy keeps no state: after a restart of the API the browser's next
request, and JupyterLab's reconnecting WebSockets, go through as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
import anyio.abc
import httpcore
from fastapi import APIRouter, Path, Request, WebSocket
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from service.api.deps import SESSION_COOKIE, caller_of
from service.core.context import Context
from service.core.exceptions import AuthError, ForbiddenError, NotFoundError, NotReadyError, StateConflictError
from service.core.models import Job, JobState, RankAddress
from service.lab.auth import Caller
from towerq.contract import handshake
from towerq.contract.spec import is_notebook

router = APIRouter(tags=["sessions"])

LABEL = "session"
"""The door's handshake label (`worker.door.LABEL`)."""
CONNECT_TIMEOUT_S = 10.0
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "authorization", "content-length",
    }
)  # fmt: skip
"""Request headers not forwarded (the body's length and the host are set again)."""
RESPONSE_DROPPED = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-authenticate"})
WS_CLIENT_HEADERS = frozenset({"cookie", "origin", "user-agent", "accept-language"})
"""What of a browser's WebSocket handshake goes on to JupyterLab (its origin check needs `Origin`)."""
SESSION_MAX_REQUEST_BYTES = 64 * 2**20
"""The largest request body through a session (JupyterLab uploads a large file in chunks)."""

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="the session's job id")]


@dataclass(frozen=True)
class Door:
    host: str
    port: int
    key: str


def _door(ctx: Context, job_id: int, caller: Caller) -> Door:
    """The door of the session `job_id` for `caller`: its owner or an admin, while it runs."""
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
        if job is None or not is_notebook(job.spec):
            raise NotFoundError(f"job {job_id} is not a notebook session")
        if job.user_id != caller.user_id and not caller.is_admin:
            raise ForbiddenError(f"session {job_id} is {job.user.name}'s: only they (and admins) open it")
        if job.state in (JobState.QUEUED, JobState.DISPATCHED):
            raise NotReadyError(f"session {job_id} is {job.state}: it opens once it runs (towerq notebook waits)")
        if job.state != JobState.RUNNING:
            raise StateConflictError(f"session {job_id} has ended ({job.state}): start a new one")
        row = session.execute(
            select(RankAddress.address, RankAddress.key).where(
                RankAddress.job_id == job_id, RankAddress.attempt == job.attempts, RankAddress.rank == 0
            )
        ).one_or_none()
    if row is None:
        raise NotReadyError(f"session {job_id} is starting")
    host, _, port = row.address.rpartition(":")
    return Door(host, int(port), row.key)


async def _through_door(door: Door) -> socket.socket:
    """A connection through the door, the handshake done (NotReadyError when it is shut)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET6 if ":" in door.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await loop.sock_connect(sock, (door.host, door.port))
            nonce = b""
            while len(nonce) < handshake.NONCE_BYTES:
                chunk = await loop.sock_recv(sock, handshake.NONCE_BYTES - len(nonce))
                if not chunk:
                    raise OSError("the door gave no challenge")
                nonce += chunk
            await loop.sock_sendall(sock, handshake.proof(door.key, nonce, LABEL))
    except (OSError, TimeoutError) as err:
        sock.close()
        raise NotReadyError(f"the session's JupyterLab does not answer ({err or 'timed out'})") from err
    return sock


class _Stream(httpcore.AsyncNetworkStream):
    """httpcore's view of one connection through the door."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return await self.stream.receive(max_bytes)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            try:
                await self.stream.send(buffer)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as err:
                raise httpcore.WriteError(str(err)) from err

    async def aclose(self) -> None:
        await self.stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return None


class _DoorNetwork(httpcore.AsyncNetworkBackend):
    """httpcore's network for one request: the connection through the door."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _Stream(await anyio.abc.SocketStream.from_socket(await _through_door(self.door)))

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def _target(conn: HTTPConnection, root: str, job_id: int, path: str) -> str:
    """The path and query JupyterLab is asked for (it serves under the API's path)."""
    target = f"{root}/sessions/{job_id}/{path}"
    return f"{target}?{conn.url.query}" if conn.url.query else target


def _allowed_here(conn: HTTPConnection, job_id: int, root: str) -> str:
    """The Content-Security-Policy that keeps a session's page to its own path."""
    host = conn.headers.get("host", "localhost")
    secure = conn.url.scheme in ("https", "wss")
    base = f"{root}/sessions/{job_id}/"
    http_base = f"{'https' if secure else 'http'}://{host}{base}"
    ws_base = f"{'wss' if secure else 'ws'}://{host}{base}"
    return (
        f"connect-src {http_base} {ws_base}; frame-src {http_base} blob: data:; child-src {http_base} blob: data:; "
        f"worker-src {http_base} blob:; form-action {http_base}; object-src 'none'; base-uri {http_base}"
    )


def _forwarded(headers: Any) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in headers.raw:
        lower = name.decode("latin-1").lower()
        if lower in HOP_BY_HOP:
            continue
        if lower == "cookie":
            value = _without_towerq_cookie(value)
            if not value:
                continue
        out.append((name, value))
    return out


def _without_towerq_cookie(header: bytes) -> bytes:
    kept = [part for part in header.split(b";") if part.strip().split(b"=", 1)[0] != SESSION_COOKIE.encode()]
    return b";".join(kept).strip()


def _response_headers(headers: list[tuple[bytes, bytes]], policy: str) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in headers:
        lower = name.decode("latin-1").lower()
        if lower in RESPONSE_DROPPED:
            continue
        if lower == "set-cookie" and value.split(b"=", 1)[0].strip() == SESSION_COOKIE.encode():
            continue  # the member's server does not set towerq's login
        out.append((name, value))
    out.append((b"content-security-policy", policy.encode()))
    out.append((b"cross-origin-opener-policy", b"same-origin"))
    return out


@router.api_route(
    "/sessions/{job_id}",
    methods=["GET", "HEAD"],
    include_in_schema=False,
)
async def session_root(job_id: JobId, request: Request) -> Response:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/sessions/{job_id}/lab")


@router.api_route(
    "/sessions/{job_id}/{path:path}",
    methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
    include_in_schema=False,
)
async def session_http(job_id: JobId, path: str, request: Request) -> Response:
    """Proxied to the session's JupyterLab, streamed both ways."""
    ctx: Context = request.app.state.context
    root = ctx.settings.root_path
    try:
        caller = await caller_of(request, ctx)
    except AuthError as err:
        if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
            return _log_in_first(root, str(err))
        raise
    door = await run_in_threadpool(_door, ctx, job_id, caller)
    target = _target(request, root, job_id, path)
    headers = [(b"host", request.headers.get("host", "localhost").encode("latin-1")), *_forwarded(request.headers)]
    body: AsyncIterator[bytes] = request.stream()
    if request.method in ("GET", "HEAD", "OPTIONS", "DELETE") and "content-length" not in request.headers:
        body = _empty()
    elif "content-length" in request.headers:
        headers.append((b"content-length", request.headers["content-length"].encode()))
    else:
        headers.append((b"transfer-encoding", b"chunked"))
    pool = httpcore.AsyncConnectionPool(network_backend=_DoorNetwork(door), max_keepalive_connections=0)
    upstream = httpcore.Request(
        request.method, f"http://{door.host}:{door.port}{target}", headers=headers, content=body
    )
    try:
        response = await pool.handle_async_request(upstream)
    except (httpcore.ConnectError, httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError) as err:
        await pool.aclose()
        raise NotReadyError(f"the session's JupyterLab does not answer ({err})") from err

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_stream():
                yield chunk
        except (httpcore.ReadError, httpcore.RemoteProtocolError):
            return  # the session ended while it answered
        finally:
            await response.aclose()
            await pool.aclose()

    policy = _allowed_here(request, job_id, root)
    out = StreamingResponse(stream(), status_code=response.status)
    out.raw_headers = _response_headers(list(response.headers), policy)
    return out


def _log_in_first(root: str, why: str) -> HTMLResponse:
    """A browser without towerq's login: a page that says so and links the dashboard's
    login, rather than the API's JSON."""
    page = (
        "<!doctype html><meta charset=utf-8><title>towerq: log in first</title>"
        "<body style='font-family:sans-serif;max-width:40em;margin:4em auto'>"
        "<h1>Log in to towerq first</h1>"
        f"<p>This notebook session opens with your towerq login ({html.escape(why)}).</p>"
        f"<p><a href='{html.escape(root)}/'>Log in on the dashboard</a> in this browser, then reload this page.</p>"
    )
    return HTMLResponse(page, status_code=401, headers={"WWW-Authenticate": "Bearer"})


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


@router.websocket("/sessions/{job_id}/{path:path}")
async def session_websocket(websocket: WebSocket, job_id: int, path: str) -> None:
    """A WebSocket of the session's JupyterLab (kernels, terminals, events), piped both ways."""
    ctx: Context = websocket.app.state.context
    try:
        caller = await caller_of(websocket, ctx)
        door = await run_in_threadpool(_door, ctx, job_id, caller)
        sock = await _through_door(door)
    except (AuthError, ForbiddenError, NotFoundError, StateConflictError, NotReadyError):
        await websocket.close(code=1008)
        return
    target = _target(websocket, ctx.settings.root_path, job_id, path)
    headers = [(k, v) for k, v in _forwarded(websocket.headers) if k.decode("latin-1").lower() in WS_CLIENT_HEADERS]
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    host = websocket.headers.get("host", "localhost")
    try:
        upstream = await connect(
            f"ws://{host}{target}",
            sock=sock,
            additional_headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k != b"origin"],
            origin=websocket.headers.get("origin"),  # type: ignore[arg-type]
            subprotocols=offered or None,  # type: ignore[arg-type]
            proxy=None,
            compression=None,
            max_size=None,
            ping_interval=None,
            user_agent_header=None,
        )
    except (OSError, InvalidHandshake, TimeoutError):
        sock.close()
        await websocket.close(code=1011)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    await _pipe(websocket, upstream)


async def _pipe(client: WebSocket, upstream: ClientConnection) -> None:
    async def inward() -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def outward() -> None:
        async for message in upstream:
            if isinstance(message, bytes):
                await client.send_bytes(message)
            else:
                await client.send_text(message)

    tasks = [asyncio.create_task(inward()), asyncio.create_task(outward())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await upstream.close()
        with contextlib.suppress(Exception):
            await client.close()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, WebSocketDisconnect, Exception):
                await task
