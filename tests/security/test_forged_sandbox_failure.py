"""A program cannot pass its own failure off as the sandbox's (`worker.sandbox_status`): a
lost sandbox queues the job again as a crash, so a program that could fake one would get its
failures retried. bwrap's word comes on a pipe bwrap closes before the program runs; what the
program prints, bwrap's words included, is its own."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.faults.helpers import FINAL, wait_state
from tests.stack import Stack, upload_code

pytestmark = pytest.mark.slow

FORGER = """
import json, os, sys

# bwrap's status pipe, were it open here: every descriptor the program holds gets bwrap's line
for name in os.listdir("/proc/self/fd"):
    try:
        os.write(int(name), b'{ "child-pid": 2 }\\n')
    except OSError:
        pass
print("bwrap: Unable to apply mount flags: remount \\"/data\\": No such file or directory", file=sys.stderr)
sys.exit(1)
"""


def test_a_program_that_says_bwraps_words_fails_as_itself(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("alice"))
    code = upload_code(client, {"forger.py": FORGER})
    job_id = client.post("/api/jobs", json={"command": ["python", "forger.py"], "code": code}).json()["id"]
    done = wait_state(client, job_id, FINAL, 120)
    assert done["state"] == "failed" and (done["attempts"], done["crashes"]) == (1, 0), done
    assert done["error"] == (
        'the program exited with code 1: bwrap: Unable to apply mount flags: remount "/data": No such file or directory'
    )
