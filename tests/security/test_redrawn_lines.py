"""A program's carriage returns (`worker.lines`: a line redrawn with `\\r` is said as it
ended, and while redrawn as it stands at most every 10 s) as the attacker's tool, through
the real API, scheduler, worker and bubblewrap:

- a rank other than 0 of a job of one process per GPU hides a protocol line behind a
  carriage return, where the worker would take the line's last drawing as the line: each
  redraw of a rank's output is marked with its rank (`worker.gang`), so rank 0 alone speaks
  for the job (marked at a line's start only, the metric of step 999 became the job's);
- a program redraws a line without end, fast: the job's log gets one drawing per interval
  and the one it ended on, not one line per redraw.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, program_run

pytestmark = pytest.mark.slow

HIDDEN = r"""
import json, os, sys
forged = json.dumps({"event": "metric", "step": 999, "loss": 123.0})
if os.environ["RANK"] == "1":
    print("hello\r" + forged, flush=True)  # a line whose last drawing is a protocol line
    sys.stdout.write("\r" + forged)  # tqdm's way: a carriage return, then the drawing
    sys.stdout.flush()
    print(flush=True)
else:
    print(json.dumps({"event": "metric", "step": 1, "loss": 0.5}), flush=True)
"""

FLOOD = r"""
import sys, time
start = time.monotonic()
count = 0
while time.monotonic() - start < 12:
    count += 1
    sys.stderr.write(f"\rredraw {count}")
    if count % 1000 == 0:
        sys.stderr.flush()
sys.stderr.write(f"\rredrawn {count} times\n")
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_a_rank_hiding_a_protocol_line_behind_a_carriage_return_speaks_no_word_of_the_job(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("mallory"), 2)
    job, messages = program_run(client, {"hide.py": HIDDEN}, ["python", "hide.py"], gpu_count=2, processes="per_gpu")
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    assert [point["step"] for point in client.get(f"/api/jobs/{job['id']}/metrics").json()] == [1]
    hidden = [message for message in messages if "999" in message]
    assert len(hidden) == 2 and all(message.startswith("[rank 1] {") for message in hidden), hidden


def test_a_line_redrawn_without_end_is_a_few_lines_of_the_log(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("mallory"), 1)
    job, messages = program_run(client, {"flood.py": FLOOD}, ["python", "flood.py"])
    assert job["state"] == "succeeded", (job["error"], messages[-20:])
    said = [message for message in messages if message.startswith("redraw")]
    assert 2 <= len(said) <= 3, said  # at about 10 s (once its tick comes), and as it ended
    assert said[-1].startswith("redrawn ") and int(said[-1].split()[1]) > 10_000, said
