"""A stream whose reader falls behind by more than STREAM_QUEUE messages ends, so its
client reconnects and re-reads from the database, instead of silently missing rows."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as aioredis

from service.api.hub import END, STREAM_QUEUE, StreamHub


async def _flood(redis_url: str, extra: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    client = aioredis.Redis.from_url(redis_url)
    hub = StreamHub(client)
    try:
        async with hub.subscribe("flood") as slow, hub.subscribe("flood") as keeping_up:
            await asyncio.sleep(0.2)  # the subscription is in place
            kept: list[tuple[str, str]] = []

            async def keep_up() -> None:
                while len(kept) < STREAM_QUEUE + extra:
                    kept.append(await asyncio.wait_for(keeping_up.get(), 10))

            reading = asyncio.create_task(keep_up())
            for n in range(STREAM_QUEUE + extra):
                await client.publish("flood", f'{{"type": "log", "message": "{n}"}}')
            await reading
            waiting = [slow.get_nowait() for _ in range(slow.qsize())]
            return waiting, kept
    finally:
        await hub.close()
        await client.aclose()


def flood(redis_url: str, extra: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """`_flood` on an event loop of its own thread (a test before may leave one running in
    this thread, where asyncio.run refuses to start)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _flood(redis_url, extra)).result(timeout=60)


def test_a_reader_that_falls_behind_is_ended_not_left_with_a_gap(redis_url: str) -> None:
    waiting, kept = flood(redis_url, extra=5)
    assert len(kept) == STREAM_QUEUE + 5  # the other stream on the channel loses nothing
    assert waiting[0] == END, "the slow stream ends at the overflow"
    assert all(event != END for event in kept)


def test_a_reader_within_the_queue_misses_nothing(redis_url: str) -> None:
    waiting, kept = flood(redis_url, extra=-STREAM_QUEUE // 2)
    assert len(waiting) == len(kept) == STREAM_QUEUE // 2
    assert END not in waiting
