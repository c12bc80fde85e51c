"""A job over several hosts in a real browser: the job page lists every host's GPUs by rank,
and the Usage page's GPU timeline holds its bar on every GPU of every host."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.context import Context
from service.core.lifecycle import mark_running
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from tests.stack import Stack
from tests.web.conftest import shot
from towerq.contract.spec import JobSpec

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
    ctx = Context.open(settings)
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "alice")
            alice = Caller(user.id, user.name, False, 0)
        spec = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpu_count": 4, "name": "wide"})
        job, _ = submit(ctx.db, alice, spec, settings)
        LiveScheduler(ctx).run_pass()
        with ctx.db.write() as session:
            chief = mark_running(session, job.id, 1, {"pid": 4242}).host_name
    finally:
        ctx.close()
    other = "lab-b" if chief == "lab-a" else "lab-a"
    token = make_token("alice")

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{job.id}")
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
    held = page.locator(f'.gantt-bar[data-job="{job.id}"]')
    rows = held.evaluate_all("bars => bars.map(b => b.closest('.gantt-row').dataset.gpu)")
    assert sorted(rows) == ["lab-a:0", "lab-a:1", "lab-b:0", "lab-b:1"], rows

    page.goto(f"{url}/?token={token}#/jobs")
    page.wait_for_selector(f'tr[data-job="{job.id}"]')
    assert f"{chief}:0,1 + {other}:0,1" in page.locator(f'tr[data-job="{job.id}"]').inner_text()
