"""The Usage page in a real browser, over several users' allocations: GPUs per user
stacked, a timeline bar per allocation (hover names the job, a click opens it), the queue
chart, the window's totals per user (GPU hours, jobs, waits, how busy the sampled GPUs
were), and the fair-share table as the scheduler ranks users now."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from service.core.db import Database
from service.core.models import Job
from tests.service.api.test_usage import add_run, lab_user_queued
from tests.stack import Stack
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


def test_the_usage_page_shows_who_held_which_gpu_and_the_fair_share(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    add_host("lab-b", 1)
    now = datetime.now(UTC)
    ago = lambda h: now - timedelta(hours=h)  # noqa: E731
    runs = [
        add_run(db, "alice", "lab-a", [0, 1], ago(20), ago(19), ago(12)),
        add_run(db, "bob", "lab-a", [0], ago(13), ago(11), ago(5)),
        add_run(db, "carol", "lab-b", [0], ago(9), ago(8), None, fraction=0.5),
        add_run(db, "alice", "lab-a", [1], ago(6), ago(4), None),
    ]
    lab_user_queued(db, "bob")
    with db.write() as session:  # what alice's first job's worker sampled of its GPUs
        job = session.get(Job, runs[0])
        assert job is not None
        job.gpu_use = {"1.0": {"rank": 0, "gpus": 2, "samples": 9, "busy_pct": 64.0, "memory_peak_mb": 1}}
    token = make_token("alice")

    page = open_page()
    page.goto(f"{url}/?token={token}#/usage")
    page.wait_for_selector("#chart-gpus-per-user .uplot")
    assert page.locator("#chart-gpus-per-user").get_attribute("data-users") == "alice,bob,carol"
    legend = page.locator("#chart-gpus-per-user .u-legend").inner_text()
    assert all(user in legend for user in ("alice", "bob", "carol"))
    page.wait_for_selector("#chart-queue .uplot")
    # GPU hours, jobs, waits and how busy the sampled GPUs were, per user over the window
    totals = page.locator("#usage-totals tbody tr")
    assert totals.evaluate_all("rs => rs.map(r => r.dataset.key)") == ["alice", "bob", "carol"]  # most GPU-hours first
    cells = lambda key: page.locator(f'#usage-totals tr[data-key="{key}"] td').all_inner_texts()  # noqa: E731
    assert cells("bob")[1:3] == ["6.0", "1"] and cells("bob")[5] == "–", cells("bob")  # never sampled
    assert cells("alice")[5] == "64%", cells("alice")  # only its first job was sampled

    rows = page.locator(".gantt-row:not(.gantt-axis)")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.gpu)")) == ["lab-a:0", "lab-a:1", "lab-b:0"]
    assert page.locator(".gantt-bar").count() == 5  # one per GPU of each allocation
    bar = page.locator(f'.gantt-row[data-gpu="lab-b:0"] .gantt-bar[data-job="{runs[2]}"]')
    assert f"job {runs[2]}" in (bar.get_attribute("title") or "") and "carol" in (bar.get_attribute("title") or "")
    assert "now" in (bar.get_attribute("title") or "")  # still held

    table = page.locator("#fair-share table")
    assert sorted(table.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.user)")) == [
        "alice", "bob", "carol",
    ]  # fmt: skip
    bob = table.locator('tr[data-user="bob"] td')
    assert bob.nth(4).inner_text() == "1" and bob.nth(7).inner_text() != "–"  # queued, so ranked
    shot(page, "usage")

    page.click('a.window:text("last week")')
    page.wait_for_url("**/#/usage?window=week")
    page.wait_for_selector("#chart-gpus-per-user .uplot")
    bar = page.locator(f'.gantt-bar[data-job="{runs[1]}"]')
    bar.click()
    page.wait_for_url(f"**/#/jobs/{runs[1]}")
    page.wait_for_selector(".job-header")


def test_the_usage_charts_fit_the_lab_show_short_jobs_and_read_at_phone_width(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    """Issue 31: on a 4-GPU lab the GPU chart spanned 0-100 and stayed flat at 0 after 12
    short jobs; the queue chart spanned 0-100 with nobody waiting; numbers stood under the
    wrong headings."""
    url = stack.start_api()
    add_host("lab-a", 4)
    now = datetime.now(UTC)
    for index in range(12):  # a minute each, an hour apart: shorter than a chart bucket (~5 min)
        start = now - timedelta(hours=12 - index)
        add_run(db, "alice", "lab-a", [index % 4], start, start, start + timedelta(minutes=1))
    token = make_token("alice")

    for viewport in ((1280, 900), (390, 844)):
        page = open_page(viewport=viewport)
        page.goto(f"{url}/?token={token}#/usage")
        page.wait_for_selector("#chart-gpus-per-user .uplot")
        page.wait_for_selector("#chart-queue .uplot")
        gpus = page.locator("#chart-gpus-per-user")
        assert gpus.get_attribute("data-scale") == "4"  # the lab, not 0-100
        assert 0.1 < float(gpus.get_attribute("data-peak") or 0) <= 1  # a minute in a ~5-minute bucket
        queue = page.locator("#chart-queue")
        assert queue.get_attribute("data-most") == "0" and queue.get_attribute("data-unit") == "s"
        widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1], f"the page scrolls sideways at {viewport}: {widths}"
        table = page.locator("#fair-share table")
        headings = table.locator("th").evaluate_all("hs => hs.map(h => getComputedStyle(h).textAlign)")
        cells = (
            table.locator("tbody tr")
            .first.locator("td")
            .evaluate_all("cs => cs.map(c => getComputedStyle(c).textAlign)")
        )
        assert headings == cells, "every heading aligned as the figures under it"
        shot(page, f"usage-{viewport[0]}")


def test_admins_replay_the_labs_history_under_other_settings(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    from tests.service.api.test_what_if import three_hour_long_jobs_on_one_gpu

    url = stack.start_api()
    add_host("solo", 1)
    three_hour_long_jobs_on_one_gpu(db)
    member = open_page()
    member.goto(f"{url}/?token={make_token('alice')}#/usage")
    member.wait_for_selector("#chart-gpus-per-user .uplot")
    assert member.locator("#what-if").count() == 0  # admins only

    page = open_page()
    page.goto(f"{url}/?token={make_token('root', True)}#/usage")
    page.wait_for_selector("#what-if")
    page.fill("#wi-hosts", "0")
    page.click("#what-if button[type=submit]")
    page.wait_for_function("document.querySelector('#what-if .error')?.textContent.includes('hosts')")
    page.fill("#wi-hosts", "3")
    page.fill("#wi-slice", "0")
    page.click("#what-if button[type=submit]")
    page.wait_for_selector("table.what-if")
    wait = page.locator('table.what-if tr[data-metric="max_wait_s"] td').all_inner_texts()
    assert wait[1:] == ["2h 0m", "0s", "0.00×"], wait
    each_user = page.locator('table.what-if tr[data-metric="user_avg_jct_s"] td').all_inner_texts()
    assert each_user[1:] == ["2h 0m", "1h 0m", "0.50×"], each_user
    assert "3 × 1 GPUs" in page.locator("table.what-if thead").inner_text()
    assert page.locator("table.what-if-users tbody tr").count() == 3
    shot(page, "usage-what-if")


def test_a_new_labs_usage_is_not_squeezed_into_the_end_of_the_day(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    """A lab whose first job ran 20 minutes ago: its charts begin shortly before that, not
    24 hours back with everything in their last pixels."""
    url = stack.start_api()
    add_host("lab-a", 2)
    now = datetime.now(UTC)
    first = now - timedelta(minutes=20)
    add_run(db, "alice", "lab-a", [0], first, first, first + timedelta(minutes=10))
    page = open_page()
    page.goto(f"{url}/?token={make_token('alice')}#/usage")
    page.wait_for_selector("#chart-gpus-per-user .uplot")
    begins = int(page.locator("#chart-gpus-per-user").get_attribute("data-from") or 0)
    assert first.timestamp() - 600 <= begins <= first.timestamp(), (begins, first.timestamp())
    assert float(page.locator("#chart-gpus-per-user").get_attribute("data-peak") or 0) > 0.5
