"""The ranks of a job over several hosts reach each other without the network of their host.

In the sandbox a trainer has no network but its own loopback (`worker.sandbox`), yet its
collective ops must reach the other ranks. Its worker, outside, holds the rank's public
port and a control socket (`CONTROL`, read-only in the sandbox, in a folder the trainer
cannot write); the two pass whole TCP connections by file descriptor (SCM_RIGHTS):

- out: the trainer asks `connect <s>`; the worker connects to rank s's public address (the
  rendezvous's, from the database, never the trainer's word) and hands the socket in;
- in: the trainer asks `accept`; every connection the worker accepts on the public port,
  from one of the other ranks' hosts only, and only once the peer's worker proved it knows
  this rank's secret of the attempt (`worker.rendezvous`: it answers a fresh challenge with
  its HMAC, `towerq.contract.handshake`), is handed in on that channel. TensorFlow's gRPC has
  no authentication of its own: without this, any process on a peer host reached the trainer.

Inside, every rank sees the cluster as `127.0.0.1:<INNER_PORT + r>`: its own TensorFlow
server listens on its own port, and each other rank's port is a local listener that pipes
to the socket the worker handed in. So user code reaches the other ranks of its own job,
through towerq, and nothing else: not Redis, not the database, not other jobs' ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from towerq.contract import handshake

CONTROL = "control.sock"
INNER_PORT = 29400
"""Rank r's TensorFlow server listens on 127.0.0.1:INNER_PORT + r inside its sandbox (its
own network namespace, so no other job's port is there to collide with)."""
CHUNK = 1 << 20
CONNECT_RETRY_S = 60.0


def inner_cluster(size: int) -> list[str]:
    return [f"127.0.0.1:{INNER_PORT + r}" for r in range(size)]


