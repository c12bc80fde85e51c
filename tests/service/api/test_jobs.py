"""The jobs API, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from sqlalchemy import func, select

from service.api.routes import catalog as catalog_route
from service.core.db import Database
from service.core.models import Job, JobEvent
from service.core.settings import Settings
from tests.service.api.conftest import Api
from towerq.contract.catalog import BUILTIN_DATASETS, DATASETS, MODELS
from towerq.contract.versions import SPEC_VERSION
from worker.host import register
from worker.inventory import GpuState, SimulatedInventory

SPEC = {"model": "lenet5", "dataset": "digits", "gpus": [0, 1], "hyperparameters": {"steps": 300, "batch_size": 32}}


def stored_jobs(db: Database) -> int:
    with db.read() as session:
        return session.scalar(select(func.count(Job.id))) or 0


def test_submit_returns_201_and_a_queued_job(alice: Api, db: Database) -> None:
    response = alice.post("/api/jobs", json=SPEC)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["state"] == "queued"
    assert job["user"] == "alice"
    assert job["gpu_count"] == 2
    assert job["spec"]["gpus"] == [0, 1]
    assert job["spec"]["hyperparameters"]["seed"] is not None  # chosen and recorded
    assert job["attempts"] == 1
    assert [e["state"] for e in job["events"]] == ["queued"]
    with db.read() as session:
        assert session.scalar(select(func.count(JobEvent.id)).where(JobEvent.job_id == job["id"])) == 1
        assert session.scalar(select(Job.spec_version).where(Job.id == job["id"])) == SPEC_VERSION  # its rules


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"gpus": [0, 7]}, "gpus", "GPU 7 does not exist on lab-a (it has GPUs 0-3)"),
        ({"model": "lenet9"}, "model", "unknown model 'lenet9'"),
        ({"hyperparameters": {"learning_rate": -0.1}}, "hyperparameters.learning_rate", "greater than 0"),
        ({"gpu_count": 3}, "gpu_count", "gpu_count is 3 but gpus names 2 GPUs"),
        ({"gpus": None, "gpu_count": 9}, "gpu_count", "9 GPUs asked for but the largest host has 4"),
        ({"host": "lab-z"}, "host", "unknown host 'lab-z'"),
        ({"hyperparameters": {"learnig_rate": 0.1}}, "hyperparameters.learnig_rate", "Extra inputs are not permitted"),
        ({"dataset": "npz:../../etc/passwd"}, "dataset", "must not contain '..'"),
        ({"gpu_memory_fraction": 1.5}, "gpu_memory_fraction", "less than or equal to 1"),
    ],
)
def test_bad_spec_gets_422_naming_the_field_and_stores_nothing(
    alice: Api, db: Database, change: dict[str, object], field: str, words: str
) -> None:
    spec = {**SPEC, **change}
    response = alice.post("/api/jobs", json=spec)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    messages = " | ".join(d["msg"] for d in detail)
    assert words in messages
    assert any(
        m.startswith(field) or f"{field} " in m or field in m.split(":")[0] for m in [d["msg"] for d in detail]
    ), messages
    assert stored_jobs(db) == 0


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            {"dataset_options": {"classes": 5}},
            "dataset_options",
            "classes does not apply to dataset 'digits' (it takes: train_examples, test_examples, test_fraction)",
        ),
        (
            {"dataset": "synthetic", "dataset_options": {"noise": 0.5}},
            "dataset_options",
            "noise does not apply to dataset 'synthetic' (it takes: shape, classes, train_examples, test_examples)",
        ),
        ({"dataset": "tfrecord:train-*.tfrecord"}, "dataset_options", "dataset 'tfrecord' needs classes"),
        (
            {"dataset": "synthetic", "dataset_options": {"shape": [512, 512, 3], "train_examples": 10_000}},
            "dataset_options",
            "a synthetic dataset of 8,669,626,368 values is too large: shape × examples must stay under 268,435,456",
        ),
        (
            {"model": "mlp", "hyperparameters": {"model_options": {"width": 8}}},
            "hyperparameters",
            "model_options.width does not apply to model 'mlp' (it takes: hidden)",
        ),
        ({"model": "poly2"}, "", "model poly2 fits y = a·x² + b·x + c: use dataset 'quadratic'"),
    ],
)
def test_what_the_trainer_would_refuse_is_refused_at_submit_time(
    alice: Api, db: Database, change: dict[str, object], field: str, words: str
) -> None:
    response = alice.post("/api/jobs", json={**SPEC, **change})
    assert response.status_code == 422, response.text
    messages = [d["msg"] for d in response.json()["detail"]]
    assert messages == [f"{field}: {words}" if field else words]
    assert stored_jobs(db) == 0


ELASTIC = {**SPEC, "gpus": None, "gpu_count": 4, "min_gpu_count": 1}
COMMAND = {"command": ["python", "train.py"], "code": "0" * 64, "gpu_count": 4, "min_gpu_count": 2}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({**ELASTIC, "min_gpu_count": 5}, "min_gpu_count: 5 is above gpu_count (4)"),
        ({**ELASTIC, "gpus": [0, 1, 2, 3]}, "min_gpu_count: a job on the GPUs it names (gpus) runs on exactly those"),
        ({**ELASTIC, "tower_weights": [1, 1, 1, 1]}, "min_gpu_count: tower_weights fit one size of job"),
        ({"kind": "notebook", "gpu_count": 2, "min_gpu_count": 1}, "min_gpu_count: a notebook session is never"),
        (COMMAND, "min_gpu_count: a command job is resized by a stop and a restart from its checkpoint"),
        ({**ELASTIC, "gpu_count": 8, "min_gpu_count": 4}, "8 GPUs asked for but the largest host has 4"),
        ({**ELASTIC, "min_gpu_count": 0}, "min_gpu_count: Input should be greater than or equal to 1"),
    ],
)
def test_an_elastic_job_that_cannot_be_resized_gets_422_naming_min_gpu_count(
    alice: Api, db: Database, spec: dict[str, object], words: str
) -> None:
    response = alice.post("/api/jobs", json=spec)
    assert response.status_code == 422, response.text
    messages = " | ".join(d["msg"] for d in response.json()["detail"])
    assert words in messages
    assert stored_jobs(db) == 0


def test_a_job_over_several_hosts_is_not_elastic(alice: Api, db: Database, add_host: Callable[..., None]) -> None:
    add_host("lab-b", 4)
    response = alice.post("/api/jobs", json={**ELASTIC, "gpu_count": 8, "min_gpu_count": 4})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["msg"].startswith(
        "min_gpu_count: a job over several hosts (8 GPUs; the largest host has 4) runs at its full size"
    )
    assert stored_jobs(db) == 0


def test_an_elastic_job_is_stored_with_its_least_size(alice: Api, db: Database) -> None:
    response = alice.post("/api/jobs", json=ELASTIC)
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["min_gpu_count"] == 1
    rigid = alice.post("/api/jobs", json={**ELASTIC, "min_gpu_count": 4})  # its least size is its size: not elastic
    with db.read() as session:
        stored = {job_id: least for job_id, least in session.execute(select(Job.id, Job.min_gpu_count))}
    assert stored == {response.json()["id"]: 1, rigid.json()["id"]: None}


PROGRAM = {"command": ["python", "train.py"], "code": "0" * 64, "time_limit_s": 3600}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({**PROGRAM, "signal": "TERM@60"}, "TERM: a program is warned with one of USR1, USR2, HUP, INT, ALRM"),
        ({**PROGRAM, "signal": "KILL"}, "KILL: a program is warned with one of"),
        ({**PROGRAM, "signal": "USR1 600"}, "'USR1 600': write SIGNAL@SECONDS, e.g. USR1@600"),
        ({**PROGRAM, "signal": "USR1@0"}, "0 s: the warning comes 1 to 65535 s before the time limit"),
        ({**PROGRAM, "signal": "USR1@3600"}, "signal: SIGUSR1 3600 s before the time limit would come at the start"),
        ({**SPEC, "signal": "USR1@60"}, "signal: applies to command jobs only"),
        ({"kind": "notebook", "signal": "USR1@60"}, "signal: applies to command jobs only"),
    ],
)
def test_a_signal_before_the_time_limit_it_cannot_send_gets_422_naming_signal(
    alice: Api, db: Database, spec: dict[str, object], words: str
) -> None:
    response = alice.post("/api/jobs", json=spec)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert words in detail["msg"] and (detail["loc"][-1] == "signal" or detail["msg"].startswith("signal: "))
    assert stored_jobs(db) == 0


def test_a_notebook_session_may_name_a_code_bundle_and_one_that_is_not_there_gets_422_naming_code(
    alice: Api, db: Database
) -> None:
    """A session's bundle runs nothing by itself (its member imports from it): it is checked
    to exist, not for a program or a model (was a 500: the check asked for the model)."""
    bundle = alice.post("/api/code", files={"file": ("helpers.py", b"ANSWER = 42\n")}).json()["id"]
    response = alice.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1, "code": bundle})
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["code"] == bundle
    missing = alice.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1, "code": "0" * 64})
    assert missing.status_code == 422, missing.text
    assert missing.json()["detail"][0]["loc"][-1] == "code", missing.text
    assert stored_jobs(db) == 1


def test_a_queued_jobs_time_limit_stays_longer_than_its_signals_lead(alice: Api, settings: Settings) -> None:
    """`signal` is stored as Slurm writes it (`SIGUSR1` → `USR1@60`); a queued job's time
    limit changed to within its lead is refused as at submit (the warning would come at the
    program's start, before it catches it)."""
    bundle = alice.post("/api/code", files={"file": ("train.py", b"print(1)\n")}).json()["id"]
    response = alice.post("/api/jobs", json={**PROGRAM, "code": bundle, "signal": "sigusr1"})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["signal"] == "USR1@60"
    refused = alice.patch(f"/api/jobs/{job['id']}", json={"time_limit_s": 60})
    assert refused.status_code == 422, refused.text
    assert "time_limit_s: 60 s is within the 60 s its signal warns before the time limit (USR1@60)" in refused.text
    taken = alice.patch(f"/api/jobs/{job['id']}", json={"time_limit_s": 61})
    assert taken.status_code == 200 and taken.json()["spec"]["time_limit_s"] == 61, taken.text


def test_options_that_apply_are_accepted(alice: Api) -> None:
    spec = {
        **SPEC,
        "model": "mlp",
        "dataset_options": {"train_examples": 100, "test_fraction": 0.25},
        "hyperparameters": {"steps": 10, "model_options": {"hidden": [16]}},
    }
    response = alice.post("/api/jobs", json=spec)
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["dataset_options"]["test_fraction"] == 0.25


def test_the_catalog_is_the_spec_contract(alice: Api) -> None:
    catalog = alice.get("/api/catalog").json()
    assert [m["name"] for m in catalog["models"]] == list(MODELS)
    assert [d["name"] for d in catalog["datasets"]] == list(BUILTIN_DATASETS)
    assert catalog["dataset_options"]["applies_to"]["digits"] == list(DATASETS["digits"].options)
    assert next(m for m in catalog["models"] if m["name"] == "mlp")["options"] == ["hidden"]
    assert catalog["optimizers"] == ["sgd", "momentum", "adam"]


def test_gpus_by_id_need_a_host_when_several_hosts_exist(alice: Api, add_host: Callable[..., None]) -> None:
    add_host("lab-b", 2)
    response = alice.post("/api/jobs", json=SPEC)
    assert response.status_code == 422
    assert (
        response.json()["detail"][0]["msg"] == "host: several hosts have GPUs (lab-a, lab-b): say which one with 'host'"
    )
    assert alice.post("/api/jobs", json={**SPEC, "host": "lab-b"}).status_code == 201


def test_every_call_but_healthz_needs_a_token(client, alice: Api) -> None:
    assert client.get("/healthz").status_code == 200
    for method, path in (("GET", "/api/jobs"), ("POST", "/api/jobs"), ("GET", "/api/gpus"), ("GET", "/metrics")):
        response = client.request(method, path)
        assert response.status_code == 401
        assert response.json()["detail"].startswith("missing token")
    bad = client.get("/api/jobs", headers={"Authorization": "Bearer tq_wrong"})
    assert bad.status_code == 401
    assert bad.json() == {"detail": "invalid token"}


def test_list_is_newest_first_filtered_and_paginated(alice: Api, as_user: Callable[..., Api]) -> None:
    bob = as_user("bob")
    ids = [alice.post("/api/jobs", json={**SPEC, "name": f"a{i}"}).json()["id"] for i in range(3)]
    ids.append(bob.post("/api/jobs", json={**SPEC, "name": "b0"}).json()["id"])
    page = alice.get("/api/jobs", params={"limit": 2}).json()
    assert page["total"] == 4
    assert [j["id"] for j in page["items"]] == ids[::-1][:2]
    assert [j["name"] for j in alice.get("/api/jobs", params={"user": "alice", "offset": 1}).json()["items"]] == [
        "a1",
        "a0",
    ]
    assert alice.get("/api/jobs", params={"q": "b0"}).json()["total"] == 1
    assert alice.get("/api/jobs", params={"q": str(ids[0])}).json()["total"] >= 1  # an id
    for text in ("9" * 30, "²"):  # digits, but no id (schemathesis found the first a 500)
        found = alice.get("/api/jobs", params={"q": text})
        assert found.status_code == 200 and found.json()["total"] == 0, found.text
    assert alice.get("/api/jobs", params={"state": "running"}).json()["total"] == 0
    unknown = alice.get("/api/jobs", params={"state": "sleeping"})
    assert unknown.status_code == 422
    assert "unknown state 'sleeping'" in unknown.json()["detail"][0]["msg"]


def test_cancel_queued_job_is_immediate_and_only_for_owner_or_admin(alice: Api, as_user: Callable[..., Api]) -> None:
    job = alice.post("/api/jobs", json=SPEC).json()
    bob = as_user("bob")
    refused = bob.post(f"/api/jobs/{job['id']}/cancel")
    assert refused.status_code == 403
    assert "only they or an admin" in refused.json()["detail"]
    cancelled = alice.post(f"/api/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["state"] == "cancelled"
    again = alice.post(f"/api/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert again.json() == {"detail": f"job {job['id']} is already cancelled"}
    admin = as_user("root", admin=True)
    other = bob.post("/api/jobs", json=SPEC).json()
    assert admin.post(f"/api/jobs/{other['id']}/cancel").json()["state"] == "cancelled"


def test_unknown_job_is_404(alice: Api) -> None:
    response = alice.get("/api/jobs/999")
    assert response.status_code == 404
    assert response.json() == {"detail": "job 999 not found"}


def test_repeated_idempotency_key_returns_the_first_job(alice: Api, db: Database) -> None:
    first = alice.post("/api/jobs", json=SPEC, headers={"Idempotency-Key": "k-1"})
    second = alice.post("/api/jobs", json=SPEC, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201
    assert second.status_code == 200
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.json()["id"] == first.json()["id"]
    assert stored_jobs(db) == 1


def test_list_answers_304_while_the_page_is_unchanged(alice: Api, db: Database) -> None:
    alice.post("/api/jobs", json=SPEC)
    first = alice.get("/api/jobs")
    etag = first.headers["ETag"]
    again = alice.get("/api/jobs", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["ETag"] == etag
    with db.write() as session:
        job = session.scalars(select(Job)).one()
        job.step, job.loss, job.step_time_s = 10, 1.5, 0.02
    changed = alice.get("/api/jobs", headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed.headers["ETag"] != etag
    assert changed.json()["items"][0]["latest"]["step_time_s"] == 0.02  # the dashboard's ETA


def test_the_dashboard_is_served_at_the_root(client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and '<script type="module" src="app.js">' in page.text
    for path in ("/app.js", "/lib.js", "/pages/jobs.js", "/style.css", "/vendor/uplot/uPlot.esm.js"):
        assert client.get(path).status_code == 200, path


def test_the_catalog_lists_data_files_without_walking_the_folder_on_every_request(
    alice: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    np.savez(settings.data_dir / "a.npz", x=np.zeros((2, 1)), y=np.zeros(2))
    scans = []
    real = catalog_route._scan_files
    monkeypatch.setattr(catalog_route, "_scan_files", lambda root: scans.append(root) or real(root))
    monkeypatch.setattr(catalog_route, "FOUND", catalog_route.Found(max_age_s=60))
    first = [d["name"] for d in alice.get("/api/catalog").json()["datasets"]]
    np.savez(settings.data_dir / "b.npz", x=np.zeros((2, 1)), y=np.zeros(2))
    second = [d["name"] for d in alice.get("/api/catalog").json()["datasets"]]
    assert "npz:a.npz" in first and first == second
    assert len(scans) == 1
    monkeypatch.setattr(catalog_route.FOUND, "max_age_s", 0)
    assert "npz:b.npz" in [d["name"] for d in alice.get("/api/catalog").json()["datasets"]]
    assert len(scans) == 2


def test_only_liveness_the_api_description_and_logout_need_no_token(client, alice: Api) -> None:
    public = {
        ("GET", "/healthz"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/redoc"),
        ("DELETE", "/api/session"),
    }
    assert {(m, p) for m, p in public if client.request(m, p).status_code < 400} == public
    for route in client.app.routes:
        for method in getattr(route, "methods", None) or ():
            if (method, route.path) in public or method == "HEAD" or route.path.startswith("/docs/"):
                continue
            path = route.path.replace("{", "").replace("}", "")  # any value: the token is checked first
            response = client.request(method, path)
            assert response.status_code == 401, (method, route.path, response.status_code)


class RealGpus(SimulatedInventory):
    """GPUs registered as real ones (no driver is needed to register a host's rows)."""

    simulated = False

    def gpus(self) -> list[GpuState]:
        return [replace(g, simulated=False, name="NVIDIA T4", memory_total_mb=16384) for g in super().gpus()]


def test_a_fraction_of_a_real_gpu_too_small_for_a_process_is_refused_at_submit(
    as_user: Callable[..., Api], db: Database, settings: Settings
) -> None:
    with db.write() as session:
        register(session, "lab-t4", RealGpus("lab-t4", 2), {})
    alice = as_user("alice")
    refused = alice.post("/api/jobs", json={**SPEC, "gpus": [0], "host": "lab-t4", "gpu_memory_fraction": 0.04})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["msg"] == (
        "gpu_memory_fraction: 0.04 of a 16384 MB GPU leaves 110 MB after the 480 MB the card reserves and the "
        "526 MB each process's CUDA context costs (at least 256 MB)"
    )
    fits = alice.post("/api/jobs", json={**SPEC, "gpus": [0], "host": "lab-t4", "gpu_memory_fraction": 0.25})
    assert fits.status_code == 201, fits.text


def test_a_refusal_says_in_words_what_is_wrong_with_the_field_it_names(alice: Api, db: Database) -> None:
    """Not pydantic's pattern (`String should match pattern '^[^\\x00-\\x1f]*$'`, `'^(user|host|group)$'`),
    nor its `[key]` in a mapping's key's place."""
    for change, said in (
        ({"name": "two\nlines"}, "name: no control characters here (a newline, a tab)"),
        ({"begin_at": "tomorrow"}, "begin_at: 'tomorrow' is not an ISO time, as 2026-12-08T09:00Z"),
        (
            {"env": {"TOWERQ_API_URL": "x"}},
            "env.TOWERQ_API_URL: TOWERQ_API_URL is not a job's to set: towerq sets it, or it changes how every "
            "program loads",
        ),
    ):
        response = alice.post("/api/jobs", json={**SPEC, **change})
        assert response.status_code == 422, response.text
        assert [d["msg"] for d in response.json()["detail"]] == [said]
    assert stored_jobs(db) == 0
    response = alice.get("/api/usage", params={"by": "gpu"})
    assert response.status_code == 422, response.text
    assert [d["msg"] for d in response.json()["detail"]] == ["by: 'gpu' is none of user, host, group"]
