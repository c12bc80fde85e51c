"""Users and API tokens. Tokens are random and stored only as their SHA-256 hash."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Row, Select, func, select, text, update
from sqlalchemy.orm import Session

from service.core.db import Database
from service.core.exceptions import AuthError, ForbiddenError, NotFoundError, TooManyError
from service.core.models import ApiToken, User, utcnow
from towerq.contract.spec import Priority

TOKEN_PREFIX = "tq_"
LAST_USED_EVERY_S = 60.0
USER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


@dataclass(frozen=True)
class Caller:
    """Who is calling the API."""

    user_id: int
    name: str
    is_admin: bool
    token_id: int
    max_priority: Priority = Priority.NORMAL
    """The highest priority this caller may give a job (admins: high)."""
    may_use_network: bool = False
    """Whether their jobs may ask for the network (an admin's grant; admins: always)."""

    def may_change(self, owner_id: int) -> bool:
        """Whether the caller may change or stop what `owner_id` owns: its owner, or an admin."""
        return owner_id == self.user_id or self.is_admin

    def check_owner(self, owner_id: int, what: str, owner: str, action: str) -> None:
        """Refuse (403) a change to `what` unless the caller owns it or is an admin."""
        if not self.may_change(owner_id):
            raise ForbiddenError(f"{what} belongs to {owner}; only they or an admin may {action} it")

    def check_priority(self, priority: Priority) -> None:
        """Refuse a priority above the caller's: high priority may stop other users' jobs
        (with preemption on), so it is for admins and for users an admin allows."""
        if priority.rank > self.max_priority.rank:
            raise ForbiddenError(
                f"priority {priority} is for admins and for users an admin allows "
                f"(`towerq user set {self.name} --max-priority {priority}`); you may use up to {self.max_priority}"
            )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def ensure_user(session: Session, name: str, admin: bool = False) -> User:
    """The user called `name`, created if needed; `admin` only ever grants, never revokes."""
    user = session.scalars(select(User).where(User.name == name)).one_or_none()
    if user is None:
        user = User(name=name, is_admin=admin)
        session.add(user)
        session.flush()
    elif admin and not user.is_admin:
        user.is_admin = True
    return user


def create_token(session: Session, user_name: str, admin: bool = False, label: str = "") -> tuple[ApiToken, str]:
    """A new token for `user_name` (creating the user); returns the row and the secret."""
    user = ensure_user(session, user_name, admin)
    secret = new_token()
    row = ApiToken(user_id=user.id, name=label, token_hash=hash_token(secret), prefix=secret[:10])
    session.add(row)
    session.flush()
    return row, secret


def check_token_count(session: Session, user_name: str, limit: int) -> None:
    """TooManyError when `user_name` holds `limit` live tokens already."""
    held = session.scalar(
        select(func.count(ApiToken.id))
        .join(User, ApiToken.user_id == User.id)
        .where(User.name == user_name, ApiToken.revoked_at.is_(None))
    )
    if (held or 0) >= limit:
        raise TooManyError(
            f"{user_name} holds {limit} live tokens already (TOWERQ_MAX_TOKENS_PER_MEMBER): "
            "revoke one first (towerq tokens revoke ID, or DELETE /api/tokens/ID)"
        )


def revoke_token(session: Session, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFoundError(f"token {token_id} not found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


CallerColumns = Select[int, datetime | None, int, str, bool, str | None, bool]


def _caller_query() -> CallerColumns:
    return select(
        ApiToken.id, ApiToken.revoked_at, User.id, User.name, User.is_admin, User.max_priority, User.may_use_network
    ).join(User, ApiToken.user_id == User.id)


def _caller(row: Row[int, datetime | None, int, str, bool, str | None, bool]) -> Caller:
    admin = row[4]
    allowed = Priority.HIGH if admin else Priority(row[5] or Priority.NORMAL)
    return Caller(
        user_id=row[2], name=row[3], is_admin=admin, token_id=row[0], max_priority=allowed,
        may_use_network=admin or row[6],
    )  # fmt: skip


def caller_of_token(session: Session, token_id: int) -> Caller | None:
    """Who holds token `token_id` now (their admin flag as it is now); None once it is
    revoked or its user deleted. For what outlives a request: an open stream."""
    row = session.execute(_caller_query().where(ApiToken.id == token_id)).one_or_none()
    return None if row is None or row[1] is not None else _caller(row)


def has_admin(session: Session) -> bool:
    count = session.scalar(
        select(func.count(ApiToken.id))
        .join(User, ApiToken.user_id == User.id)
        .where(User.is_admin.is_(True), ApiToken.revoked_at.is_(None))
    )
    return bool(count)


BOOTSTRAP_LOCK = 0x746F77657271  # "towerq": the PostgreSQL advisory lock of `bootstrap_admin`


def bootstrap_admin(session: Session, user_name: str = "admin", label: str = "first admin") -> str | None:
    """The first admin token (its secret), or None when an admin with a live token exists.

    Idempotent and safe to run from several places at once (`towerq up`, the compose
    `bootstrap` service, a restart of either): on PostgreSQL a transaction-scoped advisory
    lock makes the check and the insert one step; a SQLite write session already holds the
    database's write lock from its first statement.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": BOOTSTRAP_LOCK})
    if has_admin(session):
        return None
    _, secret = create_token(session, user_name, admin=True, label=label)
    return secret


class TokenChecker:
    """Looks tokens up, remembering recent answers for a few seconds to spare the database
    a query per request; a revocation is honoured within `ttl_s`."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Caller]] = {}
        self._last_used: dict[int, float] = {}
        self._touched: set[int] = set()

    def cached(self, token: str | None) -> Caller | None:
        """The caller for `token` if it was looked up in the last `ttl_s` seconds."""
        if not token:
            return None
        cached = self._cache.get(hash_token(token))
        if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
            return cached[1]
        return None

    def check(self, session: Session, token: str | None) -> Caller:
        if not token:
            raise AuthError("missing token: send 'Authorization: Bearer <token>'")
        digest = hash_token(token)
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        row = session.execute(_caller_query().where(ApiToken.token_hash == digest)).one_or_none()
        if row is None:
            raise AuthError("invalid token")
        if row[1] is not None:
            raise AuthError("token revoked")
        caller = _caller(row)
        self._cache[digest] = (now, caller)
        return caller

    def forget(self) -> None:
        self._cache.clear()

    def used(self, token_id: int) -> None:
        """Note that the token was used; `flush_last_used` records it, at most once a minute."""
        now = time.monotonic()
        if now - self._last_used.get(token_id, -LAST_USED_EVERY_S) >= LAST_USED_EVERY_S:
            self._last_used[token_id] = now
            self._touched.add(token_id)

    def flush_last_used(self, db: Database) -> None:
        """Write `last_used_at` of the tokens used since the last flush, in one transaction
        (off the request path: a request never waits for this write)."""
        touched, self._touched = self._touched, set()
        if touched:
            with db.write() as session:
                session.execute(update(ApiToken).where(ApiToken.id.in_(touched)).values(last_used_at=utcnow()))
