"""A command job's `requirements` reach pip on the worker's host, as the worker's user, and
the environment built is shared by every job that asks for the same list. A member could:
pass pip an option (`--index-url` of their own, `-e /`), a URL or a path in place of a
package; name a package that only comes as source, whose `setup.py` pip would run as the
worker to build it; name a wheel that writes outside the environment; or change the shared
environment from inside a job, so the next member's job with the same list runs their code.
Nor, since the build runs as the worker before the sandbox starts, can the job's own `env`
steer it: a `PYTHONPATH` naming a folder where a job left a `sitecustomize.py` would run it
as the worker. None of that gets through (`towerq.contract.program_env.requirement`,
`worker.pyenv`). Nor does anyone on the host read the lab's index password off a command
line while pip works."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, log_messages, upload_code, wait_for
from tests.test_command_envs import hold_the_gpu, job_asking_pip, lab_with_pip, queued, silent_index
from tests.wheels import sdist, wheel

pytestmark = pytest.mark.slow
HOSTILE = [
    "--index-url=https://evil.example/simple",
    "-e /",
    "-r /etc/shadow",
    "towerq-probe @ file:///etc/shadow",
    "towerq-probe @ https://evil.example/probe.whl",
    "/srv/wheels/towerq_probe-1.0-py3-none-any.whl",
    "./towerq-probe",
    "towerq-probe; os_name == 'posix'",
    "towerq-probe\n--index-url=https://evil.example/simple",
    "towerq-probe==1.0 --hash=sha256:00",
    "",
]
PLANT = """
import os
for name in ("sitecustomize.py", "usercustomize.py", "pip.py", "venv.py"):
    with open(os.path.join("/job/output", name), "w") as planted:
        planted.write("open({marker!r}, 'w').write('ran as the worker')\\n")
"""
POISON = """
import pathlib, towerq_probe
target = pathlib.Path(towerq_probe.__file__)
for path, text in ((target, "VALUE = 'poisoned'\\n"), (target.parent / "evil.pth", "import os\\n")):
    try:
        path.write_text(text)
        print("CHANGED the environment")
    except OSError as err:
        print("refused", type(err).__name__)
