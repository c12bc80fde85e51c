"""An elastic job through the whole service (issue 47): a real API, scheduler and worker on
4 simulated GPUs. It starts on the 2 GPUs that are free, grows to 4 when they go idle, and
shrinks to 2 for a job that waits, each time by a stop at a checkpoint and a start from it
on its new GPUs; it trains every step once, at the global batch of its full size. (A
resize must save twice its cost on what the job has left, so the job is a long one, ended
by a cancel once it has trained on after its last resize.)"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.browser import shot
from tests.faults.helpers import FINAL, assert_metrics_continuous, backdate_allocations, wait_state, wait_step
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
STEPS = 1_000_000
ELASTIC = {
    "model": "mlp",
    "dataset": "digits",
    "gpu_count": 4,
    "min_gpu_count": 1,
    "hyperparameters": {"steps": STEPS, "batch_size": 8, "log_every": 10, "checkpoint_every": 50_000},
}
HOLDER = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 10_000_000, "batch_size": 8}}
RAN_HOURS = 0.2
"""As if the attempt had run 12 minutes: past the 10 between resizes, well within a time slice."""


def test_an_elastic_job_starts_small_grows_and_shrinks_and_trains_every_step_once(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object]
) -> None:
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 4)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register")

    holder = client.post("/api/jobs", json={**HOLDER, "gpus": [0, 1]}).json()["id"]
    wait_state(client, holder, ("running",), 120)
    elastic = client.post("/api/jobs", json=ELASTIC).json()["id"]
    job = wait_step(client, elastic, 50, 120)
    assert (job["allocation"]["gpus"], job["towers"]) == ([2, 3], 2), "it started on the 2 GPUs free"

    backdate_allocations(stack.settings.database_url, elastic, RAN_HOURS)
    client.post(f"/api/jobs/{holder}/cancel")  # GPUs 0 and 1 go idle: it grows onto them
    job = wait_for(
        lambda: (j := client.get(f"/api/jobs/{elastic}").json())["attempts"] == 2 and j["towers"] == 4 and j,
        120,
        "the job to grow to 4 GPUs",
        0.3,
    )
    assert job["allocation"]["gpus"] == [0, 1, 2, 3]
    grown = wait_step(client, elastic, job["step"] + 50, 120)

    backdate_allocations(stack.settings.database_url, elastic, RAN_HOURS)
    waiting = client.post("/api/jobs", json={**HOLDER, "gpu_count": 2, "hyperparameters": {"steps": 30}}).json()["id"]
    assert wait_state(client, waiting, FINAL, 180)["state"] == "succeeded"
    job = wait_for(
        lambda: (j := client.get(f"/api/jobs/{elastic}").json())["attempts"] == 3 and j["towers"] == 2 and j,
        120,
        "the job to run on 2 GPUs again",
        0.3,
    )
    assert job["allocation"]["gpus"] == [0, 1]
    wait_step(client, elastic, job["step"] + 50, 120)
    client.post(f"/api/jobs/{elastic}/cancel")
    done = wait_state(client, elastic, FINAL, 120)
    assert (done["state"], done["attempts"], done["crashes"]) == ("cancelled", 3, 0)

    events = [e["message"] for e in done["events"] if e["state"] in ("queued", "dispatched")]
    assert events[1:] == [
        "GPUs 2,3 on lab-a (2 of 4 GPUs, elastic)",
        "growing to 4 of 4 GPUs (idle ones): it restarts on GPUs 0,1,2,3 of lab-a from its checkpoint",
        "GPUs 0,1,2,3 on lab-a",
        f"shrinking to 2 of 4 GPUs for job {waiting}: it restarts on GPUs 0,1 of lab-a from its checkpoint",
        "GPUs 0,1 on lab-a (2 of 4 GPUs, elastic)",
    ], events
    logs = [line["message"] for line in client.get(f"/api/jobs/{elastic}/logs", params={"tail": 5000}).json()]
    resumed = [m for m in logs if "resumed from the checkpoint of step" in m]
    assert len(resumed) == 2, resumed
    last = done["step"] - done["step"] % 10
    assert last > grown["step"]
    assert_metrics_continuous(client, elastic, 10, last)  # every step once, none twice or missing

    # Its page: the GPUs each attempt held, and its charts marking where it grew and shrank.
    starts = [(h["gpus"], h["from_step"]) for h in done["held"]]
    assert [gpus for gpus, _ in starts] == [2, 4, 2] and starts[0][1] == 0 < starts[1][1] < starts[2][1], starts
    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{elastic}")
    page.wait_for_selector("#held li")
    assert page.locator("#held li").count() == 3
    assert page.locator("#held li").nth(1).inner_text().startswith("attempt 2: 4 GPUs on lab-a")
    page.wait_for_selector("#charts[data-marks]")
    marks = json.loads(page.locator("#charts").get_attribute("data-marks") or "[]")
    assert marks == [
        {"step": starts[1][1], "label": "2→4 GPUs"},
        {"step": starts[2][1], "label": "4→2 GPUs"},
    ], marks
    shot(page, "elastic-job")
