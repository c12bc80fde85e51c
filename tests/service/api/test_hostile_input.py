"""Hostile input: whatever anyone sends, no 5xx, and every refusal says what is wrong.

Property tests (hypothesis) throw arbitrary JSON and mangled specs at the job API;
schemathesis generates requests for every operation of /openapi.json against a real
API process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from service.core.attempts import mint_attempt_token
from service.core.context import Context
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from tests.service.api.conftest import Api
from tests.stack import Stack
from towerq.contract.spec import JobSpec

VALID = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 10}}
FIELDS = [
    "name",
    "model",
    "dataset",
    "dataset_options",
    "hyperparameters",
    "gpus",
    "gpu_count",
    "host",
    "gpu_memory_fraction",
    "variable_device",
    "tower_weights",
    "priority",
    "time_limit_s",
    "max_attempts",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=5),
    max_leaves=20,
)
SLOW_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def assert_refusal_names_the_problem(status: int, body: Any) -> None:
    assert status < 500, body
    if status >= 400:
        assert isinstance(body, dict) and body.get("detail"), body
        if status == 422:
            for error in body["detail"]:
                assert error["msg"] and error["loc"], error


@examples(max_examples=200, deadline=None, suppress_health_check=SLOW_HEALTH)
@given(body=json_values)
def test_any_json_body_gets_an_answer_not_a_crash(alice: Api, body: Any) -> None:
    response = alice.post("/api/jobs", json=body)
    assert_refusal_names_the_problem(response.status_code, response.json())


@examples(max_examples=300, deadline=None, suppress_health_check=SLOW_HEALTH)
@given(field=st.sampled_from(FIELDS), value=json_values, nested=st.sampled_from(["top", "hyperparameters"]))
def test_a_spec_with_any_field_mangled_is_stored_or_refused_with_the_field_named(
    alice: Api, field: str, value: Any, nested: str
) -> None:
    spec = json.loads(json.dumps(VALID))
    if nested == "hyperparameters":
        spec["hyperparameters"][field] = value
    else:
        spec[field] = value
    response = alice.post("/api/jobs", json=spec)
    assert_refusal_names_the_problem(response.status_code, response.json())
    if response.status_code == 422:
        named = " ".join(str(e["loc"]) + e["msg"] for e in response.json()["detail"])
        assert field in named or "body" in named, named


PARTS: dict[str, Any] = {
    "kind": None,  # drawn apart: model, command, notebook or none
    "model": "mlp",
    "dataset": "digits",
    "command": ["python", "train.py"],
    "code": None,  # the bundle uploaded in the test
    "env": {"PYTHONPATH": "/code/lib"},
    "processes": "per_gpu",
    "resumable": True,
    "gpus": [0],
    "gpu_count": 2,
    "min_gpu_count": 1,
    "host": "lab-a",
    "gpu_memory_fraction": 0.5,
    "hyperparameters": {"steps": 10},
    "idle_timeout_s": 600,
    "time_limit_s": 3600,
    "signal": "USR1@60",
    "network": True,
    "hold": True,
    "begin_at": "2030-01-01T00:00:00Z",
    "tower_weights": [1, 1],
    "max_attempts": 2,
}


@examples(max_examples=300, deadline=None, suppress_health_check=SLOW_HEALTH)
@given(
    kind=st.sampled_from([None, "model", "command", "notebook"]),
    fields=st.sets(st.sampled_from([name for name in PARTS if name != "kind"]), max_size=4),
)
def test_any_mix_of_valid_fields_for_any_kind_is_stored_or_refused_with_a_field_named(
    alice: Api, add_host: Callable[..., None], kind: str | None, fields: set[str]
) -> None:
    """Each field well formed on its own, in any mix and kind (a notebook naming a code
    bundle was a 500: the bundle's check asked for a model)."""
    add_host("lab-a", 4)
    bundle = alice.post("/api/code", files={"file": ("train.py", b"print(1)\n")}).json()["id"]
    spec = {name: bundle if name == "code" else PARTS[name] for name in fields}
    if kind is not None:
        spec["kind"] = kind
    response = alice.post("/api/jobs", json=spec)
    assert_refusal_names_the_problem(response.status_code, response.json())


@examples(max_examples=100, deadline=None, suppress_health_check=SLOW_HEALTH)
@given(raw=st.binary(max_size=200))
def test_bytes_that_are_not_json_are_refused_politely(alice: Api, raw: bytes) -> None:
    response = alice.post("/api/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert_refusal_names_the_problem(response.status_code, response.json())


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("field", ["learning_rate", "weight_decay", "momentum"])
def test_non_finite_numbers_written_as_json_literals_are_refused(alice: Api, literal: str, field: str) -> None:
    raw = '{"model": "mlp", "dataset": "digits", "hyperparameters": {"' + field + '": ' + literal + "}}"
    response = alice.post("/api/jobs", content=raw.encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert any(field in e["msg"] for e in response.json()["detail"])


@pytest.mark.parametrize(
    "edge", ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00", "1899-12-31T23:59:59Z"]
)
def test_a_time_past_the_calendars_edge_is_refused_naming_its_field(
    as_user: Callable[..., Api], add_host: Callable[..., None], edge: str
) -> None:
    """Times are stored and windowed in UTC: one of year 1 or 9999 (with an offset, or a week
    subtracted) once overflowed Python's calendar, a 500 (found by the fuzz test)."""
    add_host("lab-a", 4)
    root = as_user("root", True)
    assert root.post("/api/groups", json={"name": "vision"}).status_code == 201
    later = "2030-01-01T00:00:00Z"
    asked = [
        (root.get("/api/usage", params={"until": edge}), "until"),
        (root.get("/api/usage", params={"since": edge}), "since"),
        (root.get("/api/usage/timeline", params={"until": edge}), "until"),
        (root.post("/api/usage/what-if", json={"until": edge}), "until"),
        (root.post("/api/reservations", json={"group": "vision", "gpus": 1, "start": edge, "end": later}), "start"),
        (root.post("/api/reservations", json={"group": "vision", "gpus": 1, "start": later, "end": edge}), "end"),
    ]
    for response, field in asked:
        assert response.status_code == 422, response.text
        assert_refusal_names_the_problem(response.status_code, response.json())
        assert response.json()["detail"][0]["loc"][-1] == field, response.text
        assert "between 1900 and 9998" in response.text, response.text


@pytest.fixture
def settings_for_live(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url, api_workers=1)


@pytest.fixture
def live_api(
    settings_for_live: Settings, tmp_path, make_token: Callable[..., str], add_host
) -> Iterator[tuple[str, str]]:
    stack = Stack(settings_for_live, tmp_path)
    # A generated request for the stream of a job that exists reads it to its end: a
    # second here, not the hour a stream lives by default (its keepalives reset the
    # fuzzer's read timeout); tests/security/test_streams.py has the life's own test.
    url = stack.start_api(stream_max_life_s=1)
    add_host("lab-a", 4)
    try:
        yield url, make_token("fuzzer", admin=True)
    finally:
        stack.stop_all()


@pytest.fixture
def settings(settings_for_live: Settings) -> Settings:
    return settings_for_live


def fuzz(location: str, token: str, tmp_path: Path, *options: str) -> str:
    """A schemathesis run over `location` with `token`: it fails on any 5xx; its summary."""
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            location,
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "40",
            "--request-timeout",
            "30",
            "--workers",
            "1",
            "--suppress-health-check",
            "all",
            *options,
        ],
        cwd=tmp_path,  # its run cache (.schemathesis/) goes there, not into the checkout
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout[result.stdout.rfind("SUMMARY") :]
    assert "Authentication failed" not in summary, summary
    return summary


@pytest.mark.slow
def test_schemathesis_finds_no_request_that_gets_a_5xx(live_api: tuple[str, str], tmp_path: Path) -> None:
    """Every operation of /openapi.json, with generated (valid and invalid) parameters and
    bodies; the run fails on any 5xx. Its own checks of 4xx bodies come after. (The attempt
    protocol's routes answer only an attempt's token: the next test.)"""
    url, token = live_api
    summary = fuzz(
        f"{url}/openapi.json",
        token,
        tmp_path,
        # Revoking tokens by id would soon revoke its own and leave only 401s to see;
        # revocation has tests of its own.
        "--exclude-operation-id",
        "revoke_api_tokens__token_id__delete",
        "--exclude-path-regex",
        "^/api/attempts/",
    )
    tested = re.search(r"Tested: (\d+)", summary)
    assert tested and int(tested.group(1)) >= 20, summary


@pytest.mark.slow
def test_schemathesis_finds_no_request_to_an_attempts_routes_that_gets_a_5xx(
    live_api: tuple[str, str], tmp_path: Path, settings_for_live: Settings
) -> None:
    """The attempt protocol's routes, with a live attempt's own token, generated bodies and
    parameters: no 5xx. The document is the API's own with the attempt's job and number
    written into the paths (an attempt's token reaches no other), and without `end`, which
    would end the attempt and its token with it (its refusals have tests of their own)."""
    url, _ = live_api
    ctx = Context.open(settings_for_live)
    try:
        with ctx.db.write() as session:
            owner = ensure_user(session, "alice")
            caller = Caller(owner.id, owner.name, False, 0)
        spec = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpus": [0]})
        job_id = submit(ctx.db, caller, spec, settings_for_live)[0].id
        LiveScheduler(ctx).run_pass()
        with ctx.db.write() as session:
            token = mint_attempt_token(session, job_id, 1)
    finally:
        ctx.close()
    document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    paths = {}
    for path, operations in document["paths"].items():
        if not path.startswith("/api/attempts/") or path.endswith("/end"):
            continue
        for operation in operations.values():
            operation["parameters"] = [p for p in operation.get("parameters", []) if p["in"] != "path"]
        paths[path.replace("{job_id}", str(job_id)).replace("{attempt}", "1")] = operations
    assert len(paths) == 10, sorted(paths)
    (tmp_path / "attempts.json").write_text(json.dumps({**document, "paths": paths}))
    summary = fuzz("attempts.json", token, tmp_path, "--url", url)
    tested = re.search(r"Tested: (\d+)", summary)
    assert tested and int(tested.group(1)) == 11, summary  # the door is two: POST and DELETE
    status = httpx.get(f"{url}/api/attempts/{job_id}/1", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert status.status_code == 200, "the token lived through the run"
