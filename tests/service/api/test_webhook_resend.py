"""A failed webhook delivery sent again (`POST /api/jobs/{id}/notifications/{n}/resend`):
the job's receiver fails every attempt until the delivery gives up, is mended, and the
job's owner sends it again: it gets through at once with the same delivery number. Only
the owner or an admin may; only a failed delivery; only the job's own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from service.core.context import Context
from service.core.settings import Settings
from service.notifications.webhooks import MAX_ATTEMPTS, Deliverer
from tests.service.api.conftest import Api
from tests.test_webhooks import Receiver, receiving

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 10}}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str) -> Settings:
    return make_settings(database_url, webhook_allow="127.0.0.1", webhook_retry_s=0.0001)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(failures=MAX_ATTEMPTS) as running:  # `/lab` fails every attempt of the first sending
        yield running


def deliver_until(ctx: Context, done: Callable[[], bool]) -> None:
    deliverer = Deliverer(ctx, threading.Event())
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "the deliveries did not settle"
        deliverer.deliver_due()


def test_a_failed_delivery_is_sent_again_by_its_owner_with_its_number(
    settings: Settings, alice: Api, as_user: Callable[..., Api], receiver: Receiver
) -> None:
    job_id = alice.post("/api/jobs", json={**SPEC, "notify_url": f"{receiver.url}/lab"}).json()["id"]
    other = alice.post("/api/jobs", json={**SPEC, "notify_url": f"{receiver.url}/other"}).json()["id"]
    for job in (job_id, other):
        assert alice.post(f"/api/jobs/{job}/cancel").status_code == 202  # queued: cancelled now, owed job.finished

    def webhook(job: int) -> dict:
        return alice.get(f"/api/jobs/{job}").json()["notifications"][0]

    ctx = Context.open(settings)
    try:
        deliver_until(ctx, lambda: webhook(job_id)["state"] == "failed" and webhook(other)["state"] == "delivered")
        failed = webhook(job_id)
        assert failed["attempts"] == MAX_ATTEMPTS and failed["last_error"] == "HTTP 500", failed
        assert len(receiver.posts("/lab")) == MAX_ATTEMPTS
        delivery = failed["id"]
        path = f"/api/jobs/{job_id}/notifications/{delivery}/resend"

        refused = as_user("bob").post(path)
        assert refused.status_code == 403 and "only they or an admin may send its webhooks again" in refused.text
        missing = alice.post(f"/api/jobs/{job_id}/notifications/{webhook(other)['id']}/resend")  # another job's
        assert missing.status_code == 404 and f"job {job_id} has no webhook delivery" in missing.text, missing.text
        assert alice.post(f"/api/jobs/{job_id}/notifications/999999/resend").status_code == 404
        got_through = alice.post(f"/api/jobs/{other}/notifications/{webhook(other)['id']}/resend")
        assert got_through.status_code == 409 and "only a failed one is sent again (it got through)" in got_through.text

        again = alice.post(path)  # the receiver is mended: its next POST gets 200
        assert again.status_code == 202, again.text
        pending = next(n for n in again.json()["notifications"] if n["id"] == delivery)
        assert (pending["state"], pending["attempts"]) == ("pending", 0), pending
        assert alice.post(path).status_code == 409  # on its way: not twice
        deliver_until(ctx, lambda: webhook(job_id)["state"] == "delivered")
        posts = receiver.posts("/lab")
        assert [p["status"] for p in posts[MAX_ATTEMPTS:]] == [200] and webhook(job_id)["attempts"] == 1
        assert {p["headers"]["X-Towerq-Delivery"] for p in posts} == {str(delivery)}  # the one it missed
        assert posts[-1]["body"] == posts[0]["body"]
    finally:
        ctx.close()


def test_an_admin_sends_a_members_failed_delivery_again(
    settings: Settings, alice: Api, as_user: Callable[..., Api], receiver: Receiver
) -> None:
    job_id = alice.post("/api/jobs", json={**SPEC, "notify_url": f"{receiver.url}/lab"}).json()["id"]
    alice.post(f"/api/jobs/{job_id}/cancel")
    ctx = Context.open(settings)
    try:
        deliver_until(ctx, lambda: alice.get(f"/api/jobs/{job_id}").json()["notifications"][0]["state"] == "failed")
    finally:
        ctx.close()
    delivery = alice.get(f"/api/jobs/{job_id}").json()["notifications"][0]["id"]
    sent = as_user("root", admin=True).post(f"/api/jobs/{job_id}/notifications/{delivery}/resend")
    assert sent.status_code == 202 and sent.json()["notifications"][0]["state"] == "pending", sent.text
