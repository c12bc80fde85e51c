"""A member's outputs are theirs: any member could download every job's artifacts, log and
code bundle (a bundle's id is in every job's spec), so a model trained on a member's
private data left with anyone. The job list, specs and charts stay shared; the log,
artifacts and code are the owner's (and admins') unless the job says `visibility: lab`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import redis

from service.api.routes.stream import _without_error_text
from service.core import keys
from service.core.db import Database
from service.core.lifecycle import record_state
from service.core.models import Job, JobState, LogLine, utcnow
from service.core.publish import Publisher
from service.core.settings import Settings
from service.notifications.webhooks import payload
from tests.service.api.conftest import Api
from tests.stack import Stack
from towerq.contract.messages import StateMessage, encode
from towerq.contract.paths import job_folder, job_log

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0]}
NET = b"import keras\n\ndef build(params):\n    return keras.Sequential([keras.layers.Dense(3)])\n"
OUTPUTS = [
    "/artifacts",
    "/artifacts.tar.gz",
    "/artifacts/model.keras",
    "/artifacts/checkpoints",
    "/logs.txt",
    "/logs",
    "/tensorboard.tar.gz",
]


@pytest.fixture
def alices_job(as_user: Callable[..., Api], add_host: Callable[..., None], settings: Settings, db: Database) -> int:
    add_host("lab-a", 2)
    job_id: int = as_user("alice").post("/api/jobs", json=SPEC).json()["id"]
    folder = job_folder(settings.artifacts_dir, job_id)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-1.index").write_bytes(b"weights")
    (folder / "model.keras").write_bytes(b"the trained model")
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events.out.tfevents.1.lab-a").write_bytes(b"alice's curves")
    log = job_log(settings.artifacts_dir, job_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("2026-11-25T10:00:00.000000Z attempt 1 info    trained on users/alice/cells\n")
    with db.write() as session:
        session.add(LogLine(job_id=job_id, attempt=1, level="info", message="secret", time=datetime.now(UTC)))
    return job_id


@pytest.mark.parametrize("output", OUTPUTS)
def test_another_member_cannot_read_a_private_jobs_outputs(
    as_user: Callable[..., Api], alices_job: int, output: str
) -> None:
    refused = as_user("bob").get(f"/api/jobs/{alices_job}{output}")
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"].startswith(f"job {alices_job}'s log and artifacts are private to alice")
    assert f"towerq share {alices_job}" in refused.json()["detail"]


def test_the_list_the_spec_and_the_charts_stay_shared(as_user: Callable[..., Api], alices_job: int) -> None:
    bob = as_user("bob")
    assert [job["id"] for job in bob.get("/api/jobs").json()["items"]] == [alices_job]
    shown = bob.get(f"/api/jobs/{alices_job}").json()
    assert shown["spec"]["model"] == "mlp" and shown["outputs_readable"] is False
    assert bob.get(f"/api/jobs/{alices_job}/metrics").status_code == 200


def test_the_owner_and_admins_read_everything(as_user: Callable[..., Api], alices_job: int) -> None:
    for reader in (as_user("alice"), as_user("root", admin=True)):
        assert reader.get(f"/api/jobs/{alices_job}").json()["outputs_readable"] is True
        for output in OUTPUTS:
            assert reader.get(f"/api/jobs/{alices_job}{output}").status_code == 200, output


def test_a_job_shared_with_the_lab_is_readable_by_every_member(as_user: Callable[..., Api], alices_job: int) -> None:
    alice, bob = as_user("alice"), as_user("bob")
    assert bob.patch(f"/api/jobs/{alices_job}", json={"visibility": "lab"}).status_code == 403
    shared = alice.patch(f"/api/jobs/{alices_job}", json={"visibility": "lab"})
    assert shared.status_code == 200 and shared.json()["spec"]["visibility"] == "lab"
    assert bob.get(f"/api/jobs/{alices_job}/artifacts/model.keras").content == b"the trained model"
    assert alice.patch(f"/api/jobs/{alices_job}", json={"visibility": "private"}).status_code == 200
    assert bob.get(f"/api/jobs/{alices_job}/logs.txt").status_code == 403


def test_a_code_bundle_is_read_by_its_uploaders_and_the_readers_of_its_jobs(
    as_user: Callable[..., Api], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    alice, bob = as_user("alice"), as_user("bob")
    bundle = alice.post("/api/code", files={"file": ("net.py", NET)}).json()["id"]
    spec = {**SPEC, "model": "net:build", "code": bundle}
    job_id = alice.post("/api/jobs", json=spec).json()["id"]
    for path in (f"/api/code/{bundle}", f"/api/code/{bundle}/files/net.py", f"/api/code/{bundle}?job={job_id}"):
        refused = bob.get(path)
        assert refused.status_code == 403 and "private to the members who uploaded it" in refused.text, path
    stolen = bob.post("/api/jobs", json=spec)
    assert stolen.status_code == 422 and stolen.json()["detail"][0]["msg"].startswith("code: "), stolen.text
    assert alice.get(f"/api/code/{bundle}/files/net.py").content == NET
    alice.patch(f"/api/jobs/{job_id}", json={"visibility": "lab"})
    assert bob.get(f"/api/code/{bundle}/files/net.py?job={job_id}").content == NET
    assert bob.get(f"/api/code/{bundle}/files/net.py").status_code == 403  # only through the shared job
    again = bob.post("/api/code", files={"file": ("net.py", NET)})  # the same code: now his too
    assert again.status_code == 200 and again.json()["id"] == bundle
    assert bob.post("/api/jobs", json=spec).status_code == 201


@pytest.mark.browser
@pytest.mark.slow
def test_the_job_page_says_whose_outputs_are_private_instead_of_showing_them(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api(api_workers=1)
    add_host("lab-a", 2)
    alice, bob = make_token("alice"), make_token("bob")
    owner = stack.client(alice)
    bundle = owner.post("/api/code", files={"file": ("net.py", NET)}).json()["id"]
    job_id = owner.post("/api/jobs", json={**SPEC, "model": "net:build", "code": bundle}).json()["id"]

    page = open_page()
    refused: list[str] = []
    page.on("response", lambda response: refused.append(response.url) if response.status == 403 else None)
    page.goto(f"{url}/#token={bob}")
    page.wait_for_selector("#who:has-text('bob')")
    page.goto(f"{url}/#/jobs/{job_id}")
    notes = page.locator(".private-note")
    notes.first.wait_for()
    texts = notes.all_inner_texts()
    assert [text.split(" private")[0] for text in texts] == ["The code is", "The artifacts are", "The log is"]
    assert all(f"private to alice (and admins); they can share them with towerq share {job_id}" in t for t in texts)
    assert page.locator("#download-all").count() == 0 and refused == [], refused
    # No stray null where a bundle is missing (the spec's own JSON has nulls of its own).
    shown = page.locator("main").inner_text().replace(page.locator("pre.spec").inner_text(), "")
    assert "null" not in shown.split()

    mine = open_page()
    mine.goto(f"{url}/#token={alice}")
    mine.wait_for_selector("#who:has-text('alice')")
    mine.goto(f"{url}/#/jobs/{job_id}")
    mine.locator("#code a.mono:has-text('net.py')").wait_for()
    assert mine.locator(".private-note").count() == 0


PRIVATE_ERROR = "ValueError: reading private dataset row: patient=Jane Doe <!channel>"


def test_a_private_jobs_error_is_a_category_to_other_members(
    as_user: Callable[..., Api], alices_job: int, db: Database
) -> None:
    """A private job's `error` (the trainer's own words) was shown to every member: bob read
    "reading private dataset row: patient=Jane Doe…" where its log gave him 403."""
    with db.write() as session:
        job = session.get(Job, alices_job)
        assert job is not None
        job.error = PRIVATE_ERROR
        record_state(session, job, JobState.FAILED, PRIVATE_ERROR)
    bob, alice = as_user("bob"), as_user("alice")
    listed = bob.get("/api/jobs").json()["items"][0]
    shown = bob.get(f"/api/jobs/{alices_job}").json()
    for seen in (listed["error"], listed["reason"], shown["error"], shown["reason"], shown["events"][-1]["message"]):
        assert seen == "failed: trainer error (the details are its owner's)", seen
    assert "Jane Doe" not in bob.get(f"/api/jobs/{alices_job}").text
    assert alice.get(f"/api/jobs/{alices_job}").json()["error"] == PRIVATE_ERROR
    assert as_user("root", admin=True).get("/api/jobs").json()["items"][0]["error"] == PRIVATE_ERROR
    alice.patch(f"/api/jobs/{alices_job}", json={"visibility": "lab"})
    assert bob.get(f"/api/jobs/{alices_job}").json()["error"] == PRIVATE_ERROR  # shared: its words too


def test_the_lab_webhook_says_a_private_jobs_error_as_a_category_and_escaped(
    as_user: Callable[..., Api], alices_job: int, db: Database
) -> None:
    with db.write() as session:
        job = session.get(Job, alices_job)
        assert job is not None
        job.error, job.name = PRIVATE_ERROR, "<!here> run"
        lab, own = payload(job, 1, "http://lab", lab_wide=True), payload(job, 1, "http://lab")
        encoded = encode(StateMessage(job_id=job.id, state="failed", attempt=1, message=PRIVATE_ERROR, time=utcnow()))
    assert "Jane Doe" not in json.dumps(lab) and lab["job"]["reason"].startswith("failed: trainer error")
    assert own["job"]["reason"] == PRIVATE_ERROR  # the job's own notify_url: its owner's
    assert "<!" not in lab["text"] and "<!" not in own["text"].rpartition(" <http")[0]
    assert "&lt;!here&gt;" in own["text"]
    assert "Jane Doe" not in _without_error_text(encoded)


def test_the_lab_wide_state_channel_carries_a_failed_jobs_category_only(redis_client: redis.Redis) -> None:
    """Every member's `/api/stream` reads it; the job's own channel keeps the words (its
    stream hides them from those who may not read its outputs)."""
    listener = redis_client.pubsub()
    listener.subscribe(keys.JOBS_CHANNEL, keys.job_channel(7))
    assert listener.get_message(timeout=2) and listener.get_message(timeout=2)  # both subscribed
    failed = StateMessage(job_id=7, state="failed", attempt=1, message=PRIVATE_ERROR, time=utcnow())
    Publisher(redis_client).publish([failed], kick=False)
    got = {m["channel"].decode(): m["data"].decode() for m in (listener.get_message(timeout=2) for _ in range(2)) if m}
    listener.close()
    assert "Jane Doe" not in got[keys.JOBS_CHANNEL] and "trainer error" in got[keys.JOBS_CHANNEL]
    assert "Jane Doe" in got[keys.job_channel(7)]


def test_a_member_mints_a_capped_number_of_live_tokens(
    as_user: Callable[..., Api], settings: Settings, db: Database
) -> None:
    bob = as_user("bob")  # one live token already
    made = [bob.post("/api/users/bob/tokens", json={"name": f"t{i}"}) for i in range(settings.max_tokens_per_member)]
    assert [r.status_code for r in made[:-1]] == [201] * (settings.max_tokens_per_member - 1)
    assert made[-1].status_code == 429 and "TOWERQ_MAX_TOKENS_PER_MEMBER" in made[-1].json()["detail"]
    assert bob.delete(f"/api/tokens/{made[0].json()['id']}").status_code == 200
    assert bob.post("/api/users/bob/tokens", json={"name": "after a revoke"}).status_code == 201
