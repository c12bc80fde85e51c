"""A sandbox that did not start its command (bwrap's setup failed: in a lab, a neighbour's
disk unmounted under a folder the view shows, bubblewrap issue 650; here, the job's code
bundle folder gone for a moment) is an attempt lost, not the program's failure: the job
queues again, as a crash, saying why, and starts once bwrap can set it up. Before, it failed
at once with bwrap's words for its program's ("the program exited with code 1: bwrap:
...")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.faults.helpers import FINAL, wait_state
from tests.stack import Stack, upload_code, wait_for
from towerq.contract.paths import bundle_root

pytestmark = pytest.mark.slow


def test_a_sandbox_that_did_not_start_queues_the_job_again_and_it_runs_once_it_can(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("alice"))
    code = upload_code(client, {"hello.py": "print('hello from the program')\n"})
    folder = bundle_root(settings.code_dir, code)
    aside = folder.with_name("aside")
    folder.rename(aside)  # bwrap cannot show it: its setup fails before the program runs

    job_id = client.post(
        "/api/jobs", json={"command": ["python", "hello.py"], "code": code, "max_attempts": 10}
    ).json()["id"]
    lost = wait_for(
        lambda: next((e for e in client.get(f"/api/jobs/{job_id}").json()["events"] if e["state"] == "queued"
                      and "sandbox" in (e["message"] or "")), None),
        60, "the lost attempt to queue it again",
    )  # fmt: skip
    aside.rename(folder)
    assert lost["message"].startswith("the sandbox did not start (bwrap: Can't find source path "), lost
    assert lost["message"].endswith("): queued again"), lost

    done = wait_state(client, job_id, FINAL, 120)
    logs = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    assert done["state"] == "succeeded", (done, logs[-20:])
    assert done["crashes"] >= 1 and done["attempts"] == done["crashes"] + 1, done
    assert "hello from the program" in logs
