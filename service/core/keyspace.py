"""A service owns its Redis keyspace.

Two towerq services on one Redis (two labs on one machine, a test stack beside a real
one) would share `towerq:host:<name>`, `towerq:job:<id>` and the scheduler's lock: one's
scheduler would wake for the other's jobs, its workers take the other's launches. So every
process, as it opens its resources (`Context.open`), claims the keyspace for its
database's identity (`Lab`, made by the first process) under `towerq:lab`, and a process
whose database is another's refuses to start and says what to do."""

from __future__ import annotations

import logging
import uuid
from urllib.parse import urlsplit, urlunsplit

import redis
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from service.core.db import Database
from service.core.keys import LAB_OWNER
from service.core.models import Lab
from service.core.settings import redacted

log = logging.getLogger(__name__)


class KeyspaceError(RuntimeError):
    """The Redis this process was given holds another service's keys."""


def identity(db: Database) -> str:
    """The service's identity, made once (by whichever process comes first)."""
    with db.read() as session:
        found = session.scalar(select(Lab.identity).where(Lab.id == 1))
    if found is not None:
        return found
    try:
        with db.write() as session:
            session.add(Lab(id=1, identity=uuid.uuid4().hex))
    except IntegrityError:
        pass  # another process made it first: theirs is the one
    with db.read() as session:
        return str(session.scalar(select(Lab.identity).where(Lab.id == 1)))


def owner(url: str) -> str | None:
    """The identity of the service whose keys the Redis server at `url` holds, if one claimed it."""
    with _server(url) as server:
        return _text(server.get(LAB_OWNER))


def claim(url: str, mine: str) -> None:
    """Claim the Redis server at `url` for the service `mine`, or raise KeyspaceError when
    another has it (a Redis that does not answer is not checked: the next process to start
    claims it). The claim is the server's, whatever database number `url` names: pub/sub
    channels (`towerq:job:<id>`, `towerq:jobs`) are not per database, so two services on
    two numbers of one server would still hear each other. A claim lost with a flush is
    made again by the next process that starts."""
    try:
        with _server(url) as server:
            server.set(LAB_OWNER, mine, nx=True)
            theirs = _text(server.get(LAB_OWNER))
    except (redis.ConnectionError, redis.TimeoutError) as err:  # the API serves without Redis; claimed later
        log.warning("could not claim Redis at %s for this service (%s): not checked now", redacted(url), err)
        return
    if theirs is not None and theirs != mine:
        raise KeyspaceError(
            f"Redis at {redacted(url)} holds the keys of another towerq service (lab {theirs[:8]}; this one, "
            f"with a database of its own, is lab {mine[:8]}): on one Redis server they would take each other's "
            "jobs and messages, whatever database number each names. Give this service a Redis server of its "
            "own (TOWERQ_REDIS_URL)"
        )


class KeptClaim:
    """A long-running process's claim, made again every `every_s`: a flush of Redis loses
    the claim, and the first process of another service to start after it would take the
    keyspace while this one goes on using it. Made again in time, the claim is this
    service's once more; found taken, it raises KeyspaceError, and the process stops."""

    def __init__(self, url: str, mine: str, every_s: float) -> None:
        self.url = url
        self.mine = mine
        self.every_s = every_s
        self.next_at = 0.0

    def keep(self, now: float) -> None:
        """Claim again when due (`now`, monotonic)."""
        if now >= self.next_at:
            self.next_at = now + self.every_s
            claim(self.url, self.mine)


def _text(found: object) -> str | None:
    return found.decode() if isinstance(found, bytes) else None if found is None else str(found)


def _server(url: str) -> redis.Redis:
    """A client of database 0 of the server at `url`, where the claim is kept."""
    parts = urlsplit(url)  # the URL's own number wins over a `db` argument: replace it
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("db="))
    if parts.scheme == "unix":  # unix:///run/redis.sock?db=1: the path is the socket's
        server = f"unix://{parts.netloc}{parts.path}?{'&'.join(q for q in (query, 'db=0') if q)}"
    else:
        server = urlunsplit(parts._replace(path="/0", query=query))
    return redis.Redis.from_url(server, socket_timeout=10, socket_connect_timeout=5)
