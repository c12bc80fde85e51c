"""Who uses the lab: the lab itself, its users, groups, reservations and API tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.core.models.base import Base, utcnow


class Lab(Base):
    """The service's identity (one row, made by its first process): the Redis keyspace it
    claims carries it, so a second service on the same Redis is told, not mixed in
    (`service.core.keyspace`)."""

    __tablename__ = "lab"

    id: Mapped[int] = mapped_column(primary_key=True)
    identity: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_limit: Mapped[int | None] = mapped_column(Integer, default=None)
    share: Mapped[float] = mapped_column(Float, default=1.0)
    max_priority: Mapped[str | None] = mapped_column(String(8), default=None)
    """The highest priority this user may ask for; None: normal (admins: always high)."""
    may_use_network: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Whether their jobs may ask for the network (`network: true`): an admin's grant
    (admins always may). Such a job reaches what its host reaches."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user")

    @property
    def allowed_priority(self) -> str:
        return "high" if self.is_admin else self.max_priority or "normal"

    @property
    def active_tokens(self) -> int:
        return sum(1 for token in self.tokens if token.revoked_at is None)


class Group(Base):
    """A part of the lab (a sub-group, a project) that shares its GPUs by agreement: its
    share weighs it against the other groups, and its quotas cap it."""

    __tablename__ = "groups"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    share: Mapped[float] = mapped_column(Float, default=1.0)
    max_gpus: Mapped[float | None] = mapped_column(Float, default=None)
    """At most this many GPUs at once (fractions count as such); None: no cap."""
    max_gpu_hours_week: Mapped[float | None] = mapped_column(Float, default=None)
    """At most this many GPU hours in any 7 days; None: no cap."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    members: Mapped[list[GroupMember]] = relationship(
        back_populates="group", cascade="all, delete-orphan", order_by="GroupMember.id"
    )


class GroupMember(Base):
    __tablename__ = "group_members"
    __table_args__ = (UniqueConstraint("group_id", "user_id", name="uq_group_members_group_user"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    """The group the user's jobs run in when they name none."""

    group: Mapped[Group] = relationship(back_populates="members")
    user: Mapped[User] = relationship()


class Reservation(Base):
    """GPUs kept for a group over a window: from `start_at` only its jobs use them; before,
    others' jobs use them only if they are sure to end in time."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(primary_key=True)
    group: Mapped[str] = mapped_column(String(64), index=True)
    gpus: Mapped[list[Any]] = mapped_column()
    """The GPUs kept, chosen at creation: [[host, index], ...]."""
    start_at: Mapped[datetime] = mapped_column()
    end_at: Mapped[datetime] = mapped_column(index=True)
    note: Mapped[str] = mapped_column(String(200), default="")
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    user: Mapped[User] = relationship(back_populates="tokens")
