"""Where the ranks of a job over several hosts meet before their trainers start.

Each host's worker picks a free port of `TOWERQ_RANK_PORTS` for its rank, writes
`address:port` for its rank of the attempt into the database (`RankAddress`), and waits
until every rank has written its own. The list, by rank, becomes the trainers' cluster
(`RuntimeSpec.cluster`, TensorFlow's `TF_CONFIG`): whom each trainer sends its gradients to
and takes them from, so it is not kept in Redis, which more can reach than the database (a
trainer of a job over several hosts shares its host's network). A rank whose peers do not
come within `TOWERQ_RENDEZVOUS_TIMEOUT_S` (a host went away, its launch was lost) gives the
attempt up; the job queues again.
"""

from __future__ import annotations

import secrets
import socket
import time
import zlib
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from service.core.db import Database
from service.core.models import RankAddress
from service.core.settings import Settings

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


def free_port(settings: Settings, host: str, start: int = 0, count: int = 1) -> int:
    """A port of `TOWERQ_RANK_PORTS` nothing listens on now, with the `count` - 1 after it
    free too (a command job's rank takes a run of ports: `worker.gang`), looked for from the
    `start`-th on (each rank of an attempt starts elsewhere, so ranks on one machine do not
    pick the same one before their trainers bind it; a port taken meanwhile fails the
    attempt, which is tried again)."""
    low, high = settings.rank_port_range
    span = max(1, high - low + 1)
    for offset in range(span):
        port = low + (start + offset) % span
        if port + count - 1 <= high and all(_free(host, port + k) for k in range(count)):
            return port
    wanted = f"no {count} free ports in a row" if count > 1 else "no free port"
    raise RendezvousError(f"{wanted} in TOWERQ_RANK_PORTS={settings.rank_ports}")


def _free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host if host != "localhost" else "127.0.0.1", port))
        except OSError:
            return False
        return True


def first_port_tried(settings: Settings, job_id: int, attempt: int) -> int:
    """Where in `TOWERQ_RANK_PORTS` an attempt's ranks start looking (rank r a few ports
    further on, so ranks on one machine do not pick the same one before their processes
    bind it). It depends on the lab (its database) as well as the attempt: two towerq
    services on one machine, each with its job 1, start elsewhere."""
    return zlib.crc32(f"{settings.database_url}|{job_id}|{attempt}".encode())


def meet(
    db: Database,
    settings: Settings,
    job_id: int,
    attempt: int,
    rank: int,
    ranks: int,
    still_wanted: Callable[[], bool],
    ports: int = 1,
) -> list[str]:
    """Every rank's `address:port`, by rank, once all have written theirs (with a secret of
    this rank's for the attempt, `keys`). With `ports` > 1 a rank's port is the first of
    that many free in a row on its host."""
    here = address(settings)
    mine = f"{here}:{free_port(settings, here, first_port_tried(settings, job_id, attempt) + rank * 3 * ports, ports)}"
    try:
        with db.write() as session:
            key = secrets.token_hex(32)
            session.merge(RankAddress(job_id=job_id, attempt=attempt, rank=rank, address=mine, key=key))
        deadline = time.monotonic() + settings.rendezvous_timeout_s
        checked = time.monotonic()
        while True:
            with db.read() as session:
                rows = session.execute(
                    select(RankAddress.rank, RankAddress.address).where(
                        RankAddress.job_id == job_id, RankAddress.attempt == attempt
                    )
                )
                seen = {row.rank: row.address for row in rows}
            if all(r in seen for r in range(ranks)):
                return [seen[r] for r in range(ranks)]
            now = time.monotonic()
            if now >= deadline:
                missing = [r for r in range(ranks) if r not in seen]
                raise RendezvousError(
                    f"rank {rank}: ranks {missing} of this job did not start within "
                    f"{settings.rendezvous_timeout_s:.0f} s"
                )
            if now - checked >= 1.0:
                checked = now
                if not still_wanted():
                    raise RendezvousError("the attempt was given up while its ranks met")
            time.sleep(POLL_S)
    except SQLAlchemyError as err:
        raise RendezvousError(f"rank {rank}: the database failed while the ranks met ({type(err).__name__})") from err


def keys(db: Database, job_id: int, attempt: int, ranks: int) -> list[str]:
    """Each rank's secret for the attempt, by rank (after `meet`)."""
    with db.read() as session:
        of_attempt = (RankAddress.job_id == job_id) & (RankAddress.attempt == attempt)
        rows = session.execute(select(RankAddress.rank, RankAddress.key).where(of_attempt))
        found = {row.rank: row.key for row in rows}
    return [found.get(r, "") for r in range(ranks)]
