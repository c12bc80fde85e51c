"""The resources a towerq process holds (database, Redis, settings), opened and closed together."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from service.core.db import Database
from service.core.keyspace import claim, identity
from service.core.publish import Publisher
from service.core.settings import Settings


def connect_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)


@dataclass
class Context:
    settings: Settings
    db: Database
    redis: redis.Redis

    @classmethod
    def open(cls, settings: Settings) -> Context:
        """Open the database and Redis, and claim Redis's keyspace for this service's
        database (`service.core.keyspace`): KeyspaceError when another service has it."""
        db = Database(settings.database_url)
        client = connect_redis(settings.redis_url)
        try:
            claim(settings.redis_url, identity(db))
        except BaseException:
            db.dispose()
            client.close()
            raise
        db.on_commit.append(Publisher(client))
        return cls(settings=settings, db=db, redis=client)

    def close(self) -> None:
        self.db.dispose()
        self.redis.close()
