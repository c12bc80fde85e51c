"""A notebook session's way in (`worker.door.Door`, `service.api.routes.sessions`).

The session's JupyterLab is the member's: it listens on a socket in a folder the session
writes, so the session may put anything there in its socket's place, and it sees every
request proxied to it. Attacks: reach the door without the attempt's secret (or with a
rank's proof); make the door connect to another socket (a link in the socket's place, a
socket of another user); read the visitor's towerq login from a proxied request (the
`Authorization` header, the session cookie); set the visitor's towerq cookie; have a
session's page call towerq's API with the visitor's login (the page's policy)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import secrets
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.core.db import Database
from service.core.models import RankAddress
from tests.service.api.conftest import Api
from worker.door import LABEL, SOCKET, Door
from worker.trainer import tunnel


class _Echo(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Headers(http.server.BaseHTTPRequestHandler):
    """What the member's server saw of a request, as JSON; it also tries to set towerq's cookie."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"path": self.path, "headers": dict(self.headers.items())}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "towerq_token=the-members-token; Path=/")
        self.send_header("Set-Cookie", "_xsrf=jupyters; Path=/sessions/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def unix_server(path: Path, handler: type[socketserver.BaseRequestHandler]) -> Iterator[None]:
    server = _Echo(str(path), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


class _Says(socketserver.BaseRequestHandler):
    said = b"the session's server"

    def handle(self) -> None:
        self.request.sendall(self.said)


class _Secret(_Says):
    said = b"some other socket of the host"


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp") as name:  # a socket's path is at most 108 bytes
        yield Path(name)


def through(door: Door, key: str, label: str = LABEL) -> bytes:
    host, _, port = door.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            tunnel.prove(sock, key, label)
            sock.settimeout(5)
            return sock.recv(100)
        except OSError:
            return b""


def test_the_door_lets_in_only_who_proves_the_attempts_secret(folder: Path) -> None:
    key = secrets.token_hex(32)
    with unix_server(folder / SOCKET, _Says):
        door = Door("127.0.0.1", 0, key, folder, os.geteuid())
        try:
            assert through(door, key) == _Says.said
            assert through(door, secrets.token_hex(32)) == b""
            assert through(door, key, label="rank") == b"", "a rank's proof opens no session"
            host, _, port = door.address.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.recv(32)
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 32)  # no proof, a request
                sock.settimeout(5)
                with contextlib.suppress(ConnectionResetError):  # closed with the request unread
                    assert sock.recv(100) == b""
            assert door.refused == 3
        finally:
            door.close()


def test_the_door_reaches_only_a_socket_of_the_session_never_through_a_link(folder: Path, tmp_path: Path) -> None:
    key = secrets.token_hex(32)
    other = Path(tempfile.mkdtemp(dir="/tmp")) / "other.sock"
    with unix_server(other, _Secret):
        door = Door("127.0.0.1", 0, key, folder, os.geteuid())
        try:
            (folder / SOCKET).symlink_to(other)  # the session's link to a socket it cannot reach itself
            assert through(door, key) == b""
            (folder / SOCKET).unlink()
            (folder / SOCKET).write_text("not a socket")
            assert through(door, key) == b""
            (folder / SOCKET).unlink()
            with unix_server(folder / SOCKET, _Says):
                assert through(door, key) == _Says.said
                if os.geteuid() == 0:  # a socket of another user in its place
                    os.chown(folder / SOCKET, 54321, 54321)
                    assert through(door, key) == b""
        finally:
            door.close()
            other.unlink(missing_ok=True)
            other.parent.rmdir()


def test_the_proxy_sends_the_session_no_towerq_login_and_keeps_its_page_to_its_path(
    as_user: Callable[..., Api], add_host: Callable[..., None], set_job: Callable[..., None], db: Database,
    folder: Path,
) -> None:  # fmt: skip
    add_host("lab-a", 2)
    alice = as_user("alice")
    created = alice.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert alice.get(f"/sessions/{job_id}/api/status").status_code == 503  # queued: not open yet
    key = secrets.token_hex(32)
    with unix_server(folder / SOCKET, _Headers):
        door = Door("127.0.0.1", 0, key, folder, os.geteuid())
        try:
            set_job(job_id, state="running")
            with db.write() as session:
                session.add(RankAddress(job_id=job_id, attempt=1, rank=0, address=door.address, key=key))
            token = alice.headers["Authorization"].split()[1]
            answer = alice.client.get(
                f"/sessions/{job_id}/api/status?x=1",
                headers={"Authorization": f"Bearer {token}", "Cookie": f"towerq_token={token}; _xsrf=abc"},
            )
            assert answer.status_code == 200, answer.text
            seen = {name.lower(): value for name, value in answer.json()["headers"].items()}
            assert answer.json()["path"] == f"/sessions/{job_id}/api/status?x=1"
            assert "authorization" not in seen and token not in json.dumps(seen), seen
            assert seen["cookie"] == "_xsrf=abc"
            cookies = answer.headers.get_list("set-cookie")
            assert not any(c.startswith("towerq_token") for c in cookies) and any("_xsrf" in c for c in cookies)
            policy = answer.headers["content-security-policy"]
            assert f"connect-src http://testserver/sessions/{job_id}/ ws://testserver/sessions/{job_id}/;" in policy
            assert "object-src 'none'" in policy and answer.headers["cross-origin-opener-policy"] == "same-origin"

            bob = as_user("bob")
            assert bob.get(f"/sessions/{job_id}/api/status").status_code == 403
            assert alice.client.get(f"/sessions/{job_id}/api/status").status_code == 401
            page = alice.client.get(f"/sessions/{job_id}/lab", headers={"Accept": "text/html"})
            assert page.status_code == 401 and "Log in to towerq first" in page.text, page.text
            assert as_user("root", admin=True).get(f"/sessions/{job_id}/api/status").status_code == 200
        finally:
            door.close()
    set_job(job_id, state="succeeded")
    assert alice.get(f"/sessions/{job_id}/api/status").status_code == 409
