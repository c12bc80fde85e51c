"""A GPU's state that several processes change: draining (an admin through the API, a
worker whose trainer outlived its end)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.models import Gpu, Host
from service.core.publish import kick_scheduler


def set_drained(session: Session, host: str, indices: Sequence[int], drained: bool) -> list[Gpu]:
    """Drain these GPUs of `host` (no new work until undrained) or give them back to the
    scheduler (a pass is asked for); returns the GPUs found."""
    gpus = list(
        session.scalars(
            select(Gpu).join(Host, Gpu.host_id == Host.id).where(Host.name == host, Gpu.index.in_(list(indices)))
        )
    )
    for gpu in gpus:
        gpu.drained = drained
    if gpus and not drained:
        kick_scheduler(session)
    return gpus
