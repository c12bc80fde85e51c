"""A sweep end to end: `towerq sweep --follow` launches 6 settings, which run one per
simulated GPU; the best job is the one with the best final metric; the sweep pages draw in
Chromium (table sorted and best marked, result against each field, all curves)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.stack import REPO, Stack, wait_for
from tests.web.conftest import shot

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SWEEP = """
name: lr-search
base:
  model: mlp
  dataset: digits
  gpu_count: 1
  hyperparameters: {steps: 60, log_every: 10, eval_every: 30}
grid:
  hyperparameters.learning_rate: [0.3, 0.01, 0.0003]
  hyperparameters.seed: [1, 2]
metric: eval_accuracy
goal: max
"""


def test_a_sweep_runs_one_setting_per_gpu_and_its_pages_draw(
    stack: Stack, make_token: Callable[..., str], open_page: Callable[..., object], tmp_path: Path
) -> None:
    url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 6)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: len(client.get("/api/gpus").json()) == 6, 30, "the worker to register its GPUs")
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)

    command = [sys.executable, "-m", "service.cli", "sweep", str(spec), "--follow", "--api", url, "--token", token]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    sweep_id = int(done.stdout.split()[1])
    assert "6/6 done (succeeded 6); best: job" in done.stdout.strip().splitlines()[-1]

    sweep = client.get(f"/api/sweeps/{sweep_id}").json()
    jobs = [client.get(f"/api/jobs/{j['id']}").json() for j in sweep["jobs"]]
    assert sorted(j["allocation"]["gpus"][0] for j in jobs) == [0, 1, 2, 3, 4, 5]  # one per GPU, all at once
    finals = {j["id"]: j["latest"]["eval_accuracy"] for j in jobs}
    assert sweep["best_job"] == max(finals, key=lambda job_id: (finals[job_id], job_id))
    assert {j["id"]: j["result"] for j in sweep["jobs"]} == finals

    page = open_page()
    page.goto(f"{url}/?token={token}#/sweeps")
    page.wait_for_selector(f'tr[data-sweep="{sweep_id}"]')
    page.click(f'tr[data-sweep="{sweep_id}"] a')
    page.wait_for_selector('#sweep-curves[data-series="6"]')
    assert page.locator("#sweep-table tbody tr").count() == 6
    best = page.locator("tr.best")
    assert best.count() == 1 and best.get_attribute("data-job") == str(sweep["best_job"])
    assert page.locator('#sweep-results figure[data-field="hyperparameters.learning_rate"] canvas').count() == 1
    # Sorted by the result, best first (goal max); then by learning rate, ascending.
    first_row = page.locator("#sweep-table tbody tr").first.get_attribute("data-job")
    assert first_row == str(sweep["best_job"])
    page.click('button[aria-label="Sort by learning_rate"]')
    rates = page.locator("#sweep-table tbody tr td:nth-child(3)").all_inner_texts()
    assert [float(r) for r in rates] == sorted(float(r) for r in rates)
    assert page.locator("#cancel-sweep").count() == 0  # nothing left to cancel: no button
    # A learning rate is read on a log axis; a seed gets whole ticks (issue 31: 1.1, 1.2).
    rate = page.locator('#sweep-results figure[data-field="hyperparameters.learning_rate"]')
    seed = page.locator('#sweep-results figure[data-field="hyperparameters.seed"]')
    assert rate.get_attribute("data-scale") == "log"
    assert (seed.get_attribute("data-scale"), seed.get_attribute("data-ticks")) == ("linear", "whole")
    shot(page, "sweep")
    page.goto(f"{url}/#/jobs/{sweep['best_job']}")
    page.wait_for_selector("#sweep-link")
    assert page.locator("#sweep-link").get_attribute("href") == f"#/sweeps/{sweep_id}"
    client.close()
