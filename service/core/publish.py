"""Telling the rest of the system what changed, after the database says it did.

Code that changes a job queues a notification on its write session; the notifications are
published on Redis only once the transaction has committed (never on rollback), so nobody
hears of a state the database does not hold. Redis being away never fails the change:
the database is the truth and listeners catch up from it.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from sqlalchemy.orm import Session

from service.core import keys
from service.core.sharing import error_category
from towerq.contract.messages import AnyMessage, encode

log = logging.getLogger(__name__)

NOTIFICATIONS = "towerq_notifications"
KICK = "towerq_kick"
SWEEPS = "towerq_sweeps_due"


def job_message(session: Session, message: AnyMessage) -> None:
    """Queue `message` for the job's channel (a state change for the list-level channel
    too), published once the session commits. A stop request reaches the job's trainer
    through the executor (`Executor.stop`), which its caller tells after the commit."""
    session.info.setdefault(NOTIFICATIONS, []).append(message)


def kick_scheduler(session: Session) -> None:
    """Ask for a scheduling pass once this transaction commits."""
    session.info[KICK] = True


def sweeps_due(session: Session) -> None:
    """Ask for a pass and a look at the adaptive sweeps' rungs once this transaction commits."""
    session.info[KICK] = session.info[SWEEPS] = True


class Publisher:
    """Publishes what committed write sessions queued; register it with `Database.on_commit`."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def __call__(self, info: dict[str, Any]) -> None:
        messages = info.get(NOTIFICATIONS, [])
        kick = info.get(KICK, False)
        if messages or kick:
            self.publish(messages, kick, info.get(SWEEPS, False))

    def publish(self, messages: list[AnyMessage], kick: bool, sweeps: bool = False) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for message in messages:
                payload = encode(message)
                pipe.publish(keys.job_channel(message.job_id), payload)
                if message.type == "state":  # every member reads this one: no failed job's own words
                    public = message.model_copy(update={"message": error_category(message.message)})
                    pipe.publish(keys.JOBS_CHANNEL, encode(public) if message.state == "failed" else payload)
            if sweeps:
                pipe.set(keys.SWEEPS_DUE, 1)
            if kick:
                pipe.lpush(keys.SCHEDULER_KICK, 1)
                pipe.ltrim(keys.SCHEDULER_KICK, 0, 0)
            pipe.execute()
        except redis.RedisError as err:
            log.warning("could not publish %d job messages: %s", len(messages), err)