def pipe(a: socket.socket, b: socket.socket, on_close: Callable[[], None] | None = None) -> None:
    """Copy bytes both ways between `a` and `b` until either side closes; then close both
    (and call `on_close`)."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    threads = [threading.Thread(target=copy, args=pair, daemon=True) for pair in ((a, b), (b, a))]
    for thread in threads:
        thread.start()

    def close_after() -> None:
        for thread in threads:
            thread.join()
        a.close()
        b.close()
        if on_close is not None:
            on_close()

    threading.Thread(target=close_after, daemon=True).start()


def send_socket(channel: socket.socket, sock: socket.socket) -> None:
    socket.send_fds(channel, [b"s"], [sock.fileno()])
    sock.close()


def receive_socket(channel: socket.socket) -> socket.socket | None:
    """The next socket handed in on `channel`, or None when it closed."""
    message, fds, _, _ = socket.recv_fds(channel, 1, 1)
    if not message or not fds:
        return None
    sock = socket.socket(fileno=fds[0])
    sock.setblocking(True)  # the flag belongs to the connection, shared with the sender's copy
    return sock


# -- inside the sandbox (the trainer) --------------------------------------------------------


def open_inside(control: str, rank: int, size: int, timeout_s: float = 30.0) -> list[str]:
    """Start the trainer's side in a process of its own (TensorFlow holds the interpreter's
    lock while its cluster starts, so threads of the trainer would never pipe a byte of it);
    returns the cluster the trainer's TensorFlow must use. The process is the trainer's
    child in its sandbox, and ends with it."""
    command = [sys.executable, "-m", "worker.trainer.tunnel", control, str(rank), str(size)]
    helper = subprocess.Popen(  # not on the trainer's stderr: it must not hold the worker's pipe open
        command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    assert helper.stdout is not None
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(helper.stdout.readline() if helper.stdout else ""))
    reader.start()
    reader.join(timeout_s)
    if not ready or ready[0].strip() != "ready":
        helper.kill()
        raise OSError(f"the way to the other ranks did not open (exit code {helper.poll()})")
    return inner_cluster(size)


def serve_inside(control: str, rank: int, size: int) -> None:
    """The helper process: a listener for each other rank, and the channel of the connections
    they open to this one. A stop (SIGTERM to the trainer's process group) is not for it: the
    ranks still agree to stop and rank 0 checkpoints through it; it ends with the sandbox."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for peer in range(size):
        if peer != rank:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", INNER_PORT + peer))
            listener.listen(64)
            threading.Thread(target=_serve_out, args=(listener, control, peer), daemon=True).start()
    channel = _ask(control, "accept")
    print("ready", flush=True)
    _serve_in(channel, INNER_PORT + rank)


def _ask(control: str, request: str) -> socket.socket:
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    channel.connect(control)
    channel.sendall(request.encode() + b"\n")
    return channel


def _serve_out(listener: socket.socket, control: str, peer: int) -> None:
    while True:
        local, _ = listener.accept()
        try:
            with _ask(control, f"connect {peer}") as channel:
                remote = receive_socket(channel)
        except OSError:
            remote = None
        if remote is None:
            local.close()  # the worker could not reach that rank: TensorFlow sees it unavailable
            continue
        pipe(local, remote)


def _serve_in(channel: socket.socket, own_port: int) -> None:
    while (remote := receive_socket(channel)) is not None:
        deadline = time.monotonic() + CONNECT_RETRY_S
        while True:  # the own server may not listen yet
            try:
                local = socket.create_connection(("127.0.0.1", own_port), timeout=5)
                local.settimeout(None)
                break
            except OSError:
                if time.monotonic() > deadline:
                    remote.close()
                    local = None
                    break
                time.sleep(0.05)
        if local is not None:
            pipe(remote, local)


# -- outside (the worker) ---------------------------------------------------------------------


LABEL = "rank"
"""What the handshake's proof is for (`towerq.contract.handshake`)."""


def proof(key: str, nonce: bytes) -> bytes:
    """What a peer's worker answers to `nonce` to show it knows the rank's `key`."""
    return handshake.proof(key, nonce, LABEL)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def prove(sock: socket.socket, key: str, label: str = LABEL) -> None:
    """The connecting side: answer the rank's challenge (OSError when it gives none)."""
    sock.settimeout(handshake.AUTH_TIMEOUT_S)
    nonce = _receive_exactly(sock, handshake.NONCE_BYTES)
    if len(nonce) != handshake.NONCE_BYTES:
        raise OSError("the rank gave no challenge")
    sock.sendall(handshake.proof(key, nonce, label))
    sock.settimeout(None)


def challenge(sock: socket.socket, key: str, label: str = LABEL) -> bool:
    """The accepting side: whether the peer proved it knows `key` in time (for connections
    of kind `label`)."""
    nonce = os.urandom(handshake.NONCE_BYTES)
    try:
        sock.settimeout(handshake.AUTH_TIMEOUT_S)
        sock.sendall(nonce)
        answer = _receive_exactly(sock, handshake.PROOF_BYTES)
        sock.settimeout(None)
    except OSError:
        return False
    return handshake.proven(key, nonce, label, answer)


class Gate:
    """The worker's side for one rank: the public port and the control socket. `keys` are
    every rank's secrets of the attempt, by rank (`worker.rendezvous.keys`)."""

    def __init__(self, folder: str, listen: tuple[str, int], cluster: list[str], rank: int, keys: list[str]) -> None:
        self.cluster = cluster
        self.rank = rank
        self.keys = keys
        self.allowed = {_host_ip(address) for r, address in enumerate(cluster) if r != rank}
        self.public = socket.socket()
        self.public.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.public.bind(listen)
        self.public.listen(64)
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.path = f"{folder}/{CONTROL}"
        self.control.bind(self.path)
        self.control.listen(64)
        self.inbound: socket.socket | None = None
        self.ready = threading.Event()
        self.closed = threading.Event()
        self.refused = 0
        """Connections to the public port from hosts that run no other rank of this attempt."""
        for target in (self._serve_control, self._serve_public):
            threading.Thread(target=target, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.public, self.control, self.inbound):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _serve_control(self) -> None:
        while not self.closed.is_set():
            try:
                channel, _ = self.control.accept()
            except OSError:
                return
            threading.Thread(target=self._request, args=(channel,), daemon=True).start()

    def _request(self, channel: socket.socket) -> None:
        request = _read_line(channel)
        if request == "accept" and self.inbound is None:
            self.inbound = channel
            self.ready.set()
            return
        words = request.split()
        if len(words) == 2 and words[0] == "connect" and words[1].isdigit():
            peer = int(words[1])
            if peer != self.rank and peer < len(self.cluster):
                host, _, port = self.cluster[peer].rpartition(":")
                with contextlib.suppress(OSError):
                    remote = socket.create_connection((host, int(port)), timeout=10)
                    try:
                        prove(remote, self.keys[peer])
                    except OSError:
                        remote.close()
                        raise
                    send_socket(channel, remote)
        channel.close()

    def _serve_public(self) -> None:
        while not self.closed.is_set():
            try:
                remote, (ip, _) = self.public.accept()
            except OSError:
                return
            if ip not in self.allowed:
                self.refused += 1
                remote.close()
                continue
            threading.Thread(target=self._admit, args=(remote,), daemon=True).start()

    def _admit(self, remote: socket.socket) -> None:
        """Hand `remote` in once its worker proved it knows this rank's secret."""
        if not challenge(remote, self.keys[self.rank]):
            self.refused += 1
            remote.close()
            return
        if not self.ready.wait(CONNECT_RETRY_S) or self.inbound is None:
            remote.close()
            return
        try:
            send_socket(self.inbound, remote)
        except OSError:
            remote.close()


def _read_line(channel: socket.socket, limit: int = 64) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = channel.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("ascii", errors="replace").strip()


def _host_ip(address: str) -> str:
    host = address.rpartition(":")[0]
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


if __name__ == "__main__":
    serve_inside(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
