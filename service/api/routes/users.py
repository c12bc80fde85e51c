"""Users and tokens: admins manage users and limits; everyone manages their own tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import joinedload, selectinload

from service.api.deps import AdminDep, CallerDep, DatabaseDep, SessionDep, SettingsDep
from service.core.exceptions import ForbiddenError, NotFoundError
from service.core.models import ApiToken, User
from service.core.schemas.lab import NewToken, TokenOut, UserOut
from service.lab.auth import USER_NAME_PATTERN, TokenChecker, check_token_count, create_token, revoke_token
from towerq.contract.spec import Priority

router = APIRouter(prefix="/api", tags=["users"])

UserName = Annotated[str, Path(pattern=USER_NAME_PATTERN, description="user name")]
TokenId = Annotated[int, Path(ge=1, le=2**31 - 1)]


class UserChange(BaseModel):
    model_config = {"extra": "forbid"}

    gpu_limit: int | None = Field(default=None, ge=0, le=100_000, description="0 = the default limit")
    share: float | None = Field(default=None, gt=0, le=1_000_000)
    is_admin: bool | None = None
    max_priority: Priority | None = Field(default=None, description="high lets the user jump the queue")
    may_use_network: bool | None = Field(
        default=None, description="let their jobs ask for the network (`network: true`: reaches what the host reaches)"
    )


class TokenRequest(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(default="", max_length=64)
    admin: bool = False


@router.get("/users", response_model=list[UserOut])
def users(session: SessionDep, _: AdminDep) -> Sequence[User]:
    """Every user with their limits and number of active tokens (admins)."""
    return session.scalars(select(User).options(selectinload(User.tokens)).order_by(User.name)).all()


@router.patch("/users/{name}", response_model=UserOut)
def change_user(name: UserName, change: UserChange, db: DatabaseDep, admin: AdminDep, request: Request) -> UserOut:
    """Change a user's GPU limit, fair-share weight, highest priority, network grant or admin flag (admins)."""
    if name == admin.name and change.is_admin is False:
        raise ForbiddenError("you cannot take away your own admin rights: another admin must")
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
        if change.max_priority is not None:
            user.max_priority = change.max_priority
        if change.may_use_network is not None:
            user.may_use_network = change.may_use_network
        out = UserOut.model_validate(user)
    checker: TokenChecker = request.app.state.tokens
    checker.forget()  # what a caller may do is cached with their token
    return out


@router.post("/users/{name}/tokens", status_code=201, response_model=NewToken)
def new_token(
    name: UserName, body: TokenRequest, db: DatabaseDep, caller: CallerDep, settings: SettingsDep
) -> NewToken:
    """A new token for a user (created if needed): admins for anyone, users for themselves.
    The secret is in this answer only."""
    if name != caller.name and not caller.is_admin:
        raise ForbiddenError("only admins create tokens for other users")
    if body.admin and not caller.is_admin:
        raise ForbiddenError("only admins create admin tokens")
    with db.write() as session:
        check_token_count(session, name, settings.max_tokens_per_member)
        row, secret = create_token(session, name, admin=body.admin, label=body.name)
        return NewToken(**TokenOut.model_validate(row).model_dump(), token=secret)


@router.get("/tokens", response_model=list[TokenOut])
def tokens(session: SessionDep, caller: CallerDep) -> Sequence[ApiToken]:
    """Your tokens (all tokens, for admins); never their secrets."""
    query = select(ApiToken).options(joinedload(ApiToken.user)).order_by(ApiToken.id)
    if not caller.is_admin:
        query = query.where(ApiToken.user_id == caller.user_id)
    return session.scalars(query).all()


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke(token_id: TokenId, db: DatabaseDep, caller: CallerDep, request: Request) -> TokenOut:
    """Revoke a token: your own, or anyone's for admins. It stops working at once here and
    within seconds in every other API process."""
    with db.write() as session:
        token = session.get(ApiToken, token_id)
        if token is None or not caller.may_change(token.user_id):
            raise NotFoundError(f"token {token_id} not found")
        revoke_token(session, token_id)
        out = TokenOut.model_validate(token)
    checker: TokenChecker = request.app.state.tokens
    checker.forget()
    return out
