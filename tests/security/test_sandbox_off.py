"""Without bubblewrap a trainer reads `/proc/<worker>/environ` (the database password, the
Redis URL, the webhook secret) and whatever the worker's user can: a worker host must not
run members' code unsandboxed by accident. `auto` used to fall back to no sandbox with a
log line; now the worker refuses to start, and an admin's `none` is shown to everyone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import REPO, Stack, settings_env, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_a_worker_without_bubblewrap_refuses_to_start(settings: Settings, stack: Stack) -> None:
    stack.start_api()  # the schema is there
    env = settings_env(settings, sandbox="auto")
    env["PATH"] = str(Path(sys.executable).parent)  # no bwrap on this PATH
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "worker", "--name", "lab-b"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "trainers must run in a sandbox and bubblewrap is not installed" in done.stderr
    assert "TOWERQ_SANDBOX=none" in done.stderr


def test_towerq_up_without_bubblewrap_says_why_before_starting_anything(settings: Settings, tmp_path: Path) -> None:
    env = settings_env(settings, sandbox="auto")
    env["PATH"] = str(Path(sys.executable).parent)
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "up", "--port", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "trainers must run in a sandbox" in done.stderr, done.stderr[-2000:]
    assert not (settings.var_dir / "admin-token").exists() and not (settings.var_dir / "redis").exists()


def test_an_unsandboxed_host_is_shown_as_such(settings: Settings, stack: Stack, make_token: Callable[..., str]) -> None:
    stack.start_api()
    stack.start_worker("lab-a", 1, sandbox="none", trainer_pool=0)
    client = stack.client(make_token("alice"))
    gpus = wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    assert gpus[0]["sandboxed"] is False
    assert client.get("/api/workers").json()[0]["sandboxed"] is False
    env = {
        **os.environ,
        "TOWERQ_API_URL": stack.api_url or "",
        "TOWERQ_TOKEN": make_token("alice"),
        "HOME": str(settings.var_dir),
    }
    shown = subprocess.run(
        [sys.executable, "-m", "service.cli", "gpus"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "UNSANDBOXED" in shown.stdout and "WITHOUT a sandbox" in shown.stderr
    if os.geteuid() == 0:  # a root worker without the sandbox runs no notebook session either: said where
        assert "no notebooks" in shown.stdout
        assert "lab-a runs no notebook sessions: its worker runs as root" in shown.stdout
        assert client.get("/api/workers").json()[0]["no_notebooks"].startswith("its worker runs as root")
    assert "TRAINERS RUN WITHOUT A SANDBOX" in stack.logs["worker-lab-a"].read_text()
    client.close()
