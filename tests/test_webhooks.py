"""Webhooks through real processes: a job ends, and a local receiver that fails the first
two attempts gets exactly one accepted, signed POST for it (same delivery id each time),
the job's own notify_url gets one too, and the failures are in the job's log. A job that
holds its GPU idle is announced while it runs (`job.idle`)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from service.core.settings import Settings
from tests.conftest import free_port
from tests.stack import Stack, finished, upload_code, wait_for
from tests.test_command_jobs import HOLDS, on_fake_nvml

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
SECRET = "webhook-secret-1"


class Receiver:
    """Records every POST; `/lab` answers 500 to its first `failures` POSTs."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.received: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    seen = [r for r in receiver.received if r["path"] == self.path]
                    status = 500 if self.path == "/lab" and len(seen) < receiver.failures else 200
                    receiver.received.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body, "status": status}
                    )
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posts(self, path: str) -> list[dict]:
        with self.lock:
            return [r for r in self.received if r["path"] == path]


@contextlib.contextmanager
def receiving(failures: int) -> Iterator[Receiver]:
    """A Receiver while the block runs."""
    running = Receiver(failures)
    try:
        yield running
    finally:
        running.server.shutdown()
        running.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(failures=2) as running:
        yield running


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str, receiver: Receiver) -> Settings:
    return make_settings(
        sqlite_url, webhook_url=f"{receiver.url}/lab", webhook_secret=SECRET, webhook_retry_s=0.3,
        public_url="https://towerq.lab.example", webhook_allow="127.0.0.1",
    )  # fmt: skip


def test_a_finished_job_is_announced_once_signed_and_retried(
    stack: Stack, make_token: Callable[..., str], receiver: Receiver
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    bad = client.post("/api/jobs", json={"model": "mlp", "dataset": "digits", "notify_url": "ftp://x"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "notify_url"

    spec = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 30}, "notify_url": f"{receiver.url}/mine"}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "job", 0.5)
    assert job["state"] == "succeeded", job["error"]
    wait_for(lambda: any(r["status"] == 200 for r in receiver.posts("/lab")), 60, "the lab webhook to get through")
    wait_for(lambda: receiver.posts("/mine"), 30, "the job's own webhook")
    time.sleep(2)  # nothing more comes once it got through

    lab = receiver.posts("/lab")
    assert [r["status"] for r in lab] == [500, 500, 200]
    assert len({r["headers"]["X-Towerq-Delivery"] for r in lab}) == 1  # one notification, retried
    for post in lab:
        expected = "sha256=" + hmac.new(SECRET.encode(), post["body"], hashlib.sha256).hexdigest()
        assert post["headers"]["X-Towerq-Signature"] == expected
        assert post["headers"]["X-Towerq-Event"] == "job.finished"
    body = json.loads(lab[-1]["body"])
    assert body["job"]["id"] == job_id and body["job"]["state"] == "succeeded" and body["job"]["user"] == "alice"
    assert body["job"]["final"]["eval_accuracy"] == job["latest"]["eval_accuracy"]
    assert body["job"]["url"] == f"https://towerq.lab.example/#/jobs/{job_id}"
    assert body["text"].startswith(f"towerq: job {job_id} ") and "succeeded" in body["text"]
    assert len(receiver.posts("/mine")) == 1

    detail = client.get(f"/api/jobs/{job_id}").json()
    by_url = {n["url"]: n for n in detail["notifications"]}
    assert by_url[None]["state"] == "delivered" and by_url[None]["attempts"] == 3
    assert by_url[f"{receiver.url}/mine"]["attempts"] == 1
    log = client.get(f"/api/jobs/{job_id}/logs.txt").text
    assert "webhook to 127.0.0.1 failed (attempt 1 of 9): HTTP 500" in log
    assert "webhook to 127.0.0.1 failed (attempt 2 of 9): HTTP 500" in log
    client.close()


def test_a_job_holding_its_gpu_idle_is_announced_while_it_runs(
    stack: Stack, make_token: Callable[..., str], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the fake NVML (tests/fakenvml), a command job holds its GPU and runs no kernel:
    after the lab's warning time (2 s here) its own webhook and the lab's get `job.idle`
    while it runs, once; its end comes after, as `job.finished`."""
    client = on_fake_nvml(stack, monkeypatch, make_token("alice"), gpu_use_sample_s=0.5, gpu_idle_warn_s=2)
    code = upload_code(client, {"hold.py": HOLDS})
    spec = {"code": code, "command": ["python", "hold.py", "16"], "gpu_count": 1, "name": "waits-on-input",
            "env": {"FAKE_GPU_MB": "900"}, "notify_url": f"{receiver.url}/mine"}  # fmt: skip
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    idle = wait_for(lambda: receiver.posts("/mine"), 60, "the job's idle webhook")[0]
    assert client.get(f"/api/jobs/{job_id}").json()["state"] == "running"  # said while it runs
    assert idle["headers"]["X-Towerq-Event"] == "job.idle", idle["headers"]
    body = json.loads(idle["body"])
    assert body["event"] == "job.idle" and body["job"]["idle_since"] is not None, body
    assert (body["job"]["id"], body["job"]["user"], body["job"]["host"], body["job"]["gpu_count"]) == (
        job_id, "alice", "lab-a", 1
    )  # fmt: skip
    said = rf"towerq: job {job_id} 'waits-on-input' of alice \(running on lab-a, 1 GPU\): its GPUs have been idle "
    assert re.match(
        said + r"for \d+s \(busy under 5% at every sample\) <https://towerq\.lab\.example/#/jobs/", body["text"]
    )
    assert finished(client, job_id, 60)["state"] == "succeeded"
    wait_for(lambda: len(receiver.posts("/mine")) == 2, 30, "the job's end")
    assert [r["headers"]["X-Towerq-Event"] for r in receiver.posts("/mine")] == ["job.idle", "job.finished"]
    wait_for(lambda: any(r["status"] == 200 for r in receiver.posts("/lab")), 60, "the lab webhook to get through")
    events = sorted((n["event"], n["url"] is None) for n in client.get(f"/api/jobs/{job_id}").json()["notifications"])
    assert events == [("job.finished", False), ("job.finished", True), ("job.idle", False), ("job.idle", True)]
    client.close()
