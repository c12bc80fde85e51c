"""A job page with a long series: it loads a down-sampled overview from the server, and a
range dragged across on a chart comes again at full resolution. (That the overview keeps
each bucket's extremes is the API's test, test_metrics_downsampled.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert

from service.core.db import Database
from service.core.models import Metric
from tests.stack import Stack
from tests.web.conftest import shot

pytestmark = pytest.mark.slow
STEPS = 40_000


def test_a_long_series_loads_down_sampled_and_a_zoomed_range_at_full_resolution(
    stack: Stack,
    db: Database,
    make_token: Callable[..., str],
    add_host: Callable[..., None],
    open_page: Callable[..., object],
) -> None:
    url = stack.start_api()
    add_host("lab-a", 1)
    token = make_token("alice")
    client = stack.client(token)
    job_id = client.post("/api/jobs", json={"model": "mlp", "dataset": "digits", "gpus": [0]}).json()["id"]
    now = datetime.now(UTC)
    rows = [
        {"job_id": job_id, "attempt": 1, "step": step, "split": "train", "time": now, "accuracy": 0.5,
         "loss": 2.0 - step / STEPS}
        for step in range(1, STEPS + 1)
    ]  # fmt: skip
    with db.write() as session:
        session.execute(insert(Metric), rows)

    page = open_page()
    page.goto(f"{url}/?token={token}#/jobs/{job_id}")
    page.wait_for_selector('#charts[data-points]:not([data-points="0"])')
    shown = int(page.locator("#charts").get_attribute("data-points") or 0)
    assert 1000 <= shown <= 2000, shown  # an overview, not 40,000 points
    shot(page, "long-series-overview")

    # Drag across 1/80 of the loss chart's plotting area: ~500 steps, all of them loaded.
    over = page.locator("#chart-loss .u-over")
    box = over.bounding_box()
    assert box is not None
    start = box["x"] + box["width"] * 0.5
    page.mouse.move(start, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(start + box["width"] / 80, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    page.wait_for_selector("#charts[data-zoom-points]")
    in_range = int(page.locator("#charts").get_attribute("data-zoom-points") or 0)
    total = int(page.locator("#charts").get_attribute("data-points") or 0)
    assert 300 <= in_range <= 700, in_range  # every step of the range, not 1 in 20
    assert total > shown
    shot(page, "long-series-zoomed")
    client.close()
