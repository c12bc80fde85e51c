"""A command job's own packages (`requirements`, `towerq run -r requirements.txt`): a
Python environment over the lab's, built on the host once for each list from the lab's
index (here a folder of wheels the worker is told of with `TOWERQ_PIP_OPTIONS`), reused,
kept to `TOWERQ_ENVS_MAX`, and refused with pip's reason when it cannot be built; a
notebook session's JupyterLab, kernel and shells run on it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.settings import Settings
from tests.notebook_kernel import run_code, start_kernel, wait_ready
from tests.stack import REPO, Stack, finished, log_messages, upload_code, wait_for
from tests.test_command_jobs import towerq_cli
from tests.wheels import wheel

pytestmark = pytest.mark.slow
PROBE = """
import sys, numpy, towerq, towerq_probe
print("PROBE", towerq_probe.VALUE, sys.prefix == sys.base_prefix, numpy.__name__, towerq.__name__)
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def lab_with_pip(stack: Stack, token: str, pip_options: str, **worker: object) -> httpx.Client:
    """The API, a scheduler and a sandboxed one-GPU worker whose pip is told `pip_options`;
    a client as `token`'s user, once the worker is up."""
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, sandbox="bwrap", trainer_pool=0, pip_options=pip_options, **worker)
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    return client


def lab_with_an_index(stack: Stack, token: str, index: Path) -> httpx.Client:
    return lab_with_pip(stack, token, f"--no-index --find-links {index}", envs_max=2)


def submit_probe(client: httpx.Client, code: str, requirements: list[str]) -> int:
    """PROBE (bundle `code`) with `requirements`, submitted: its id."""
    spec = {"command": ["python", "probe.py"], "code": code, "requirements": requirements}
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    return int(created.json()["id"])


def probe(client: httpx.Client, code: str, requirements: list[str]) -> tuple[dict[str, Any], list[str]]:
    """PROBE (bundle `code`) run with `requirements`, to its end: the job, its log's messages."""
    job = finished(client, submit_probe(client, code, requirements))
    return job, log_messages(client, job["id"])


