"""An upload without a valid token is refused before its body is read: FastAPI reads a
multipart body (to temporary files, up to the 20 GB dataset quota) before any dependency
checks the token, so anyone who reaches the API could fill its disk, one connection at a
time, before hearing 401."""

from __future__ import annotations

import socket
from collections.abc import Callable
from urllib.parse import urlparse

import pytest

from service.core.settings import Settings
from tests.stack import Stack

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.mark.parametrize("path", ["/api/datasets", "/api/code"])
@pytest.mark.parametrize("token", [None, "tq_not_a_token"])
def test_an_unauthenticated_upload_hears_401_before_sending_its_body(
    stack: Stack, path: str, token: str | None
) -> None:
    url = urlparse(stack.start_api())
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {url.netloc}",
        "Content-Type: multipart/form-data; boundary=xyz",
        "Content-Length: 10000000",  # 10 MB announced; a few bytes sent
        *([f"Authorization: Bearer {token}"] if token else []),
    ]
    with socket.create_connection((url.hostname, url.port), timeout=5) as connection:
        connection.sendall(("\r\n".join(head) + "\r\n\r\n--xyz\r\n").encode())
        try:
            answer = connection.recv(4096).decode(errors="replace")
        except TimeoutError:
            pytest.fail("the API waited for the body of an upload it should have refused")
    assert answer.startswith("HTTP/1.1 401"), answer
