"""The Python client's retries against a real HTTP server that answers a gateway error
first (`towerq.client.RETRY_STATUSES`): a retried upload sends the whole file again (httpx
rewinds a file it sends; the CLI's image folder is a file on disk since it is packed there,
`towerq.cli.transfer.run_data_upload`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from towerq import Client


class Gateway(BaseHTTPRequestHandler):
    """503 to the first request, then the size of each body it is sent."""

    bodies: list[bytes]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append(body)
        if len(self.bodies) == 1:
            self.send_response(503)
            self.end_headers()
            return
        answer = json.dumps({"name": "cells", "size": len(body), "dataset": "npz:users/alice/cells/data.npz"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[bytes]]]:
    Gateway.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", Gateway.bodies
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_retried_dataset_upload_sends_the_whole_file_again(gateway: tuple[str, list[bytes]], tmp_path: Path) -> None:
    url, bodies = gateway
    data = tmp_path / "cells.npz"
    data.write_bytes(b"npz" * 100_000)
    with Client(url, "tq_x", retries=2) as client, data.open("rb") as file:
        client.upload_dataset("cells", "cells.npz", file)
    assert len(bodies) == 2, "one 503, then the retry"
    assert all(data.read_bytes() in body for body in bodies), "the retry sent all of it, not what the first left"
