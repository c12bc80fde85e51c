"""A queued job's page says the newest warning of the attempt it waits to start beside its
queue reason ("its requirements could not be installed on lab-a while it waits ..."), which
only its log said, at the bottom of the page: on opening it, and live when a host says it."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from service.core import joblog
from service.core.context import Context
from service.core.settings import Settings
from tests.stack import Stack

pytestmark = pytest.mark.slow
JOB = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}
CANNOT = "its requirements could not be installed on lab-a while it waits: No matching distribution found for x==9"


def say(settings: Settings, job_id: int, level: str, message: str) -> None:
    """A line of towerq's in the job's log, as a host's worker writes it (published on commit)."""
    ctx = Context.open(settings)
    try:
        with ctx.db.write() as session:
            joblog.towerq_lines(session, [job_id], level, message)
    finally:
        ctx.close()


def test_a_queued_jobs_page_says_its_newest_warning_beside_its_reason(
    stack: Stack,
    settings: Settings,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()  # no scheduler: the job stays queued
    add_host("lab-a", 2)
    token = make_token("alice")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as alice:
        job_id = alice.post("/api/jobs", json=JOB).json()["id"]
    say(settings, job_id, "info", "a line of no concern")
    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{job_id}")
    page.wait_for_selector('[data-field="Queue"]')
    page.wait_for_function("document.querySelector('pre.log')?.textContent.includes('no concern')")
    assert page.locator('[data-field="Warned"]').count() == 0, "no warning: no field"

    say(settings, job_id, "warning", CANNOT)  # live, on the job's stream
    page.wait_for_selector('[data-field="Warned"]')
    assert page.locator('[data-field="Warned"]').inner_text().endswith(CANNOT)
    page.reload()  # and from the log, on opening the page
    page.wait_for_selector('[data-field="Warned"]')
    assert page.locator('[data-field="Warned"]').inner_text().endswith(CANNOT)
