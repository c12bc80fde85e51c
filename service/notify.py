"""Telling the rest of the system what changed, after the database says it did.

Code that changes a job queues a notification on its write session; the notifications are
published on Redis only once the transaction has committed (never on rollback), so nobody
hears of a state the database does not hold. Redis being away never fails the change:
the database is the truth and listeners catch up from it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from sqlalchemy.orm import Session

from service import keys

log = logging.getLogger(__name__)

NOTIFICATIONS = "towerq_notifications"
KICK = "towerq_kick"
CONTROL_KINDS = ("cancel", "preempt")
"""Messages also sent to the worker of the job's host, which acts on them."""


def job_message(session: Session, job_id: int, kind: str, data: dict[str, Any]) -> None:
    """Queue `data` as a `kind` event on the job's channel (and the list-level channel)."""
    session.info.setdefault(NOTIFICATIONS, []).append((job_id, kind, data))


def kick_scheduler(session: Session) -> None:
    """Ask for a scheduling pass once this transaction commits."""
    session.info[KICK] = True


class Publisher:
    """Publishes what committed write sessions queued; register it with `Database.on_commit`."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def __call__(self, info: dict[str, Any]) -> None:
        messages = info.get(NOTIFICATIONS, [])
        kick = info.get(KICK, False)
        if messages or kick:
            self.publish(messages, kick)

    def publish(self, messages: list[tuple[int, str, dict[str, Any]]], kick: bool) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for job_id, kind, data in messages:
                payload = json.dumps({"type": kind, "job_id": job_id, **data}, default=str)
                pipe.publish(keys.job_channel(job_id), payload)
                if kind == "state":
                    pipe.publish(keys.JOBS_CHANNEL, payload)
                elif kind in CONTROL_KINDS and data.get("host"):
                    pipe.publish(keys.host_control_channel(str(data["host"])), payload)
            if kick:
                pipe.lpush(keys.SCHEDULER_KICK, 1)
                pipe.ltrim(keys.SCHEDULER_KICK, 0, 0)
            pipe.execute()
        except redis.RedisError as err:
            log.warning("could not publish %d job messages: %s", len(messages), err)
