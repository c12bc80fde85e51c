"""Pages that never mislead (issue 31), in a real Chromium against a real stack: a job page
catches up with a state change it was not streamed, a finished job or sweep offers no
cancel, a job with no metric says why instead of drawing empty frames, and the jobs list
labels train and eval figures, says why each job failed, waits or was cancelled, and lets
a person add the columns that matter to them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from sqlalchemy import select

from service.core.db import Database
from service.core.models import Job, JobState
from tests.stack import Stack, wait_for
from tests.web.conftest import shot

pytestmark = [pytest.mark.slow, pytest.mark.browser]
TRACEBACK = "model nets:build: ValueError: the layer sizes do not match\nTraceback (most recent call last):\n  ..."
SPEC = {
    "model": "mlp",
    "dataset": "digits",
    "hyperparameters": {"steps": 100000, "log_every": 5, "learning_rate": 0.05},
}


@pytest.fixture
def a_failed_job(
    stack: Stack, set_job: Callable[..., None], make_token: Callable[..., str], add_host: Callable[..., None]
) -> tuple[str, str, object, int]:
    """An API on a 2-GPU lab, and alice's job that failed with a traceback before a metric:
    (URL, alice's token, her client, the job's id)."""
    url = stack.start_api()
    add_host("lab-a", 2)
    token = make_token("alice")
    client = stack.client(token)
    failed = client.post("/api/jobs", json={**SPEC, "name": "broken"}).json()["id"]
    set_job(failed, state=JobState.FAILED, error=TRACEBACK)
    return url, token, client, failed


def test_the_job_page_shows_a_state_change_it_was_not_streamed_at_once(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    stack.start_worker("lab-a", 1)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    job_id = client.post("/api/jobs", json=SPEC).json()["id"]

    # The page loads while the job waits; its stream is held back until the job runs, as
    # when a job starts between the page's first load and its stream's start.
    page = open_page()
    held: list[object] = []
    page.route(f"**/api/jobs/{job_id}/stream", lambda route: held.append(route))
    page.goto(f"{url}/?token={token}#/jobs/{job_id}")
    page.wait_for_selector('.job-header .badge:text("queued")')
    assert page.locator("#no-metrics").inner_text() == "The charts start with the first logged step (every 5 steps)."
    deadline = time.monotonic() + 20
    while not held and time.monotonic() < deadline:  # Playwright runs route handlers inside its own calls
        page.wait_for_timeout(100)
    assert held, "the page did not open its stream"
    stack.start_scheduler()
    wait_for(lambda: (client.get(f"/api/jobs/{job_id}").json()["step"] or 0) >= 10, 120, "the job to run")
    # The points stored while the stream was held are fetched, not left out of the charts;
    # the live points that come while that fetch is out wait for it, so the newest never
    # stands alone on a chart. The fetch is held back here until live points have come.
    stored = f"**/api/jobs/{job_id}/metrics?**"
    fetches: list[object] = []
    page.route(stored, lambda route: fetches.append(route))
    held[0].continue_()
    released = time.monotonic()
    page.wait_for_selector('.job-header .badge:text("running")', timeout=10_000)
    assert time.monotonic() - released < 3.0, "the header waited for its 5 s poll"
    step = client.get(f"/api/jobs/{job_id}").json()["step"]
    wait_for(lambda: client.get(f"/api/jobs/{job_id}").json()["step"] >= step + 10, 60, "live points")
    page.wait_for_timeout(500)
    assert fetches, "the page did not fetch the points stored before its stream"
    assert page.locator("#charts").get_attribute("data-points") == "0", "a live point was drawn alone"
    page.unroute(stored)
    for route in fetches:
        route.continue_()
    page.wait_for_selector('#charts[data-points]:not([data-points="0"])', timeout=3_000)
    assert page.locator("#no-metrics").is_hidden()
    first = int(page.locator("#charts").get_attribute("data-points") or 0)
    assert first >= 3  # steps 5 and 10 at least, stored before the stream started, and the live ones

    client.post(f"/api/jobs/{job_id}/cancel")
    page.wait_for_selector('.job-header .badge:text("cancelled")', timeout=60_000)
    assert page.locator("#cancel").count() == 0  # nothing to cancel once it ended
    assert page.locator("#clone").is_visible()


def test_a_failed_job_and_a_finished_sweep_say_so_and_offer_no_cancel(
    a_failed_job: tuple[str, str, object, int], db: Database, open_page: Callable[..., object]
) -> None:
    url, token, client, failed = a_failed_job
    sweep = client.post(
        "/api/sweeps", json={"name": "lr", "base": SPEC, "grid": {"hyperparameters.learning_rate": [0.1, 0.01]}}
    ).json()
    with db.write() as session:
        for job in session.scalars(select(Job).where(Job.sweep_id == sweep["id"])):
            job.state = JobState.SUCCEEDED

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{failed}")
    page.wait_for_selector('.job-header .badge:text("failed")')
    assert page.locator("#no-metrics").inner_text() == (
        "No metrics: the job failed before it logged a step. Its log below says why."
    )
    assert page.locator("#charts figure").count() == 0  # no empty frames
    assert page.locator("#cancel").count() == 0
    summary = page.locator(".summary dt").all_inner_texts()
    assert "Train loss" in summary and "Loss" not in summary  # the page labels its figures as the list does
    lines = [line.strip() for line in page.locator("main").inner_text().splitlines()]
    assert "null" not in lines  # no stray null between Spec and Artifacts
    shot(page, "job-failed-without-metrics")

    page.goto(f"{url}/#/gpus")  # simulated GPUs say so once, on their host's card
    page.wait_for_selector('[data-host="lab-a"] tr[data-gpu="1"]')
    assert page.locator('[data-host="lab-a"] h2 .badge.sim').count() == 1
    assert page.locator('[data-host="lab-a"] tbody .badge.sim').count() == 0

    page.goto(f"{url}/#/sweeps/{sweep['id']}")
    page.wait_for_selector("h1:has-text('Sweep #')")
    assert page.locator("#cancel-sweep").count() == 0


def test_the_jobs_list_labels_figures_says_why_and_takes_chosen_columns(
    a_failed_job: tuple[str, str, object, int], set_job: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url, token, client, failed = a_failed_job
    done = client.post("/api/jobs", json={**SPEC, "name": "fine"}).json()["id"]
    set_job(done, state=JobState.SUCCEEDED, loss=0.000004, accuracy=1.0, eval_accuracy=0.969, step=100000)
    dropped = client.post("/api/jobs", json={**SPEC, "name": "dropped"}).json()["id"]
    client.post(f"/api/jobs/{dropped}/cancel")

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs")
    page.wait_for_selector("table.jobs[data-drawn]")
    headings = page.locator("table.jobs th").all_inner_texts()
    assert "Train loss" in headings and "Eval accuracy" in headings
    assert "Loss" not in headings and "Accuracy" not in headings  # no figure under a plain heading
    why = page.locator(f'tr[data-job="{failed}"] td.why .reason')
    assert why.inner_text() == TRACEBACK.splitlines()[0]
    assert why.get_attribute("title") == TRACEBACK  # the whole text on hover
    assert page.locator(f'tr[data-job="{dropped}"] td.why').inner_text() == "cancelled by alice while queued"
    fine = page.locator(f'tr[data-job="{done}"]')
    assert "96.9%" in fine.inner_text() and "100.0%" not in fine.inner_text()  # eval, not train, accuracy

    page.click("#columns summary")
    page.check('#columns input[value="hp:learning_rate"]')
    page.check('#columns input[value="accuracy"]')
    assert "learning_rate" in page.locator("table.jobs th").all_inner_texts()
    assert "0.05" in fine.inner_text() and "100.0%" in fine.inner_text()
    shot(page, "jobs-chosen-columns")
    page.reload()
    page.wait_for_selector("table.jobs[data-drawn]")
    assert "learning_rate" in page.locator("table.jobs th").all_inner_texts()  # the choice is kept
    assert "Train accuracy" in page.locator("table.jobs th").all_inner_texts()


def test_a_job_an_executors_cluster_holds_says_why_it_waits_and_when_it_starts(
    a_failed_job: tuple[str, str, object, int], set_job: Callable[..., None], open_page: Callable[..., object]
) -> None:
    """On Slurm a job is `dispatched` (handed over) while Slurm keeps it pending: the list
    and its page say Slurm's reason and expected start, as they do for a queued job."""
    from datetime import UTC, datetime, timedelta

    url, token, client, _ = a_failed_job
    held = client.post("/api/jobs", json={**SPEC, "name": "in-slurm"}).json()["id"]
    reason = "Slurm job 41 is pending (Resources: the GPUs it asks for are in use)"
    at = datetime.now(UTC) + timedelta(minutes=90)
    set_job(held, state=JobState.DISPATCHED, pending_reason=reason, expected_start_at=at, expected_host="node7")

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs")
    page.wait_for_selector("table.jobs[data-drawn]")
    why = page.locator(f'tr[data-job="{held}"] td.why').inner_text()
    assert why.startswith(reason) and "; starts ~" in why and re.search(r" on node7 \(in 1h (29|30)m", why), why

    page.goto(f"{url}/?token={token}#/jobs/{held}")
    page.wait_for_selector('dd[data-field="Waiting"]')
    assert page.locator('dd[data-field="Waiting"]').inner_text() == reason
    assert re.search(r" on node7 \(in 1h (29|30)m", page.locator('dd[data-field="Expected start"]').inner_text())
