"""An elastic job in a real browser: its page and the jobs list say how many of its GPUs it
holds, and a waiting one the sizes it may start at."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.context import Context
from service.core.models import Job, JobState
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from tests.stack import Stack
from towerq.contract.spec import JobSpec

pytestmark = pytest.mark.slow


def test_an_elastic_job_shows_2_of_4_gpus_and_a_waiting_one_its_sizes(
    stack: Stack,
    settings: Settings,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()
    add_host("lab-a", 4)
    token = make_token("alice")
    ctx = Context.open(settings)
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "alice")
            alice = Caller(user.id, user.name, False, 0)

        def job(**sizes: int) -> int:
            spec = JobSpec.model_validate({"model": "mlp", "dataset": "digits", **sizes})
            return submit(ctx.db, alice, spec, settings)[0].id

        job(gpu_count=2)
        LiveScheduler(ctx).run_pass()
        elastic, waiting = job(gpu_count=4, min_gpu_count=1), job(gpu_count=4, min_gpu_count=3)
        LiveScheduler(ctx).run_pass()
        with ctx.db.write() as session:  # a command job that ended: its steps are its program's
            spec = {"command": ["python", "train.py"], "code": "ab" * 32}
            program = Job(name="python train.py", user_id=user.id, state=JobState.SUCCEEDED, step=424, spec=spec,
                          gpu_count=1, attempts=1)  # fmt: skip
            silent = Job(name="python quiet.py", user_id=user.id, state=JobState.SUCCEEDED, spec=spec,
                         gpu_count=1, attempts=1, gpu_memory_fraction=0.5)  # fmt: skip
            session.add_all([program, silent])
            session.flush()
            program_id, silent_id = program.id, silent.id
    finally:
        ctx.close()

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{elastic}")
    gpus = page.locator("dt:text-is('GPUs') + dd")
    gpus.wait_for()
    assert "lab-a:2,3 (2 of 4, elastic)" in gpus.inner_text(), gpus.inner_text()
    assert page.locator("dt:text-is('Towers')").count() == 1, "a model job's towers"

    page.goto(f"{url}/?token={token}#/jobs")
    page.wait_for_selector(f'tr[data-job="{waiting}"]')
    assert "lab-a:2,3 (2 of 4, elastic)" in page.locator(f'tr[data-job="{elastic}"]').inner_text()
    assert "3 to 4 GPUs (elastic)" in page.locator(f'tr[data-job="{waiting}"]').inner_text()
    # A command job has no total of towerq's: its steps, no bar (it showed 424/1,000).
    row = page.locator(f'tr[data-job="{program_id}"]')
    assert "424 steps" in row.inner_text() and "/1,000" not in row.inner_text(), row.inner_text()
    assert row.locator("[role=progressbar]").count() == 0
    silent = page.locator(f'tr[data-job="{silent_id}"] td:nth-child(6)')  # reported no step: none (it said 0 steps)
    assert silent.inner_text() == "–", silent.inner_text()

    # A program's page: no towers or batch norm of the trainer; its share is watched by its worker, not TensorFlow.
    page.goto(f"{url}/?token={token}#/jobs/{silent_id}")
    fraction = page.locator("dt:text-is('Memory fraction') + dd")
    fraction.wait_for()
    assert fraction.inner_text() == "0.5 (watched by its worker: past it, the job is stopped)", fraction.inner_text()
    assert page.locator("dt:text-is('Towers')").count() == 0 and page.locator("dt:text-is('Batch norm')").count() == 0
    # Its bundle is no file of the API's: the code section says so, the rest of the page stands (it said only that).
    missing = page.locator("#code-missing")
    missing.wait_for()
    assert (
        missing.inner_text() == f"Its code cannot be shown: no code bundle {'ab' * 32}: upload it with POST /api/code"
    )
