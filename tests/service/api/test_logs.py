"""A job's log lines as the API pages them, and what a reader is told of lines the database
trimmed before it read them (it keeps a job's newest `LOG_LINES_KEPT`; `log.txt` all)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.core import attempts
from service.core.attempts import trim_logs
from service.core.db import Database
from service.core.models import LogLine, utcnow
from tests.service.api.conftest import Api
from towerq import Client
from towerq.contract.api import LOG_TRIMMED_HEADER

SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1}


def write_lines(db: Database, job_id: int, numbers: range) -> None:
    with db.write() as session:
        session.add_all(
            LogLine(job_id=job_id, attempt=1, time=utcnow(), level="info", message=f"line {n}") for n in numbers
        )


def test_a_reader_behind_the_trim_is_told_once_that_lines_were_trimmed(
    alice: Api, client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`towerq run`, `towerq follow --logs`, `towerq logs --follow` and `job.log_lines()` read
    after the last line they printed; a program that printed more than the database keeps
    between two reads (or while the API restarted) lost the trimmed lines from the stream
    without a word. Now a line in their place says so, and where all of them are."""
    job_id = alice.post("/api/jobs", json=SPEC).json()["id"]
    reader = Client(url="http://testserver", token="unused", retries=0)
    reader.http = TestClient(client.app, headers=alice.headers)
    write_lines(db, job_id, range(5))
    first = list(reader.log_lines(job_id))
    assert [row["message"] for row in first] == [f"line {n}" for n in range(5)]
    assert LOG_TRIMMED_HEADER not in alice.get(f"/api/jobs/{job_id}/logs").headers

    write_lines(db, job_id, range(5, 15))
    monkeypatch.setattr(attempts, "LOG_LINES_KEPT", 4)
    with db.write() as session:
        trim_logs(session, job_id)  # as an attempt's end does
    rows = list(reader.log_lines(job_id, after=first[-1]["id"]))
    said, *kept = rows
    assert said["level"] == "towerq" and f"towerq download {job_id} log.txt" in said["message"], said
    assert [row["message"] for row in kept] == [f"line {n}" for n in range(11, 15)]
    trimmed = int(alice.get(f"/api/jobs/{job_id}/logs").headers[LOG_TRIMMED_HEADER])
    assert said["id"] == trimmed and first[-1]["id"] < trimmed < kept[0]["id"]
    assert list(reader.log_lines(job_id, after=kept[-1]["id"])) == [], "said once"
    later = [row["message"] for row in reader.log_lines(job_id, after=kept[0]["id"])]
    assert later == ["line 12", "line 13", "line 14"], "a reader past the trim is told nothing"
    reader.close()


def test_the_whole_log_the_database_keeps_or_its_tail_and_a_word_where_earlier_lines_were_trimmed(
    alice: Api, client: TestClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`towerq logs ID` printed its last 200 lines, with no way to more but downloading its
    log.txt; now every line the database keeps (`--tail N`: its last N), and a first line
    that says where the earlier ones are when the database trimmed some."""
    job_id = alice.post("/api/jobs", json=SPEC).json()["id"]
    reader = Client(url="http://testserver", token="unused", retries=0)
    reader.http = TestClient(client.app, headers=alice.headers)
    write_lines(db, job_id, range(1500))
    assert [row["message"] for row in reader.log_tail(job_id)] == [f"line {n}" for n in range(1500)]
    assert [row["message"] for row in reader.log_tail(job_id, 2)] == ["line 1498", "line 1499"]

    monkeypatch.setattr(attempts, "LOG_LINES_KEPT", 4)
    with db.write() as session:
        trim_logs(session, job_id)
    said, *kept = reader.log_tail(job_id)
    assert said["level"] == "towerq" and said["message"] == (
        f"(earlier lines were trimmed from the database: it keeps a job's newest 20,000; its log.txt has every "
        f"line: towerq download {job_id} log.txt)"
    )
    assert [row["message"] for row in kept] == [f"line {n}" for n in range(1496, 1500)]
    assert [row["message"] for row in reader.log_tail(job_id, 3)] == ["line 1497", "line 1498", "line 1499"]
    assert reader.log_tail(job_id, 10)[0]["level"] == "towerq", "fewer than asked: the rest were trimmed"
    reader.close()
