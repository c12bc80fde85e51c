"""Live streams share one Redis subscription per API process, and each token may hold only
so many at once.

Each SSE stream used to hold a Redis connection of its own: about 10,000 open pages (or
one member's script) exhausted Redis's clients for the whole lab. The hub subscribes once
per channel, whatever the number of streams on it, and hands every message to each
stream's own bounded queue. The cap counts a token's open streams across every API
process in a Redis sorted set whose entries each stream refreshes while it lives, so a
process that dies frees its slots within STREAM_SLOT_TTL_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import redis.asyncio as aioredis

from service.core import keys
from service.core.exceptions import TooManyError
from towerq.contract.messages import kind_of

Event = tuple[str, str]
"""A message's kind (`towerq.contract.messages.kind_of`) and its JSON, as streams forward it."""

log = logging.getLogger(__name__)

STREAM_QUEUE = 1000
"""Messages one stream may have waiting. A client that reads slower than that is not held in
memory: its stream ends there (what waited is dropped), and it reconnects and re-reads what
it missed from the database, as after any reconnect."""
STREAM_SLOT_TTL_S = 60.0
"""A stream's slot is refreshed at every keepalive (15 s); one not refreshed for this long
belonged to a process that is gone."""
READ_TIMEOUT_S = 1.0


END: Event = ("", "")
"""Put in every stream's queue by `StreamHub.end_streams`: the stream ends there."""


class StreamHub:
    """One pub/sub connection for every stream of this process."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.queues: dict[str, set[asyncio.Queue[Event]]] = {}
        self.lock = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.ending = False

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[asyncio.Queue[Event]]:
        """A queue that receives every message published on `channel` while held."""
        queue: asyncio.Queue[Event] = asyncio.Queue(STREAM_QUEUE)
        async with self.lock:
            listeners = self.queues.setdefault(channel, set())
            if not listeners:
                await self.pubsub.subscribe(channel)
            listeners.add(queue)
            if self.reader is None or self.reader.done():
                self.reader = asyncio.create_task(self._read())
        try:
            yield queue
        finally:
            with anyio.CancelScope(shield=True):  # a client gone cancels the stream; this still runs
                async with self.lock:
                    listeners.discard(queue)
                    if not listeners:
                        del self.queues[channel]
                        with contextlib.suppress(Exception):  # the connection is gone: nothing to undo
                            await self.pubsub.unsubscribe(channel)

    def end_streams(self) -> None:
        """The process is stopping: every stream gets `END` after what it has waiting, and
        ends. Its client reconnects (to another API process, or this one restarted); the
        server's shutdown waits for no open stream."""
        self.ending = True
        for queue in {q for listeners in self.queues.values() for q in listeners}:
            if queue.full():
                _end_overflowed(queue)
            else:
                queue.put_nowait(END)

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader
        await self.pubsub.aclose()

    async def _read(self) -> None:
        while self.queues:
            try:
                message = await self.pubsub.get_message(timeout=READ_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the stream hub lost Redis; reconnecting")
                await asyncio.sleep(READ_TIMEOUT_S)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel = _text(message["channel"])
            data = _text(message["data"])
            event = (kind_of(data), data)  # read once here, not by each of the channel's streams
            for queue in list(self.queues.get(channel, ())):
                try:
                    queue.put_nowait(event)
                except asyncio.QueueFull:  # a slow reader (STREAM_QUEUE): its stream ends
                    _end_overflowed(queue)


def _end_overflowed(queue: asyncio.Queue[Event]) -> None:
    """A stream that would miss a message ends instead, so its client knows to re-read: a
    silent gap in a live chart, or in a script's rows, would be believed."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(END)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamSlots:
    """How many streams each token, and each member, holds, across every API process."""

    def __init__(self, client: aioredis.Redis, limit: int, member_limit: int) -> None:
        self.client = client
        self.limit = limit
        self.member_limit = member_limit

    async def take(self, token_id: int, user_id: int) -> str:
        """A slot for a new stream of this token; TooManyError when it holds `limit` already,
        or its member `member_limit` over all their tokens."""
        owners = (keys.stream_slots(token_id), keys.member_stream_slots(user_id))
        slot = secrets.token_hex(8)
        now = time.time()
        async with self.client.pipeline(transaction=True) as pipe:
            for key in owners:
                pipe.zremrangebyscore(key, 0, now - STREAM_SLOT_TTL_S)
                pipe.zadd(key, {slot: now})
                pipe.zcard(key)
                pipe.expire(key, int(STREAM_SLOT_TTL_S) * 2)
            answers = await pipe.execute()
        held, member_held = answers[2], answers[6]
        if held > self.limit or member_held > self.member_limit:
            for key in owners:
                await self.client.zrem(key, slot)
            if held > self.limit:
                raise TooManyError(
                    f"this token has {self.limit} live streams open already (TOWERQ_MAX_STREAMS_PER_TOKEN): "
                    "close a page or two, or wait a minute for closed ones to be counted out"
                )
            raise TooManyError(
                f"you have {self.member_limit} live streams open already over all your tokens "
                "(TOWERQ_MAX_STREAMS_PER_MEMBER): close a page or two, or wait a minute for closed ones "
                "to be counted out"
            )
        return slot

    async def refresh(self, token_id: int, user_id: int, slot: str) -> None:
        now = time.time()
        for key in (keys.stream_slots(token_id), keys.member_stream_slots(user_id)):
            await self.client.zadd(key, {slot: now}, xx=True)
            await self.client.expire(key, int(STREAM_SLOT_TTL_S) * 2)

    async def give_back(self, token_id: int, user_id: int, slot: str) -> None:
        with contextlib.suppress(Exception):  # Redis gone: the slot ages out
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.stream_slots(token_id), slot)
                pipe.zrem(keys.member_stream_slots(user_id), slot)
                await pipe.execute()
