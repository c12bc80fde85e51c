"""The lab's machines: hosts, their GPUs, what each job holds of them, ranks' addresses."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship

from service.core.models.base import Base, HostState, utcnow

if TYPE_CHECKING:  # mapped by name at run time; these for the type checker
    from service.core.models.jobs import Job


class Host(Base):
    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=HostState.UP)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)

    gpus: Mapped[list[Gpu]] = relationship(back_populates="host", order_by="Gpu.index")


def session_refusals(session: Session) -> dict[str, str | None]:
    """The hosts that are up, each with why its worker runs no notebook sessions, as it
    said when it registered (`worker.notebook.why_no_sessions`); None where it runs them
    (or, a worker from before workers said, did not say)."""
    rows = session.execute(select(Host.name, Host.info).where(Host.state == HostState.UP))
    return {name: (info or {}).get("no_notebooks") for name, info in rows}


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("host_id", "index", name="uq_gpus_host_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    name: Mapped[str] = mapped_column(String(128))
    memory_total_mb: Mapped[int] = mapped_column(Integer)
    memory_used_mb: Mapped[int] = mapped_column(Integer, default=0)
    utilization_pct: Mapped[float | None] = mapped_column(Float, default=None)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    processes: Mapped[list[Any]] = mapped_column(default=list)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    host: Mapped[Host] = relationship(back_populates="gpus")


class Allocation(Base):
    """One GPU (or a fraction of it) held by one attempt of one job."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_gpu_active", "gpu_id", "released_at"),
        Index("ix_allocations_released", "released_at"),  # what was held lately: usage, quotas, fair share
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"))
    fraction: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(default=None)

    job: Mapped[Job] = relationship(back_populates="allocations")
    gpu: Mapped[Gpu] = relationship()
    host: Mapped[Host] = relationship()


class RankAddress(Base):
    """Where one rank of a job over several hosts listens, for one attempt (`address:port`):
    its worker writes it and the other ranks' workers read it (`worker.rendezvous`). It is in
    the database, not in Redis, because it decides whom a trainer sends its gradients to and
    takes them from: whoever reaches Redis must not be able to point a rank elsewhere."""

    __tablename__ = "rank_addresses"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    address: Mapped[str] = mapped_column(String(300))
    key: Mapped[str] = mapped_column(String(64), default="", server_default="")
    """The rank's secret for this attempt: a peer's worker proves it knows it before its
    connection reaches the rank's trainer (`worker.trainer.tunnel`)."""
