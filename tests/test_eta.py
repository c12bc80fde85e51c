"""A running job's expected end, against its real end: from 20 % to 80 % of its steps, the
end the API expects (at the job's wall-clock pace, its evaluations and checkpoints
included) is within 25 % of the time that was really left to its last step. The training-only time per step the
trainer reports, which the ETAs used before, says far too soon on the same job."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, wait_for

pytestmark = pytest.mark.slow
STEPS = 5000
SPEC = {
    "model": "mlp",
    "dataset": "synthetic",
    # evaluations of a large test split every 100 steps: a good share of the job's time
    "dataset_options": {"shape": [8, 8, 1], "train_examples": 2000, "test_examples": 60_000},
    "gpu_count": 1,
    "hyperparameters": {"steps": STEPS, "batch_size": 32, "log_every": 20, "eval_every": 100, "checkpoint_every": 500},
}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_the_expected_end_holds_within_a_quarter_of_what_was_left(stack: Stack, make_token: Callable[..., str]) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_nice=0)  # the estimate is tested, not how a niced trainer starves
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    job_id = client.post("/api/jobs", json=SPEC).json()["id"]
    seen: list[tuple[float, int, float, float | None]] = []  # made at, step, expected end, training-only end
    while True:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        step = job["step"] or 0
        if job["expected_end_at"] and 0.2 * STEPS <= step <= 0.8 * STEPS:
            now = datetime.fromisoformat(job["step_at"]).timestamp()  # when the estimate was made
            expected = datetime.fromisoformat(job["expected_end_at"]).timestamp()
            step_time = job["latest"]["step_time_s"]
            training_only = now + (STEPS - step) * step_time if step_time else None
            seen.append((now, step, expected, training_only))
        time.sleep(0.5)
    job = finished(client, job_id)
    assert job["state"] == "succeeded", job["reason"]
    end = datetime.fromisoformat(job["step_at"]).timestamp()  # its last step, as the expected end means
    assert len(seen) >= 5, f"only {len(seen)} looks between 20% and 80% of the steps"
    errors = [abs(expected - end) / (end - made) for made, _, expected, _ in seen]
    old = sorted(abs(only - end) / (end - made) for made, _, _, only in seen if only is not None)
    median, worst, old_median = sorted(errors)[len(errors) // 2], max(errors), old[len(old) // 2]
    print(f"expected end off by {median:.0%} of what was left (median; worst {worst:.0%}); old: {old_median:.0%}")
    # The median, not the worst: on a machine whose other work takes the CPU in bursts (the
    # suite's other tests), the job's own pace changes, and no estimate can follow it. Alone
    # the worst look was 13-23 % off; beside two CPU-bound processes, 21-25 % (median 6-14 %);
    # with the trainer at its default niceness there, 29-40 % (it starves in bursts).
    assert median <= 0.25, [(step, round(e, 2)) for (_, step, _, _), e in zip(seen, errors, strict=True)]
    assert old_median > 0.5, "the old ETA was as good here: this job does not show the difference"
