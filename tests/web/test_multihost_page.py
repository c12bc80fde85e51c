"""A job over several hosts in a real browser: the job page lists every host's GPUs by rank,
and the Usage page's GPU timeline holds its bar on every GPU of every host."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack
from tests.web.conftest import shot
from tests.worker.test_host import two_host_job

pytestmark = pytest.mark.slow


def test_the_job_page_and_the_timeline_show_every_host_of_a_job_over_two_hosts(
    stack: Stack,
    settings: Settings,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    add_host("lab-b", 2)
    job_id, chief, other = two_host_job(settings)
    token = make_token("alice")

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{job_id}")
    page.wait_for_selector("#ranks li")
    ranks = page.locator("#ranks li")
    assert ranks.count() == 2
    assert f"GPUs 0,1 on {chief}" in ranks.nth(0).inner_text() and "rank 0" in ranks.nth(0).inner_text()
    assert f"GPUs 0,1 on {other}" in ranks.nth(1).inner_text() and "rank 1" in ranks.nth(1).inner_text()
    gpus = page.locator("dt:text-is('GPUs') + dd").inner_text()
    assert f"{chief}:0,1 + {other}:0,1" in gpus, gpus
    uuids = page.locator("dt:text-is('GPU UUIDs') + dd").inner_text()
    assert len(uuids.split(", ")) == 4, uuids
    shot(page, "job-over-two-hosts")

    page.goto(f"{url}/?token={token}#/usage")
    page.wait_for_selector(".gantt-bar")
    held = page.locator(f'.gantt-bar[data-job="{job_id}"]')
    rows = held.evaluate_all("bars => bars.map(b => b.closest('.gantt-row').dataset.gpu)")
    assert sorted(rows) == ["lab-a:0", "lab-a:1", "lab-b:0", "lab-b:1"], rows

    page.goto(f"{url}/?token={token}#/jobs")
    page.wait_for_selector(f'tr[data-job="{job_id}"]')
    assert f"{chief}:0,1 + {other}:0,1" in page.locator(f'tr[data-job="{job_id}"]').inner_text()
