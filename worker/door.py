"""A notebook session's socket and door: JupyterLab listens on a unix socket in the
session's own folder (`SOCKET`), which the worker opens without following a link and only
when it is a socket of the session's user (`open_socket`, `ask`); the door (`Door`) is a TCP
port of `TOWERQ_RANK_PORTS` that pipes a connection to that socket once the connection proved
it knows the attempt's secret (`towerq.contract.handshake`, label `LABEL`): the API's proxy.
`worker.notebook` runs the session."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

from worker.trainer import tunnel

SOCKET = "jupyter.sock"
LABEL = "session"
"""The handshake's label for the door (`towerq.contract.handshake`)."""
ASK_TIMEOUT_S = 5.0


def open_socket(folder: Path, owner: int) -> socket.socket:
    """A connection to the session's socket in `folder` (a folder the worker made, in which
    the session may write): the name is opened without following a link, and must be a
    socket that the session's user (`owner`) made; connected through that very file
    (`/proc/self/fd`), so nothing the session renames meanwhile is reached instead. OSError
    otherwise."""
    fd = os.open(folder / SOCKET, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISSOCK(info.st_mode):
            raise OSError(f"{SOCKET} is not a socket")
        if info.st_uid != owner:
            raise OSError(f"{SOCKET} is not the session's (uid {info.st_uid}, not {owner})")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(f"/proc/self/fd/{fd}")
        except OSError:
            sock.close()
            raise
        return sock
    finally:
        os.close(fd)


class _SocketConnection(http.client.HTTPConnection):
    """http.client over the session's socket (`open_socket`)."""

    def __init__(self, folder: Path, owner: int) -> None:
        super().__init__("localhost", timeout=ASK_TIMEOUT_S)
        self._folder, self._owner = folder, owner

    def connect(self) -> None:
        self.sock = open_socket(self._folder, self._owner)
        self.sock.settimeout(self.timeout)


def ask(folder: Path, owner: int, path: str) -> Any:
    """GET `path` of the session's JupyterLab; its JSON answer (OSError, ValueError)."""
    conn = _SocketConnection(folder, owner)
    try:
        conn.request("GET", path, headers={"Host": "localhost"})
        response = conn.getresponse()
        body = response.read(1 << 20)
        if response.status != 200:
            raise OSError(f"{path}: HTTP {response.status}")
        return json.loads(body)
    except http.client.HTTPException as err:
        raise OSError(str(err)) from err
    finally:
        conn.close()


class Door:
    """The session's way in: a TCP listener that pipes each connection, once it proved it
    knows `key`, to the session's socket. It counts what passes: connections open now, and
    when the last one closed."""

    def __init__(self, host: str, port: int, key: str, folder: Path, owner: int) -> None:
        self.key, self.folder, self.owner = key, folder, owner
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.port = int(self.listener.getsockname()[1])
        self.address = f"{host}:{self.port}"
        self.open = 0
        self.last_closed = time.monotonic()
        self.refused = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._serve, name=f"door-{self.address}", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def idle_for(self, now: float) -> float:
        """Seconds since the last connection closed; 0 while one is open."""
        with self._lock:
            return 0.0 if self.open else now - self.last_closed

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                remote, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._admit, args=(remote,), daemon=True).start()

    def _admit(self, remote: socket.socket) -> None:
        if not tunnel.challenge(remote, self.key, LABEL):
            self.refused += 1
            remote.close()
            return
        try:
            inner = open_socket(self.folder, self.owner)
        except OSError:
            remote.close()  # not listening yet (the API says it is starting), or not the session's
            return
        with self._lock:
            self.open += 1
        tunnel.pipe(remote, inner, self._one_closed)

    def _one_closed(self) -> None:
        with self._lock:
            self.open -= 1
            self.last_closed = time.monotonic()
