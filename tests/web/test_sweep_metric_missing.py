"""A sweep whose jobs succeeded without reporting its metric: its page says how a program
reports it (it showed a column of dashes and no word)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import update

from service.core.db import Database
from service.core.models import Job
from tests.stack import Stack

pytestmark = pytest.mark.slow
SWEEP = {
    "name": "lr",
    "base": {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}},
    "grid": {"hyperparameters.learning_rate": [0.1, 0.01]},
    "metric": "eval_f1",
}


def test_a_sweep_page_says_how_to_report_the_metric_no_job_reported(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()  # no scheduler: the test says how the jobs ended
    add_host("lab-a", 2)
    token = make_token("alice")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as alice:
        sweep = alice.post("/api/sweeps", json=SWEEP).json()
    with db.write() as session:
        ids = [job["id"] for job in sweep["jobs"]]
        session.execute(update(Job).where(Job.id.in_(ids)).values(state="succeeded", custom_metrics={"eval_f1": 0.8}))
    page = open_page()
    page.goto(f"{url}/?token={token}#/sweeps/{sweep['id']}")
    summary = page.locator("#sweep-summary")
    page.wait_for_function("document.querySelector('#sweep-summary')?.textContent.includes('done')")
    assert summary.inner_text().endswith(
        ' · no job that succeeded reported eval_f1: a program reports it with towerq.report(step=..., split="eval", '
        "f1=...); they reported eval_f1 as a training value, and an eval_ metric is read from evaluations"
    ), summary.inner_text()