print("VALUE", towerq_probe.VALUE)
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_requirements_are_packages_from_the_labs_index_built_from_wheels_and_read_only_to_jobs(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    index = tmp_path / "index"
    index.mkdir()
    wheel(index, "towerq-probe", "1.0", {"towerq_probe.py": "VALUE = 'clean'\n"})
    marker = tmp_path / "setup-py-ran"
    sdist(index, "towerq-source", "1.0", f"open({str(marker)!r}, 'w').write('ran as the worker')\n")
    escape = tmp_path / "escaped.txt"
    wheel(index, "towerq-escape", "1.0", {f"../../../../../../../../../../..{escape}": "out\n"})
    # the lab lets pip build without isolation: were sources built, setup.py would run
    client = lab_with_pip(stack, make_token("mallory"), f"--no-index --find-links {index} --no-build-isolation")
    code = upload_code(client, {"poison.py": POISON})

    def run(requirements: list[str]) -> tuple[dict, list[str]]:
        created = client.post(
            "/api/jobs", json={"command": ["python", "poison.py"], "code": code, "requirements": requirements}
        )
        assert created.status_code == 201, created.text
        job = finished(client, created.json()["id"])
        return job, log_messages(client, job["id"])

    # options, URLs, paths, markers: refused at submit, naming the field
    for entry in HOSTILE:
        refused = client.post(
            "/api/jobs", json={"command": ["python", "poison.py"], "code": code, "requirements": [entry]}
        )
        assert refused.status_code == 422, (entry, refused.text)
        assert "requirements" in refused.text, (entry, refused.text)

    # a package that comes only as source is not built: its setup.py never runs
    job, said = run(["towerq-source==1.0"])
    assert not marker.exists(), "setup.py ran on the worker"
    assert job["state"] == "failed" and "No matching distribution found for towerq-source" in job["error"], job

    # a wheel that writes outside its environment is refused by pip, and writes nothing
    job, said = run(["towerq-escape==1.0"])
    assert job["state"] == "failed" and "could not be installed" in job["error"], (job, said[-10:])
    assert not escape.exists()

    # the job's env does not reach the build: a PYTHONPATH to a folder a job planted Python in
    planter = upload_code(client, {"plant.py": PLANT.format(marker=str(marker) + "-env")})
    created = client.post("/api/jobs", json={"command": ["python", "plant.py"], "code": planter})
    planted = finished(client, created.json()["id"])
    assert planted["state"] == "succeeded", planted
    folder = settings.artifacts_dir.resolve() / f"job-{planted['id']}" / "output"
    assert (folder / "sitecustomize.py").is_file()
    steer = {"PYTHONPATH": str(folder), "PYTHONSTARTUP": str(folder / "pip.py"), "PYTHONUSERBASE": str(folder)}
    created = client.post(
        "/api/jobs",
        json={"command": ["python", "poison.py"], "code": code, "requirements": ["towerq-probe>=1.0"], "env": steer},
    )
    steered = finished(client, created.json()["id"])
    assert not Path(str(marker) + "-env").exists(), "the job's env ran code in the build"
    assert steered["state"] == "succeeded", (steered, log_messages(client, steered["id"])[-10:])

    # the environment is read only to the job that runs in it: the next job with the same list
    # runs what pip installed
    job, said = run(["towerq-probe==1.0"])
    assert job["state"] == "succeeded", (job["error"], said[-10:])
    assert said.count("refused PermissionError") + said.count("refused OSError") == 2, said[-10:]
    assert "CHANGED the environment" not in said and "VALUE clean" in said, said[-10:]
    job, said = run(["towerq-probe==1.0"])
    assert "VALUE clean" in said and not list((settings.var_dir / "envs").glob("*/lib/*/site-packages/evil.pth"))


def test_a_waiting_jobs_build_ahead_runs_no_setup_py_and_writes_nothing_outside_its_environment(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    """The host builds a waiting job's list before it starts (`worker.prepare`), as the worker
    and outside any job's sandbox: a source-only package (its setup.py would run as the
    worker) and a wheel that writes outside its environment fail there as at a job's start,
    leaving nothing, and change no job."""
    index = tmp_path / "index"
    index.mkdir()
    marker = tmp_path / "setup-py-ran"
    sdist(index, "towerq-source", "1.0", f"open({str(marker)!r}, 'w').write('ran as the worker')\n")
    escape = tmp_path / "escaped.txt"
    wheel(index, "towerq-escape", "1.0", {f"../../../../../../../../../../..{escape}": "out\n"})
    options = f"--no-index --find-links {index} --no-build-isolation"
    client = lab_with_pip(stack, make_token("mallory"), options, envs_max=4)
    code = upload_code(client, {"poison.py": POISON})
    hold_the_gpu(client, code)
    waiting = [queued(client, code, ["towerq-source==1.0"]), queued(client, code, ["towerq-escape==1.0"])]
    worker_log = stack.logs["worker-lab-a"]
    wait_for(lambda: worker_log.read_text().count("could not be installed here") == 2, 90, "both builds to fail")
    assert not marker.exists(), "setup.py ran on the worker"
    assert not escape.exists()
    assert not list((settings.var_dir / "envs").glob("*/.ready")), "nothing half built counts as built"
    for job_id in waiting:
        assert client.get(f"/api/jobs/{job_id}").json()["state"] == "queued"


def test_the_labs_index_password_is_on_no_command_line_and_in_no_log(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """TOWERQ_PIP_OPTIONS may name an index with its password in the URL. /proc/PID/cmdline
    is every local user's to read (a member with a shell on the host, a job run unsandboxed),
    so while pip works no process's command line holds it: pip reads the URL from a file only
    the worker's user reads. pip's own lines, shown in the job's log, hide it too."""
    secret = "index-word-7f3a9c"
    index = silent_index()
    url = f"http://lab:{secret}@127.0.0.1:{index.getsockname()[1]}/simple"
    client = lab_with_pip(stack, make_token("alice"), f"--index-url {url} --timeout 60 --retries 0")
    job_id = job_asking_pip(client)
    connection, _ = index.accept()  # pip asks the index, and waits
    with connection:
        wait_for(lambda: any(m.startswith("pip:") for m in log_messages(client, job_id)), 30, "pip's first line")
        shown = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                words = cmdline.read_bytes()
            except OSError:  # ended meanwhile
                continue
            if secret.encode() in words:
                shown.append(words.replace(b"\0", b" ").decode(errors="replace")[:300])
        assert not shown, shown
        assert not [m for m in log_messages(client, job_id) if secret in m]
        assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
        assert finished(client, job_id, timeout=30)["state"] == "cancelled"
    index.close()
