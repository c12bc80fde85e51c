"""The suite leaves nothing running: a run whose tests leave a process behind fails and
names it (checked on a small run of its own, with the suite's own hooks)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.conftest import RUN_MARK
from tests.stack import REPO, ends_with_its_killed_starter, settings_env
from worker.processes import pid_alive

pytestmark = pytest.mark.slow

CONFTEST = "from tests.conftest import pytest_configure, pytest_sessionfinish  # noqa: F401\n"
LEAKY = """
import subprocess

def test_starts_a_process_and_forgets_it():
    subprocess.Popen(["sleep", "300"], start_new_session=True)
"""


def test_a_run_that_leaves_a_process_behind_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    env = {k: v for k, v in os.environ.items() if k != RUN_MARK}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "processes left running by the tests:" in run.stdout
    assert "sleep 300" in run.stdout
    mark = next(line for line in run.stdout.splitlines() if "sleep 300" in line)
    assert mark.strip().startswith("pid ")
    leftover = int(mark.split()[1])
    assert not pid_alive(leftover)  # killed, so the next run starts clean


HOLDER = """
import sys, time
from pathlib import Path
from service.core.settings import Settings
from tests.stack import Stack

stack = Stack(Settings(), Path(sys.argv[1]))
stack.start_api()
print(stack.processes["api"].pid, flush=True)
time.sleep(600)
"""


def test_a_killed_test_process_leaves_none_of_its_stack_behind(
    make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path
) -> None:
    """A pytest worker killed outright runs no teardown: the services its tests started (an
    API here) get the parent-death signal instead of running on for good."""
    env = settings_env(make_settings(sqlite_url))
    ends_with_its_killed_starter(HOLDER, str(tmp_path), what="the API", env=env)
