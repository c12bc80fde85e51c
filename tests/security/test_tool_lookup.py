"""A command job's `env` may set `PATH` (a program's own tools), and towerq started its own
tools by name with the program's environment: the worker (root) ran `bwrap` as found on
that `PATH`, outside the sandbox, and bwrap (root, keeping the capabilities to change user)
ran `setpriv` as found on it inside. A member planted an executable `bwrap` in a job's
folder and named the folder's host path (the API showed it; now admins only) first on another job's `PATH`:
it ran as root on the host. Or named first on `PATH` the folder of a job it waited for (its
input, at `/inputs/job-ID`), where that job had left a `setpriv`: it ran as uid 0 inside the
sandbox, before the drop to the trainer's user. towerq now starts its tools by their absolute paths, found with its own
`PATH`, never the program's; and a job's `env` may not set what glibc lets steer a
privileged program (`GCONV_PATH`, `GLIBC_TUNABLES`, `LOCPATH`, ...)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, log_messages, upload_code

pytestmark = pytest.mark.slow
PLANT = """
import os, sys
folder = sys.argv[1]
for tool in ("bwrap", "setpriv"):
    path = os.path.join(folder, tool)
    with open(path, "w") as script:
        script.write("#!/bin/sh\\nid -u > {marker}-" + tool + "\\nexec /usr/bin/" + tool + ' "$@"\\n')
    os.chmod(path, 0o755)
print("planted in", folder)
if os.path.exists("/tmp/inside-setpriv"):  # the sandbox's own /tmp: what ran before this program
    print("setpriv ran as uid", open("/tmp/inside-setpriv").read().strip())
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_towerq_never_finds_its_own_tools_on_a_jobs_path(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    client = stack.sandboxed_lab(make_token("mallory"))
    outside = tmp_path / "ran-as"  # a folder only the worker's user (root) reaches
    outside.mkdir(mode=0o700)
    code = upload_code(client, {"plant.py": PLANT.replace("{marker}", str(outside / "outside"))})

    def run(*args: str, **spec: object) -> dict:
        created = client.post("/api/jobs", json={"command": ["python", "plant.py", *args], "code": code, **spec})
        assert created.status_code == 201, created.text
        return finished(client, created.json()["id"])

    # a job leaves a `bwrap` in its folder; another names that folder's host path first on PATH
    first = run("/job/output")
    assert first["state"] == "succeeded", first
    planted = settings.artifacts_dir.resolve() / f"job-{first['id']}" / "output"
    assert (planted / "bwrap").is_file(), "the planted tool is where the next job looks"
    second = run("/tmp", env={"PATH": f"{planted}:/usr/bin:/bin"})
    assert second["state"] == "succeeded", (second, log_messages(client, second["id"])[-5:])
    assert not (outside / "outside-bwrap").exists(), "the worker ran a member's bwrap"

    # a job leaves a `setpriv` in its folder; the next job of a pipeline reads that folder
    # (its input, read only) and names it first on PATH: bwrap looked there, inside, as root
    code = upload_code(client, {"plant.py": PLANT.replace("{marker}", "/tmp/inside")})
    first = run("/job/output")
    second = run("/job", after=[first["id"]], env={"PATH": f"/inputs/job-{first['id']}/output:/usr/bin:/bin"})
    said = log_messages(client, second["id"])
    assert second["state"] == "succeeded", (second, said[-5:])
    assert not [line for line in said if line.startswith("setpriv ran as")], said

    # nor what glibc lets steer a privileged program (bwrap starts as root with the job's env)
    for name in ("GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES"):
        refused = client.post("/api/jobs", json={"command": ["true"], "code": code, "env": {name: "/job/output"}})
        assert refused.status_code == 422 and name in refused.text, (name, refused.text)
