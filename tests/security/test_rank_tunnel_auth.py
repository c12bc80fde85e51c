"""A sandboxed rank's public port took any connection from a peer host's address and handed
it to the trainer, and TensorFlow's gRPC has no authentication: any process on a peer host
(another member's job with the network, a login shell) reached the trainer's collectives.
Now the peer's worker must answer a fresh challenge with the HMAC of the rank's secret of
the attempt (from the rendezvous) before its connection reaches the trainer."""

from __future__ import annotations

import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from towerq.contract import handshake
from worker.trainer import tunnel


class Rank:
    """A rank's worker side (a real Gate) and a stand-in for its trainer's channels."""

    def __init__(self, rank: int, cluster: list[str], keys: list[str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="towerq-test-rank-"))
        port = int(cluster[rank].rpartition(":")[2])
        self.gate = tunnel.Gate(str(self.folder), ("127.0.0.1", port), cluster, rank, keys)
        self.inbound = self.ask("accept")
        self.gate.ready.wait(5)

    def ask(self, request: str) -> socket.socket:
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        channel.connect(self.gate.path)
        channel.sendall(request.encode() + b"\n")
        return channel

    def handed_in(self, timeout: float) -> socket.socket | None:
        self.inbound.settimeout(timeout)
        try:
            return tunnel.receive_socket(self.inbound)
        except TimeoutError:
            return None

    def close(self) -> None:
        self.inbound.close()
        self.gate.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def ranks() -> Iterator[list[Rank]]:
    cluster = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    keys = [secrets.token_hex(32) for _ in range(2)]
    made = [Rank(r, cluster, keys) for r in range(2)]
    yield made
    for rank in made:
        rank.close()


def test_a_connection_without_the_ranks_secret_never_reaches_its_trainer(ranks: list[Rank]) -> None:
    _, target = ranks
    port = int(target.gate.cluster[1].rpartition(":")[2])
    for answer in (b"", b"x" * 32, tunnel.proof(secrets.token_hex(32), b"\0" * handshake.NONCE_BYTES)):
        intruder = socket.create_connection(("127.0.0.1", port), timeout=5)  # from a peer host's address
        nonce = intruder.recv(handshake.NONCE_BYTES)
        assert len(nonce) == handshake.NONCE_BYTES
        intruder.sendall(answer)
        if not answer:
            intruder.shutdown(socket.SHUT_WR)
        assert target.handed_in(1.5) is None, f"{answer!r} reached the trainer"
        intruder.close()
    assert target.gate.refused == 3


def test_a_peer_rank_that_knows_the_secret_is_piped_through(ranks: list[Rank]) -> None:
    source, target = ranks
    with source.ask("connect 1") as channel:
        outbound = tunnel.receive_socket(channel)
    assert outbound is not None
    inbound = target.handed_in(5)
    assert inbound is not None, "the peer's worker proved the secret, yet nothing was handed in"
    outbound.sendall(b"gradients")
    assert inbound.recv(64) == b"gradients"
    outbound.close()
    inbound.close()
