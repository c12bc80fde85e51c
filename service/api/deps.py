"""Typed dependencies of the routes: sessions, Redis, settings, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import redis
from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from service.core.context import Context
from service.core.db import Database
from service.core.exceptions import ForbiddenError
from service.core.settings import Settings
from service.executors import Executor
from service.jobs.intake import SubmissionWriter
from service.lab.auth import Caller, TokenChecker
from service.lab.hosts import HostInventory

SESSION_COOKIE = "towerq_token"


async def get_context(request: Request) -> Context:
    context: Context = request.app.state.context
    return context


ContextDep = Annotated[Context, Depends(get_context)]


async def get_settings(ctx: ContextDep) -> Settings:
    return ctx.settings


async def get_redis(ctx: ContextDep) -> redis.Redis:
    return ctx.redis


def get_read_session(ctx: ContextDep) -> Iterator[Session]:  # sync: it does I/O
    with ctx.db.read() as session:
        yield session


async def get_database(ctx: ContextDep) -> Database:
    return ctx.db


async def get_inventory(request: Request) -> HostInventory:
    inventory: HostInventory = request.app.state.inventory
    return inventory


InventoryDep = Annotated[HostInventory, Depends(get_inventory)]


async def get_executor(request: Request) -> Executor:
    executor: Executor = request.app.state.executor
    return executor


ExecutorDep = Annotated[Executor, Depends(get_executor)]


async def get_writer(request: Request) -> SubmissionWriter:
    writer: SubmissionWriter = request.app.state.writer
    return writer


WriterDep = Annotated[SubmissionWriter, Depends(get_writer)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
SessionDep = Annotated[Session, Depends(get_read_session)]
"""A read session for the request. Routes that write open `db.write()` in their own body:
a transaction held by a yield-dependency would commit only when FastAPI finds a free
thread-pool thread to close it, and under load every thread can be waiting for that very
transaction's lock (SQLite's write lock, or PostgreSQL row locks)."""
DatabaseDep = Annotated[Database, Depends(get_database)]


def bearer_token(request: HTTPConnection) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(SESSION_COOKIE)


async def get_caller(request: Request, ctx: ContextDep) -> Caller:
    return await caller_of(request, ctx)


async def caller_of(request: HTTPConnection, ctx: Context) -> Caller:
    """The token's owner (of a request or a WebSocket): from the checker's cache on the
    event loop when it can (no thread hop for the common case), else from the database in a
    worker thread."""
    checker: TokenChecker = request.app.state.tokens
    token = bearer_token(request)
    caller = checker.cached(token)
    if caller is None:
        caller = await run_in_threadpool(_look_up, ctx, checker, token)
    checker.used(caller.token_id)
    return caller


def _look_up(ctx: Context, checker: TokenChecker, token: str | None) -> Caller:
    with ctx.db.read() as session:
        return checker.check(session, token)


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_admin(caller: CallerDep) -> Caller:
    if not caller.is_admin:
        raise ForbiddenError("admins only")
    return caller


AdminDep = Annotated[Caller, Depends(get_admin)]
