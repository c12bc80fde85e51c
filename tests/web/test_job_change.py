"""A job's Change form and Hold button in a real browser: its owner renames a queued job and
changes its priority, time limit (a duration as people write it) and begin, the API's refusals and
a duration that is none said beside the form; holds and releases it, and cannot release an
admin's hold; another member's job, and one that has ended, have neither. Once the job has
started, the form changes its name and time limit only, and a longer limit is refused
beside it. Before, only `PATCH /api/jobs/{id}` by hand changed them, and nothing held a job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
JOB = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}


def test_an_owner_changes_a_queued_jobs_name_priority_and_time_limit(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()  # no scheduler: the jobs stay queued
    add_host("lab-a", 2)
    alice_token, bob_token = make_token("alice"), make_token("bob")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {alice_token}"}) as alice:
        mine = alice.post("/api/jobs", json=JOB).json()["id"]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {bob_token}"}) as bob:
            theirs = bob.post("/api/jobs", json=JOB).json()["id"]
        page = open_page()
        page.goto(f"{url}/?token={alice_token}#/jobs/{mine}")
        page.wait_for_selector("#change")
        assert page.locator('[data-field="Time limit"]').inner_text() == "none"
        page.click("#change summary")
        form = page.locator("#change-job")
        error = "document.querySelector('#change-job .error').textContent"

        form.locator("button[type=submit]").click()
        page.wait_for_function(f"{error}.includes('Nothing changed')")
        form.locator('input[name="time_limit"]').fill("5x")
        form.locator("button[type=submit]").click()
        page.wait_for_function(f"{error}.includes('Time limit: \"5x\" is no duration')")
        form.locator('input[name="time_limit"]').fill("")
        form.locator('select[name="priority"]').select_option("high")  # above a member's highest
        form.locator("button[type=submit]").click()
        page.wait_for_function(f"{error}.includes('priority high is for admins')")
        assert alice.get(f"/api/jobs/{mine}").json()["priority"] == "normal"

        form.locator('select[name="priority"]').select_option("low")
        form.locator('input[name="time_limit"]').fill("2h 30m")
        form.locator('input[name="name"]').fill("renamed")
        form.locator("button[type=submit]").click()
        page.wait_for_function("document.querySelector('[data-field=\"Time limit\"]').textContent === '2h 30m'")
        job = alice.get(f"/api/jobs/{mine}").json()
        assert (job["name"], job["priority"], job["spec"]["time_limit_s"]) == ("renamed", "low", 9000), job
        assert page.locator("h1").inner_text().startswith(f"#{mine} renamed")
        page.click("#change summary")
        assert form.locator('input[name="time_limit"]').input_value() == "2h 30m"  # as the page wrote it: unchanged
        form.locator('input[name="name"]').fill("again")
        form.locator("button[type=submit]").click()
        page.wait_for_function("document.querySelector('h1').textContent.includes('again')")
        assert alice.get(f"/api/jobs/{mine}").json()["spec"]["time_limit_s"] == 9000

        # Its begin, until it first runs: a time on the page's clock, then emptied (it may start now)
        tomorrow = f"{(datetime.now() + timedelta(days=1)).date()}T22:00"
        page.click("#change summary")
        form.locator('input[name="begin_at"]').fill(tomorrow)
        form.locator("button[type=submit]").click()
        page.wait_for_selector('[data-field="Not before"]')
        assert page.locator("#toast").inner_text() == f"Job {mine}: begin changed"
        asked = datetime.fromisoformat(page.evaluate(f"new Date('{tomorrow}').toISOString()"))
        assert datetime.fromisoformat(alice.get(f"/api/jobs/{mine}").json()["spec"]["begin_at"]) == asked
        page.click("#change summary")
        assert form.locator('input[name="begin_at"]').input_value() == tomorrow
        form.locator('input[name="begin_at"]').fill("")
        form.locator("button[type=submit]").click()
        # the toast says the same words as for the first change: the API says when it is done
        begun = wait_for(
            lambda: (
                (at := datetime.fromisoformat(alice.get(f"/api/jobs/{mine}").json()["spec"]["begin_at"])) < asked and at
            ),
            30,
            "its begin moved to now",
        )
        assert abs((begun - datetime.now(UTC)).total_seconds()) < 60, begun

        # Hold and Release: the queue line says who holds it; an admin's hold is the admin's to release
        page.click("#hold")
        page.wait_for_function("document.querySelector('#hold')?.textContent === 'Release'")
        queue = page.locator('[data-field="Queue"]').inner_text()
        assert queue == f"on hold (alice): towerq release {mine} lets it start", queue
        assert alice.get(f"/api/jobs/{mine}").json()["on_hold_by"] == "alice"
        page.click("#hold")
        page.wait_for_function("document.querySelector('#hold')?.textContent === 'Hold'")
        assert alice.get(f"/api/jobs/{mine}").json()["on_hold_by"] is None
        root = {"Authorization": f"Bearer {make_token('root', True)}"}
        assert alice.post(f"/api/jobs/{mine}/hold", headers=root).status_code == 200
        page.reload()
        page.wait_for_selector("#hold[disabled]")
        assert "only an admin may release it" in (page.locator("#hold").get_attribute("title") or "")
        assert alice.post(f"/api/jobs/{mine}/release", headers=root).status_code == 200

        page.goto(f"{url}/?token={alice_token}#/jobs/{theirs}")  # bob's: no form
        page.wait_for_selector('[data-field="Priority"]')
        assert page.locator("#change").count() == 0 and page.locator("#hold").count() == 0
        alice.post(f"/api/jobs/{mine}/cancel")
        page.goto(f"{url}/?token={alice_token}#/jobs/{mine}")  # ended: nothing to change
        page.wait_for_selector('[data-field="Priority"]')
        assert page.locator("#change").count() == 0


def test_a_started_jobs_time_limit_is_shortened_on_its_page_not_lengthened(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    stack.start_scheduler()  # no worker: the job is placed and stays dispatched
    token = make_token("alice")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as alice:
        job_id = alice.post("/api/jobs", json={**JOB, "time_limit_s": 3600}).json()["id"]
        wait_for(lambda: alice.get(f"/api/jobs/{job_id}").json()["state"] == "dispatched", 30, "the pass to place it")
        page = open_page()
        page.goto(f"{url}/?token={token}#/jobs/{job_id}")
        page.wait_for_selector("#change")
        page.click("#change summary")
        form = page.locator("#change-job")
        assert form.locator('select[name="priority"]').count() == 0, "a started job's priority stays"
        assert form.locator('input[name="begin_at"]').count() == 0, "a started job's begin has passed"
        error = "document.querySelector('#change-job .error').textContent"
        form.locator('input[name="time_limit"]').fill("2h")
        form.locator("button[type=submit]").click()
        page.wait_for_function(f"{error}.includes('only an admin lengthens')")
        form.locator('input[name="time_limit"]').fill("30m")
        form.locator("button[type=submit]").click()
        page.wait_for_function("document.querySelector('[data-field=\"Time limit\"]').textContent === '30m 0s'")
        job = alice.get(f"/api/jobs/{job_id}").json()
        assert (job["state"], job["spec"]["time_limit_s"]) == ("dispatched", 1800), job
        assert job["events"][-1]["message"] == "time limit 1h → 30m by alice"