def test_a_program_runs_with_its_requirements_over_the_labs_packages_built_once_per_list(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    index = tmp_path / "index"
    index.mkdir()
    for version in ("1.0", "2.0"):
        wheel(index, "towerq-probe", version, {"towerq_probe.py": f"VALUE = 'v{version}'\n"})
    token = make_token("alice")
    client = lab_with_an_index(stack, token, index)
    code = upload_code(client, {"probe.py": PROBE})

    # the first job builds its environment: its package, and the lab's (numpy, towerq) still
    job, said = probe(client, code, ["towerq-probe==1.0"])
    assert job["state"] == "succeeded", (job["error"], said[-20:])
    assert "PROBE v1.0 False numpy towerq" in said, said[-20:]
    assert any(m.startswith("installing 1 requirement on this host, once: towerq-probe==1.0") for m in said), said
    assert any(m.startswith("pip: Successfully installed towerq-probe-1.0") for m in said), said

    # the same list again: reused, not built
    job, said = probe(client, code, ["towerq-probe==1.0"])
    assert job["state"] == "succeeded" and "PROBE v1.0 False numpy towerq" in said, (job["error"], said[-20:])
    assert any("its requirements are installed on this host already" in m for m in said), said
    assert not any(m.startswith("pip:") for m in said), said

    # another list, another environment; one pip cannot satisfy fails the job with pip's reason
    job, said = probe(client, code, ["towerq-probe==2.0"])
    assert job["state"] == "succeeded" and "PROBE v2.0 False numpy towerq" in said, (job["error"], said[-20:])
    job, said = probe(client, code, ["towerq-probe==3.0"])
    assert job["state"] == "failed", job
    assert job["error"] == (
        "its requirements could not be installed: No matching distribution found for towerq-probe==3.0 "
        "(the index has 1.0, 2.0)"
    ), job["error"]
    assert job["attempts"] == 1, "a list pip cannot install is not tried again"

    # TOWERQ_ENVS_MAX=2: a third list's environment takes the place of the least recently used
    job, said = probe(client, code, ["towerq-probe>=2.0"])
    assert job["state"] == "succeeded" and "PROBE v2.0" in " ".join(said), (job["error"], said[-20:])
    kept = sorted((folder / "requirements.txt").read_text() for folder in (settings.var_dir / "envs").glob("*/"))
    assert kept == ["towerq-probe==2.0\n", "towerq-probe>=2.0\n"], kept

    # `towerq run -r requirements.txt` reads the file; an option line is refused before a byte is sent
    project = tmp_path / "project"
    project.mkdir()
    (project / "probe.py").write_text(PROBE)
    (project / "requirements.txt").write_text("# what it needs\ntowerq-probe==1.0  # pinned\n\n")
    done = towerq_cli(
        "run", "-r", "requirements.txt", "--", "python", "probe.py", cwd=project, api=str(stack.api_url), token=token
    )
    assert done.returncode == 0 and "PROBE v1.0 False numpy towerq" in done.stdout, done.stdout + done.stderr
    assert "not installed" not in done.stdout
    # the same folder sent without -r: its requirements.txt goes with the code, and the CLI says
    # that nothing installs it
    unlisted = towerq_cli(
        "run", "--detach", "--", "python", "probe.py", cwd=project, api=str(stack.api_url), token=token
    )
    assert unlisted.returncode == 0, unlisted.stdout + unlisted.stderr
    assert "note: requirements.txt is sent, not installed" in unlisted.stdout, unlisted.stdout
    assert "towerq run -r requirements.txt ... installs what it lists" in unlisted.stdout, unlisted.stdout
    submitted = re.search(r"job (\d+) submitted", unlisted.stdout)
    assert submitted, unlisted.stdout
    job = finished(client, int(submitted[1]))
    said = log_messages(client, job["id"])
    assert job["state"] == "failed" and any("No module named 'towerq_probe'" in m for m in said), said[-20:]
    (project / "requirements.txt").write_text("--index-url https://elsewhere.example/simple\ntowerq-probe\n")
    refused = towerq_cli(
        "run", "-r", "requirements.txt", "--", "python", "probe.py", cwd=project, api=str(stack.api_url), token=token
    )
    assert refused.returncode == 2 and "line 1: '--index-url" in refused.stderr, refused.stderr
    assert "code:" not in refused.stdout, "nothing was sent"


def silent_index() -> socket.socket:
    """A listening socket for pip's index that never answers (accept it to see pip ask)."""
    index = socket.socket()
    index.bind(("127.0.0.1", 0))
    index.listen()
    index.settimeout(60)
    return index


def job_asking_pip(client: httpx.Client) -> int:
    """A command job that needs a package from the index: the id of the job submitted."""
    return submit_probe(client, upload_code(client, {"probe.py": PROBE}), ["einops"])


def test_a_job_cancelled_while_pip_waits_on_the_index_ends_and_pip_with_it(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """An index that never answers: pip waits (its own timeout is a minute). A cancel ends the
    job within seconds, and pip: its connection to the index closes."""
    index = silent_index()
    options = f"--index-url http://127.0.0.1:{index.getsockname()[1]}/simple --timeout 60 --retries 0"
    client = lab_with_pip(stack, make_token("alice"), options)
    job_id = job_asking_pip(client)
    connection, _ = index.accept()  # pip asks the index, and waits
    with connection:
        wait_for(
            lambda: any(m.startswith("installing 1 requirement") for m in log_messages(client, job_id)), 30, "the build"
        )
        asked = time.monotonic()
        assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
        job = finished(client, job_id, timeout=30)
        assert job["state"] == "cancelled" and time.monotonic() - asked < 15, job
        connection.settimeout(15)
        assert connection.recv(65536, socket.MSG_PEEK) is not None
        while connection.recv(65536):  # what pip sent, then its end: it was killed
            pass
    index.close()
    assert not list((settings.var_dir / "envs").glob("*/.ready")), "nothing half built counts as built"


def hold_the_gpu(client: httpx.Client, code: str) -> int:
    """A job on the lab's one GPU until it is cancelled: the id, once it runs."""
    holder = client.post("/api/jobs", json={"command": ["sleep", "600"], "code": code})
    assert holder.status_code == 201, holder.text
    holder_id = int(holder.json()["id"])
    wait_for(lambda: client.get(f"/api/jobs/{holder_id}").json()["state"] == "running", 60, "the holder to run")
    return holder_id


def queued(client: httpx.Client, code: str, requirements: list[str]) -> int:
    """PROBE with `requirements`, submitted: its id, once the scheduler says why it waits."""
    job_id = submit_probe(client, code, requirements)
    wait_for(lambda: client.get(f"/api/jobs/{job_id}").json()["pending_reason"], 30, f"job {job_id} to wait")
    return job_id


def test_a_waiting_jobs_requirements_are_built_while_it_waits_not_while_it_holds_gpus(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """The one GPU busy: a queued job's list is built on the host before it starts (the job
    finds it ready and spends none of its GPU time on pip); a list pip cannot install fails
    nothing while it waits, and fails its job with pip's reason when it starts, as before."""
    index = tmp_path / "index"
    index.mkdir()
    wheel(index, "towerq-probe", "1.0", {"towerq_probe.py": "VALUE = 'v1.0'\n"})
    client = lab_with_pip(stack, make_token("alice"), f"--no-index --find-links {index}", envs_max=4)
    code = upload_code(client, {"probe.py": PROBE})
    holder = hold_the_gpu(client, code)
    waiting = queued(client, code, ["towerq-probe==1.0"])
    unbuildable = queued(client, code, ["towerq-probe==3.0"])

    envs = settings.var_dir / "envs"
    built = wait_for(lambda: list(envs.glob("*/.ready")), 60, "the waiting job's environment")
    assert [(ready.parent / "requirements.txt").read_text() for ready in built] == ["towerq-probe==1.0\n"]
    worker_log = stack.logs["worker-lab-a"]
    wait_for(lambda: "could not be installed here" in worker_log.read_text(), 60, "the failed build's word")
    assert "No matching distribution found for towerq-probe==3.0" in worker_log.read_text()
    for job_id in (waiting, unbuildable):
        assert client.get(f"/api/jobs/{job_id}").json()["state"] == "queued", "a build while waiting changes no job"
    said = wait_for(lambda: log_messages(client, unbuildable), 30, "the waiting job told of its failed build")
    assert said == [
        "its requirements could not be installed on lab-a while it waits: No matching distribution found for "
        "towerq-probe==3.0 (the index has 1.0). Unless that changes (lab-a tries again in 10m), it fails with this "
        "reason when it starts there: cancel it and submit it with requirements pip can install"
    ], said
    said = log_messages(client, waiting)
    assert len(said) == 1 and said[0].startswith("its requirements were installed on lab-a while it waits ("), said
    rows = {job["id"]: job for job in stack.client(make_token("bob")).get("/api/jobs").json()["items"]}  # the list
    assert rows[unbuildable]["requirements_failed_on"] == ["lab-a"], "as anyone sees it, without the log"
    assert rows[unbuildable]["reason"].startswith(
        "its requirements could not be installed on lab-a (its log says why); "
    )
    assert rows[waiting]["requirements_failed_on"] is None and "requirements" not in rows[waiting]["reason"]

    assert client.post(f"/api/jobs/{holder}/cancel").status_code == 202
    job = finished(client, waiting)
    said = log_messages(client, waiting)
    assert job["state"] == "succeeded" and "PROBE v1.0 False numpy towerq" in said, (job["error"], said[-20:])
    assert any("its requirements are installed on this host already" in m for m in said), said
    assert not any(m.startswith(("pip:", "installing")) for m in said), said
    job = finished(client, unbuildable)
    assert (job["state"], job["error"]) == (
        "failed",
        "its requirements could not be installed: No matching distribution found for towerq-probe==3.0 "
        "(the index has 1.0)",
    ), job


def test_the_workers_stop_ends_the_pip_it_started_for_a_waiting_job(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A waiting job's build, pip waiting on an index that never answers: the worker's stop
    ends it (pip's connection closes), nothing half built counts as built."""
    index = silent_index()
    options = f"--index-url http://127.0.0.1:{index.getsockname()[1]}/simple --timeout 60 --retries 0"
    client = lab_with_pip(stack, make_token("alice"), options)
    code = upload_code(client, {"probe.py": PROBE})
    hold_the_gpu(client, code)
    queued(client, code, ["einops"])
    connection, _ = index.accept()  # the host's build for the waiting job asks the index, and waits
    with connection:
        asked = time.monotonic()
        assert stack.stop("worker-lab-a") == 0
        connection.settimeout(15)
        while connection.recv(65536):  # what pip sent, then its end: it was killed
            pass
        assert time.monotonic() - asked < 30
    index.close()
    assert not list((settings.var_dir / "envs").glob("*/.ready")), "nothing half built counts as built"


def test_a_notebook_sessions_kernel_and_shell_have_its_requirements(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    index = tmp_path / "index"
    index.mkdir()
    wheel(index, "towerq-probe", "1.0", {"towerq_probe.py": "VALUE = 'v1.0'\n"})
    token = make_token("alice")
    client = lab_with_an_index(stack, token, index)
    created = client.post("/api/jobs", json={"kind": "notebook", "requirements": ["towerq-probe==1.0"]})
    assert created.status_code == 201, created.text
    session = created.json()["id"]
    wait_ready(client, session)
    said = log_messages(client, session)
    assert any(m.startswith("pip: Successfully installed towerq-probe-1.0") for m in said), said

    # JupyterLab runs on the environment's Python: so does its kernel
    kernel = start_kernel(client, session)
    printed = run_code(
        client, str(stack.api_url), token, session, kernel,
        "import sys, numpy, towerq_probe; print(towerq_probe.VALUE, sys.prefix != sys.base_prefix, numpy.__name__)",
    )  # fmt: skip
    assert printed.split() == ["v1.0", "True", "numpy"], printed

    # ... and its terminals' `python`
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_")}
    env.update({"TOWERQ_API_URL": str(stack.api_url), "TOWERQ_TOKEN": token, "PYTHONPATH": str(REPO)})
    typed = b"python -c 'import towerq_probe; print(towerq_probe.VALUE, 6 * 7)'\n"
    shell = [sys.executable, "-m", "service.cli", "shell", str(session)]
    done = subprocess.run(shell, input=typed, capture_output=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and b"v1.0 42" in done.stdout, done.stdout + done.stderr
    assert client.post(f"/api/jobs/{session}/cancel").status_code == 202
