"""Where the ranks of a job over several hosts meet before their trainers start.

Each host's worker picks a free port of `TOWERQ_RANK_PORTS` for its rank, writes
`address:port` under the attempt's key in Redis (`towerq:rendezvous:<job>:<attempt>`,
transport only: it expires), and waits until every rank has written its own. The list, by
rank, becomes the trainers' cluster (`RuntimeSpec.cluster`, TensorFlow's `TF_CONFIG`). A
rank whose peers do not come within `TOWERQ_RENDEZVOUS_TIMEOUT_S` (a host went away, its
launch was lost) gives the attempt up; the job queues again.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import redis

from service.core import keys
from service.core.settings import Settings

KEY_TTL_S = 3600
POLL_S = 0.2


class RendezvousError(RuntimeError):
    """The other ranks did not come in time, or no port was free."""


def address(settings: Settings) -> str:
    """This host's address as the other GPU hosts reach it."""
    if settings.worker_address:
        return settings.worker_address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port(settings: Settings, host: str, start: int = 0) -> int:
    """A port of `TOWERQ_RANK_PORTS` nothing listens on now, looked for from the `start`-th
    on (each rank of an attempt starts elsewhere, so ranks on one machine do not pick the
    same one before their trainers bind it; a port taken meanwhile fails the attempt,
    which is tried again)."""
    low, high = (int(p) for p in settings.rank_ports.split("-"))
    span = max(1, high - low + 1)
    for offset in range(span):
        port = low + (start + offset) % span
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host if host != "localhost" else "127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RendezvousError(f"no free port in TOWERQ_RANK_PORTS={settings.rank_ports}")


def meet(
    connection: redis.Redis,
    settings: Settings,
    job_id: int,
    attempt: int,
    rank: int,
    ranks: int,
    still_wanted: Callable[[], bool],
) -> list[str]:
    """Every rank's `address:port`, by rank, once all have written theirs."""
    here = address(settings)
    mine = f"{here}:{free_port(settings, here, job_id * 31 + attempt * 7 + rank * 3)}"
    name = keys.rendezvous(job_id, attempt)
    connection.hset(name, str(rank), mine)
    connection.expire(name, KEY_TTL_S)
    deadline = time.monotonic() + settings.rendezvous_timeout_s
    checked = time.monotonic()
    while True:
        seen = {_text(k): _text(v) for k, v in connection.hgetall(name).items()}
        if all(str(r) in seen for r in range(ranks)):
            return [seen[str(r)] for r in range(ranks)]
        if seen.get(str(rank)) is None:  # Redis was flushed: write ours again
            connection.hset(name, str(rank), mine)
            connection.expire(name, KEY_TTL_S)
        now = time.monotonic()
        if now >= deadline:
            missing = [r for r in range(ranks) if str(r) not in seen]
            raise RendezvousError(
                f"rank {rank}: ranks {missing} of this job did not start within {settings.rendezvous_timeout_s:.0f} s"
            )
        if now - checked >= 1.0:
            checked = now
            if not still_wanted():
                raise RendezvousError("the attempt was given up while its ranks met")
        time.sleep(POLL_S)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
