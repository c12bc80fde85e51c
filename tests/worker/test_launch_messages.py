"""A host's worker runs towerq's launch messages and nothing else found on its queue."""

from __future__ import annotations

import os
import pickle
import threading
import time
import zlib
from pathlib import Path

import redis
from rq import Queue

from service.core import keys, launches
from tests.stack import wait_for
from worker.agent import LaunchWorker


class RunsCodeWhenUnpickled:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_the_worker_refuses_what_is_not_a_launch_and_never_runs_it(redis_client: redis.Redis, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    queue = launches.host_queue(redis_client, "lab-a")
    refused = [
        queue.enqueue_call("os.system", args=(f"touch {marker}",)),
        queue.enqueue_call(launches.LAUNCH_FUNCTION, args=("1; touch x", 1)),
        queue.enqueue_call(launches.LAUNCH_FUNCTION, args=(1, 1), kwargs={"extra": True}),
    ]
    pickled = Queue(keys.host_queue("lab-a"), connection=redis_client).enqueue_call("os.getcwd")
    redis_client.hset(pickled.key, "data", zlib.compress(pickle.dumps(RunsCodeWhenUnpickled(marker))))
    refused.append(pickled)

    worker = LaunchWorker([queue], connection=redis_client, serializer=launches.SERIALIZER)
    worker.work(burst=True, logging_level="ERROR", with_scheduler=False)

    assert not marker.exists()
    assert int(redis_client.get(keys.refused_count("lab-a")) or 0) == len(refused)
    assert not any(redis_client.exists(job.key) for job in refused)  # dropped
    assert queue.count == 0


def test_a_launch_message_is_accepted_with_its_job_and_attempt(redis_client: redis.Redis) -> None:
    launches.send(redis_client, "lab-a", 12, 3)
    message = launches.host_queue(redis_client, "lab-a").jobs[0]
    assert message.id == launches.launch_id(12, 3)
    assert launches.check(message) == (12, 3)
    assert launches.pending(redis_client, 12, 3)


def test_the_workers_command_channel_lets_it_stop_at_once_after_it_unsubscribed(redis_client: redis.Redis) -> None:
    """A worker's stop (RQ's teardown) unsubscribes from RQ's command channel, then stops the
    thread that reads it. A thread that read the unsubscription first waited for a new
    subscription for RQ's minute, and redis-py 8.2's stop waits for the thread: the worker
    outlived SIGTERM by a minute (`towerq up` and the suite's stacks killed it)."""
    worker = LaunchWorker([launches.host_queue(redis_client, "lab-a")], connection=redis_client)
    worker.subscribe()
    wait_for(lambda: worker.pubsub.subscribed, 10, "the subscription")
    worker.pubsub.unsubscribe()
    wait_for(lambda: not worker.pubsub.subscribed, 10, "the thread to read the unsubscription")
    stopping = threading.Thread(target=worker.unsubscribe, daemon=True)
    started = time.monotonic()
    stopping.start()
    stopping.join(15)
    took = time.monotonic() - started
    assert not stopping.is_alive() and took < 5, f"the command channel's thread took {took:.1f} s to stop"
