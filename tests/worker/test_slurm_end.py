"""A Slurm node's runner that must end its attempt before it ran (a refused claim) and
cannot tell the API (out of reach past the channel's patience) says so in Slurm's log and
exits; the scheduler then records the end from what Slurm says of the job."""

from __future__ import annotations

import logging

import pytest

from tests.stack import free_port
from towerq.attempts import HttpChannel
from towerq.contract.attempts import AttemptEnd
from worker.slurm import end_early


def test_an_end_the_api_cannot_be_told_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    channel = HttpChannel(f"http://127.0.0.1:{free_port()}", "tqa_x", 5, 1, retry_for=0.5)  # nothing listens
    try:
        with caplog.at_level(logging.ERROR, logger="towerq.slurm"):
            end_early(channel, AttemptEnd("queued", "node n1 could not claim it: ...", crashed=True))
    finally:
        channel.close()
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        "job 5 attempt 1: node n1 could not claim it: ...",
        "job 5 attempt 1: its end could not be told to the API",
    ]
