"""Typed dependencies of the routes: sessions, Redis, settings, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import redis
from fastapi import Depends, Request
from sqlalchemy import update
from sqlalchemy.orm import Session

from service.auth import Caller, TokenChecker
from service.context import Context
from service.exceptions import ForbiddenError
from service.models import ApiToken, utcnow
from service.settings import Settings

SESSION_COOKIE = "towerq_token"


def get_context(request: Request) -> Context:
    context: Context = request.app.state.context
    return context


ContextDep = Annotated[Context, Depends(get_context)]


def get_settings(ctx: ContextDep) -> Settings:
    return ctx.settings


def get_redis(ctx: ContextDep) -> redis.Redis:
    return ctx.redis


def get_read_session(ctx: ContextDep) -> Iterator[Session]:
    with ctx.db.read() as session:
        yield session


def get_write_session(ctx: ContextDep) -> Iterator[Session]:
    """A session whose changes commit when the route returns (and roll back on error)."""
    with ctx.db.write() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
RedisDep = Annotated[redis.Redis, Depends(get_redis)]
SessionDep = Annotated[Session, Depends(get_read_session)]
WriteSessionDep = Annotated[Session, Depends(get_write_session)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(SESSION_COOKIE)


def get_caller(request: Request, ctx: ContextDep) -> Caller:
    checker: TokenChecker = request.app.state.tokens
    with ctx.db.read() as session:
        caller = checker.check(session, bearer_token(request))
    if checker.needs_last_used(caller.token_id):
        with ctx.db.write() as session:
            session.execute(update(ApiToken).where(ApiToken.id == caller.token_id).values(last_used_at=utcnow()))
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]


def get_admin(caller: CallerDep) -> Caller:
    if not caller.is_admin:
        raise ForbiddenError("admins only")
    return caller


AdminDep = Annotated[Caller, Depends(get_admin)]
