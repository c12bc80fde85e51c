"""A queued job's page says the newest warning of the attempt it waits to start beside its
queue reason ("its requirements could not be installed on lab-a while it waits ..."), which
only its log said, at the bottom of the page: on opening it, and live when a host says it.
Whoever cannot read its log sees where its requirements failed in its reason, and the jobs
list marks it for everyone."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from service.core import joblog
from service.core.context import Context
from service.core.settings import Settings
from tests.stack import Stack
from worker.prepare import mark_failed_on

pytestmark = pytest.mark.slow
JOB = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}
FAILED = "its requirements could not be installed on lab-a (its log says why)"
CANNOT = "its requirements could not be installed on lab-a while it waits: No matching distribution found for x==9"


def say(settings: Settings, job_id: int, level: str, message: str) -> None:
    """A line of towerq's in the job's log, as a host's worker writes it (published on commit),
    and for a warning, the host on the job's `requirements_failed_on`, as it marks it."""
    ctx = Context.open(settings)
    try:
        with ctx.db.write() as session:
            joblog.towerq_lines(session, [job_id], level, message)
            if level == "warning":
                mark_failed_on(session, [job_id], "lab-a", True)
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
    assert page.locator('[data-field="Queue"]').inner_text() == "waiting for the scheduler", "the warning says why"

    bob = make_token("bob")  # may not read alice's log: her job's reason says where
    page.goto(f"{url}/?token={bob}#/jobs/{job_id}")
    page.wait_for_selector('[data-field="Queue"]')
    assert page.locator('[data-field="Queue"]').inner_text() == FAILED
    assert page.locator('[data-field="Warned"]').count() == 0
    page.goto(f"{url}/?token={bob}#/jobs")
    row = page.locator(f'tr[data-job="{job_id}"] td.why')
    row.wait_for()
    assert row.locator(".reason.warned").inner_text() == FAILED, "in the warning's colour"
