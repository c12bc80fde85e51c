"""A job's `env` is the member's to set, and it reached processes of towerq's that run as
root: the worker started bwrap (root) with the program's environment, because bwrap passes
its environment on, and bwrap started setpriv (root, keeping the capabilities to change
user) with it. What glibc and the tools read of the environment as they start and run (the
loader, `setlocale`, messages) was the member's to steer, as root. Refusing names one by one
(tests/security/test_tool_lookup.py) closes the known ones; now the environment comes on the
program's stdin, read by the sandbox's first step after the drop to the program's user
(`worker.sandbox_env.ENVIRONMENT_STEP`), and no process running as root holds any of it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.notebook_kernel import wait_ready
from tests.stack import Stack, finished, log_messages, upload_code, wait_for

pytestmark = pytest.mark.slow
MARK = "towerq-env-mark-5d1e"
WAIT = """
import os, time
print("mark", os.environ.get("MARK"), "stdin", os.readlink("/proc/self/fd/0"), flush=True)
time.sleep(120)
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def holders(mark: str) -> list[tuple[int, int, str]]:
    """(pid, effective uid, name) of every process on this host whose environment holds
    `MARK=mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            status = (entry / "status").read_text().splitlines()
        except OSError:  # gone meanwhile, or not readable
            continue
        if f"MARK={mark}".encode() in environ:
            uid = int(next(line for line in status if line.startswith("Uid:")).split()[2])
            name = next(line for line in status if line.startswith("Name:")).split()[1]
            found.append((int(entry.name), uid, name))
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the worker runs as root only where the tests do")
def test_no_process_running_as_root_holds_a_jobs_environment(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    client = stack.sandboxed_lab(make_token("mallory"), gpus=2)
    # a command job: its program has its environment (and /dev/null for stdin), nothing root does
    code = upload_code(client, {"wait.py": WAIT})
    created = client.post("/api/jobs", json={"command": ["python", "wait.py"], "code": code, "env": {"MARK": MARK}})
    assert created.status_code == 201, created.text
    job = created.json()["id"]
    said = wait_for(lambda: [m for m in log_messages(client, job) if m.startswith("mark ")], 120, "the program")
    assert said == [f"mark {MARK} stdin /dev/null"], said
    held = holders(MARK)
    assert held and not [h for h in held if h[1] == 0], held  # the program's user holds it; root does not

    # a notebook session: JupyterLab and what it starts, the same
    created = client.post("/api/jobs", json={"kind": "notebook", "env": {"MARK": MARK + "-session"}})
    assert created.status_code == 201, created.text
    session = created.json()["id"]
    wait_ready(client, session)
    held = holders(MARK + "-session")
    assert held and not [h for h in held if h[1] == 0], held

    for ended in (job, session):
        assert client.post(f"/api/jobs/{ended}/cancel").status_code == 202
        assert finished(client, ended, 60)["state"] == "cancelled"
