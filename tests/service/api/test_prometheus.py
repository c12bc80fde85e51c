"""`GET /metrics` in Prometheus text, parsed with Prometheus' own parser: what the lab's
jobs and GPUs are, by state, user and host, from the shared database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from service.core.db import Database
from service.core.models import Job
from tests.service.api.conftest import Api
from tests.service.api.test_usage import add_run

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0]}


def scrape(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = api.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_jobs_queue_and_gpus_by_state(alice: Api, as_user, make_token) -> None:
    bob = as_user("bob")
    for api in (alice, alice, bob):
        assert api.post("/api/jobs", json=SPEC).status_code == 201
    assert alice.post("/api/jobs", json={**SPEC, "hold": True}).status_code == 201  # queued, but not waiting
    tonight = (datetime.now(UTC) + timedelta(hours=6)).isoformat()
    assert bob.post("/api/jobs", json={**SPEC, "begin_at": tonight}).status_code == 201  # nor that one, yet
    admin = as_user("root", admin=True)
    assert admin.post("/api/gpus/lab-a/3/drain").status_code in (200, 202)
    samples = scrape(alice)
    assert samples[("towerq_jobs", (("state", "queued"), ("user", "alice")))] == 3
    assert samples[("towerq_jobs", (("state", "queued"), ("user", "bob")))] == 2
    assert samples[("towerq_queue_length", ())] == 3
    assert samples[("towerq_jobs_on_hold", ())] == 1
    assert samples[("towerq_jobs_not_begun", ())] == 1
    assert samples[("towerq_submissions_total", ())] == 5
    assert samples[("towerq_crashes_total", ())] == 0
    assert samples[("towerq_gpus", ())] == 4
    assert samples[("towerq_gpus_by_state", (("host", "lab-a"), ("state", "free")))] == 3
    assert samples[("towerq_gpus_by_state", (("host", "lab-a"), ("state", "drained")))] == 1
    assert samples[("towerq_hosts", (("state", "up"),))] == 1
    for histogram in (
        "towerq_queue_wait_seconds",
        "towerq_submit_to_running_seconds",
        "towerq_scheduling_pass_seconds",
    ):
        assert samples[(f"{histogram}_count", ())] == 0
        assert ((f"{histogram}_bucket"), (("le", "+Inf"),)) in samples
    assert alice.client.get("/metrics").status_code == 401  # scrape with a token (docs/deployment.md)


def test_gpus_held_idle_are_counted_by_user(alice: Api, db: Database, add_host: Callable[..., None]) -> None:
    """Running jobs whose every rank found its GPUs idle past the warning time: their GPUs,
    fractions summed, by user; not a job busy again, nor one that ended."""
    add_host("lab-b", 2)
    now = datetime.now(UTC)
    use = {"gpus": 1, "samples": 5, "busy_pct": 1.0, "idle_since": (now - timedelta(minutes=40)).isoformat()}
    idle = add_run(db, "carol", "lab-b", [0, 1], now - timedelta(hours=2), now - timedelta(hours=1), None)
    shared = add_run(db, "carol", "lab-a", [0], now - timedelta(hours=2), now - timedelta(hours=1), None, fraction=0.5)
    busy = add_run(db, "dave", "lab-a", [1], now - timedelta(hours=2), now - timedelta(hours=1), None)
    ended = add_run(db, "erin", "lab-a", [2], now - timedelta(hours=2), now - timedelta(hours=1), now)
    stored = {
        idle: {"1.0": {**use, "rank": 0}, "1.1": {**use, "rank": 1}},
        shared: {"1.0": {**use, "rank": 0}},
        busy: {"1.0": {**use, "rank": 0}, "1.1": {**use, "rank": 1, "idle_since": None}},
        ended: {"1.0": {**use, "rank": 0}},
    }
    with db.write() as session:
        for job_id, value in stored.items():
            session.execute(update(Job).where(Job.id == job_id).values(gpu_use=value))
    samples = scrape(alice)
    held = {labels: value for (name, labels), value in samples.items() if name == "towerq_gpus_held_idle"}
    assert held == {(("user", "carol"),): 2.5}, held
