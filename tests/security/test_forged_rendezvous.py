"""The ranks of a job over several hosts meet before their trainers start: each worker says
where its rank listens, and the list becomes the trainers' cluster, whom each sends its
gradients to and takes them from. A rank shares its host's network, so its user code may
reach Redis: an address planted there (before the real rank says its own) must not become
part of anyone's cluster."""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
from sqlalchemy import select

from service.core.db import Database
from service.core.models import Job, User
from service.core.settings import Settings
from worker import rendezvous

FORGED = "203.0.113.66:29400"


def test_an_address_planted_in_redis_does_not_join_the_ranks_cluster(
    db: Database, settings: Settings, redis_client: redis.Redis, make_token: Callable[..., str]
) -> None:
    make_token("alice")
    with db.write() as session:
        user_id = session.scalars(select(User.id).where(User.name == "alice")).one()
        job = Job(name="wide", user_id=user_id, state="dispatched", spec={}, priority="normal", gpu_count=4)
        job.gpu_memory_fraction, job.total_steps, job.max_attempts, job.attempts = 1.0, 10, 3, 1
        session.add(job)
        session.flush()
        job_id = job.id
    local = settings.model_copy(update={"worker_address": "127.0.0.1", "rendezvous_timeout_s": 20.0})
    redis_client.hset(f"towerq:rendezvous:{job_id}:1", mapping={"1": FORGED})  # where the workers met before
    clusters: dict[int, list[str]] = {}

    def meet(rank: int) -> None:
        clusters[rank] = rendezvous.meet(db, local, job_id, 1, rank, 2, lambda: True)

    first = threading.Thread(target=meet, args=(0,))
    first.start()
    first.join(1.0)
    assert first.is_alive(), "rank 0 must wait for rank 1's own word"
    meet(1)
    first.join(20)
    assert clusters[0] == clusters[1] and len(clusters[0]) == 2, clusters
    assert FORGED not in clusters[0] and all(a.startswith("127.0.0.1:") for a in clusters[0]), clusters
