"""Users and tokens: admins manage users and limits; everyone manages their own tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field
from sqlalchemy import func, select

from service.api.deps import AdminDep, CallerDep, DatabaseDep, SessionDep
from service.auth import USER_NAME_PATTERN, TokenChecker, create_token, revoke_token
from service.exceptions import ForbiddenError, NotFoundError
from service.models import ApiToken, User

router = APIRouter(prefix="/api", tags=["users"])

UserName = Annotated[str, Path(pattern=USER_NAME_PATTERN, description="user name")]
TokenId = Annotated[int, Path(ge=1, le=2**31 - 1)]


class UserOut(BaseModel):
    name: str
    is_admin: bool
    gpu_limit: int | None
    share: float
    tokens: int
    created_at: datetime


class UserChange(BaseModel):
    model_config = {"extra": "forbid"}

    gpu_limit: int | None = Field(default=None, ge=0, le=100_000, description="0 = the default limit")
    share: float | None = Field(default=None, gt=0, le=1_000_000)
    is_admin: bool | None = None


class TokenRequest(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(default="", max_length=64)
    admin: bool = False


class TokenOut(BaseModel):
    id: int
    user: str
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class NewToken(TokenOut):
    token: str = Field(description="the secret; shown only in this answer")


def _user_out(user: User, tokens: int) -> UserOut:
    return UserOut(
        name=user.name,
        is_admin=user.is_admin,
        gpu_limit=user.gpu_limit,
        share=user.share,
        tokens=tokens,
        created_at=user.created_at,
    )


def _token_out(token: ApiToken, user: str) -> TokenOut:
    return TokenOut(
        id=token.id,
        user=user,
        name=token.name,
        prefix=token.prefix,
        created_at=token.created_at,
        last_used_at=token.last_used_at,
        revoked_at=token.revoked_at,
    )


@router.get("/users", response_model=list[UserOut])
def users(session: SessionDep, _: AdminDep) -> list[UserOut]:
    """Every user with their limits and number of active tokens (admins)."""
    counts = dict(
        session.execute(
            select(ApiToken.user_id, func.count(ApiToken.id))
            .where(ApiToken.revoked_at.is_(None))
            .group_by(ApiToken.user_id)
        ).all()
    )
    return [_user_out(u, counts.get(u.id, 0)) for u in session.scalars(select(User).order_by(User.name))]


@router.patch("/users/{name}", response_model=UserOut)
def change_user(name: UserName, change: UserChange, db: DatabaseDep, _: AdminDep) -> UserOut:
    """Change a user's GPU limit, fair-share weight or admin flag (admins)."""
    with db.write() as session:
        user = session.scalars(select(User).where(User.name == name)).one_or_none()
        if user is None:
            raise NotFoundError(f"no user {name!r}")
        if change.gpu_limit is not None:
            user.gpu_limit = change.gpu_limit or None
        if change.share is not None:
            user.share = change.share
        if change.is_admin is not None:
            user.is_admin = change.is_admin
        tokens = session.scalar(
            select(func.count(ApiToken.id)).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
        )
        return _user_out(user, tokens or 0)


@router.post("/users/{name}/tokens", status_code=201, response_model=NewToken)
def new_token(name: UserName, body: TokenRequest, db: DatabaseDep, caller: CallerDep) -> NewToken:
    """A new token for a user (created if needed): admins for anyone, users for themselves.
    The secret is in this answer only."""
    if name != caller.name and not caller.is_admin:
        raise ForbiddenError("only admins create tokens for other users")
    if body.admin and not caller.is_admin:
        raise ForbiddenError("only admins create admin tokens")
    with db.write() as session:
        row, secret = create_token(session, name, admin=body.admin, label=body.name)
        return NewToken(**_token_out(row, name).model_dump(), token=secret)


@router.get("/tokens", response_model=list[TokenOut])
def tokens(session: SessionDep, caller: CallerDep) -> list[TokenOut]:
    """Your tokens (all tokens, for admins); never their secrets."""
    query = select(ApiToken, User.name).join(User, ApiToken.user_id == User.id).order_by(ApiToken.id)
    if not caller.is_admin:
        query = query.where(ApiToken.user_id == caller.user_id)
    return [_token_out(token, user) for token, user in session.execute(query)]


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke(token_id: TokenId, db: DatabaseDep, caller: CallerDep, request: Request) -> TokenOut:
    """Revoke a token: your own, or anyone's for admins. It stops working at once here and
    within seconds in every other API process."""
    with db.write() as session:
        token = session.get(ApiToken, token_id)
        if token is None or (token.user_id != caller.user_id and not caller.is_admin):
            raise NotFoundError(f"token {token_id} not found")
        revoke_token(session, token_id)
        out = _token_out(token, token.user.name)
    checker: TokenChecker = request.app.state.tokens
    checker.forget()
    return out
