"""A member's `notify_url` as a probe: the scheduler's host posted to loopback, link-local
and LAN addresses for anyone, each failure's text in a log every member reads, and waited
on a receiver that drips its answer as long as it liked. Now such addresses are refused
(at submit when written as addresses, when sent when a name resolves to one) unless an
admin allows them, the request goes to the address that was checked, and one attempt has
a deadline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from service.core.context import Context
from service.core.settings import Settings
from service.notifications import outbound
from service.notifications.webhooks import Deliverer
from tests.conftest import free_port
from tests.service.api.conftest import Api

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0]}


class Listener:
    """A TCP server on loopback that counts connections and answers like `answer` says:
    `ok` (HTTP 200) or `drip` (a status line, then nothing)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.connections = 0
        self.socket = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.socket.getsockname()[1]
        self.open: list[socket.socket] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            self.open.append(connection)
            connection.recv(65536)
            if self.answer == "ok":
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            else:
                connection.sendall(b"HTTP/1.1 200 OK\r\n")  # and never the rest

    def close(self) -> None:
        self.socket.close()
        for connection in self.open:
            connection.close()


@pytest.fixture
def listener() -> Iterator[Callable[[str], Listener]]:
    made: list[Listener] = []

    def make(answer: str) -> Listener:
        made.append(Listener(answer))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:6379/", "http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/", "http://[::1]:8000/",
     "http://[::ffff:127.0.0.1]/", "http://0.0.0.0:5432/",
     # IPv6 forms that carry a private IPv4 address: IPv4-compatible, NAT64, 6to4, NAT64 local-use
     "http://[::127.0.0.1]/", "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::]/",
     "http://[2002:7f00:1::1]:6379/", "http://[64:ff9b:1::a00:1]/"],
)  # fmt: skip
def test_a_private_address_is_refused_at_submit(alice: Api, url: str) -> None:
    refused = alice.post("/api/jobs", json={**SPEC, "notify_url": url})
    assert refused.status_code == 422, refused.text
    assert "notify_url" in str(refused.json()["detail"]) and "TOWERQ_WEBHOOK_ALLOW" in str(refused.json()["detail"])
    sweep = {"name": "probe", "base": SPEC, "grid": {"hyperparameters.learning_rate": [0.1]}, "notify_url": url}
    refused = alice.post("/api/sweeps", json=sweep)
    assert refused.status_code == 422 and "TOWERQ_WEBHOOK_ALLOW" in refused.text, refused.text


@pytest.mark.parametrize("url", ["http://0\uccc2|a0\u00a3]x", "http://host:99999/"])
def test_a_url_without_a_readable_host_is_refused_not_a_500(alice: Api, url: str) -> None:
    """Found by schemathesis on a sweep: urlsplit raises on these, and the check answered 500."""
    for path, body in (
        ("/api/jobs", {**SPEC, "notify_url": url}),
        ("/api/sweeps", {"name": "probe", "base": SPEC, "grid": {"hyperparameters.seed": [1]}, "notify_url": url}),
    ):
        refused = alice.post(path, json=body)
        assert refused.status_code == 422 and "not a URL with a host" in refused.text, (path, refused.text)


def test_a_name_that_resolves_to_loopback_is_refused_when_sent(
    settings: Settings, listener: Callable[[str], Listener]
) -> None:
    target = listener("ok")
    ctx = Context.open(settings)
    try:
        deliverer = Deliverer(ctx, threading.Event())
        said = deliverer.post(f"http://localhost:{target.port}/hook", b"{}", {}, checked=True)
        assert said is not None and said.startswith("refused: localhost is not a public address"), said
        assert target.connections == 0
        lab = ctx.settings.model_copy(update={"webhook_allow": "localhost"})
        allowed = Deliverer(Context(settings=lab, db=ctx.db, redis=ctx.redis), threading.Event())
        assert allowed.post(f"http://localhost:{target.port}/hook", b"{}", {}, checked=True) is None
        assert target.connections == 1
    finally:
        ctx.close()


def test_a_dripping_receiver_holds_an_attempt_no_longer_than_its_deadline(
    settings: Settings, listener: Callable[[str], Listener]
) -> None:
    target = listener("drip")
    ctx = Context.open(settings)
    try:
        started = time.monotonic()
        said = Deliverer(ctx, threading.Event(), deadline_s=1.0).post(
            f"http://127.0.0.1:{target.port}/", b"{}", {}, checked=False
        )
        assert said == "no answer within 1 s" and time.monotonic() - started < 5, said
    finally:
        ctx.close()


def test_a_webhook_url_is_shown_only_to_its_owner_and_admins(
    alice: Api, as_user: Callable[..., Api], settings: Settings
) -> None:
    hook = "https://hooks.slack.com/services/T000/B000/secret-part"
    job_id = alice.post("/api/jobs", json={**SPEC, "notify_url": hook}).json()["id"]
    assert alice.get(f"/api/jobs/{job_id}").json()["spec"]["notify_url"] == hook
    assert as_user("root", admin=True).get(f"/api/jobs/{job_id}").json()["spec"]["notify_url"] == hook
    bob = as_user("bob")
    assert hook not in bob.get(f"/api/jobs/{job_id}").text
    assert hook not in bob.get("/api/jobs").text
    assert bob.get(f"/api/jobs/{job_id}").json()["spec"]["notify_url"].startswith("(hidden")


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::6810:85e5", "64:ff9b::808:808", "2002:808:808::1"])
def test_a_public_address_and_its_ipv6_forms_stay_allowed(address: str) -> None:
    assert outbound.check_url(f"http://[{address}]/" if ":" in address else f"http://{address}/", "") is None
