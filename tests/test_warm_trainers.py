"""Warm trainers (worker/pool.py), through real processes: a job takes the trainer the
pool started before it was submitted, sees only its own GPUs, is served once and never
again, and the pool warms the next one, with and without the sandbox; in the sandbox a warm
trainer's user code sees what a cold one's sees (its folder at /job, its code bundle at
/code, nothing else), a job with a code bundle starts warm too; `TOWERQ_TRAINER_POOL=0` starts none; a warm trainer
that died is replaced; stopping the worker leaves no trainer behind."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import httpx
import pytest

from service.core.settings import Settings
from tests.stack import Stack, upload_code, wait_for
from towerq.contract.paths import MODEL_FILE, job_folder
from worker.launch import Launch
from worker.pool import TrainerPool
from worker.processes import all_processes, pid_alive

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
JOB = {
    "model": "mlp",
    "dataset": "digits",
    "gpus": [1],
    "hyperparameters": {"steps": 6, "batch_size": 8, "log_every": 2, "eval_every": 0, "checkpoint_every": 0},
}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def warm_pids(worker: int) -> dict[int, int]:
    """The warm trainers' Python processes under the worker process `worker`, each with the
    worker's child it runs in (bwrap, in the sandbox; else itself)."""
    processes = list(all_processes())
    parents = {p.pid: p.ppid for p in processes}
    found = {}
    for process in processes:
        argv = process.cmdline.split(" ")
        if "worker.trainer" not in argv or "--warm" not in argv or argv[0].endswith("bwrap"):
            continue
        child = process.pid
        while parents.get(child, 0) not in (worker, 0, 1):
            child = parents[child]
        if parents.get(child) == worker:
            found[process.pid] = child
    return found


def ready(client: httpx.Client) -> int:
    workers = client.get("/api/workers").json()
    return workers[0]["info"].get("warm_trainers", 0) if workers else 0


def finished(client: httpx.Client, job_id: int) -> dict:
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "job", 0.5)
    assert job["state"] == "succeeded", job["error"]
    return job


def start(stack: Stack, token: str, **worker_env: object) -> httpx.Client:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, heartbeat_interval_s=0.3, **worker_env)
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    return client


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_job_takes_the_warm_trainer_once_and_the_pool_warms_the_next(
    stack: Stack, settings: Settings, make_token: Callable[..., str], sandbox: str
) -> None:
    client = start(stack, make_token(), sandbox=sandbox)
    worker = stack.processes["worker-lab-a"].pid
    wait_for(lambda: ready(client) == 1, 120, "a warm trainer", 0.3)
    before = warm_pids(worker)
    assert len(before) == 1, before

    job = finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    assert job["cuda_visible_devices"] == "1"  # as the trainer itself reported it
    log = client.get(f"/api/jobs/{job['id']}/logs.txt").text
    ((started_as,),) = [before.values()]  # the process warmed before the submit
    assert f"runs in a warm trainer from the pool, pid {started_as}" in log, log[-3000:]
    folder = job_folder(settings.artifacts_dir, job["id"])
    assert (folder / MODEL_FILE).is_file() and (folder / "checkpoints").is_dir()

    wait_for(lambda: ready(client) == 1, 120, "the next warm trainer", 0.3)
    after = warm_pids(worker)
    assert len(after) == 1 and not after.keys() & before.keys(), (before, after)  # a new process, never the same one
    # the next one's folders (its own, seen at /job, and its code folder, at /code)
    assert len(list((settings.artifacts_dir / ".warm").glob("*"))) == 2 * (sandbox == "bwrap")

    stack.stop("worker-lab-a")
    gone = [*after, *after.values()]
    wait_for(lambda: not any(pid_alive(pid) for pid in gone), 10, "the warm trainer to die with its worker")
    assert not list((settings.artifacts_dir / ".warm").glob("*")), "a warm trainer's folder was left behind"
    client.close()


WHERE = """
import os

import keras


def build(params):
    print("WHERE cwd", os.getcwd())
    for label, path in zip(params["model_options"]["names"], params["model_options"]["paths"]):
        print("WHERE", label, "seen" if os.path.exists(path) else "hidden")
    with open("written-by-the-job.txt", "w") as out:
        out.write("ok")
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


def test_in_the_sandbox_a_warm_trainer_sees_what_a_cold_one_sees(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """User code started warm and cold in the sandbox: the same working folder (/job), its
    files land in the job's folder, and neither sees the artifacts root or the pool's folders."""
    (settings.models_path / "where.py").write_text(WHERE)
    warm_folders = settings.artifacts_dir.resolve() / ".warm"
    targets = {"artifacts": str(settings.artifacts_dir.resolve()), "pool": str(warm_folders), "job": "/job"}
    spec = {**JOB, "model": "where:build"}
    spec["hyperparameters"] = {
        **JOB["hyperparameters"],
        "model_options": {"names": [*targets], "paths": [*targets.values()]},
    }
    client = start(stack, make_token(), sandbox="bwrap")
    admin = stack.client(make_token("root", admin=True))  # the only one shown a job's host folder
    seen = {}
    for how in ("warm", "cold"):
        if how == "warm":
            wait_for(lambda: ready(client) == 1, 120, "a warm trainer", 0.3)
        else:
            stack.stop("worker-lab-a")
            stack.start_worker("lab-a", 2, heartbeat_interval_s=0.3, sandbox="bwrap", trainer_pool=0)
        job = finished(client, client.post("/api/jobs", json=spec).json()["id"])
        log = client.get(f"/api/jobs/{job['id']}/logs.txt").text
        expected = "a warm trainer from the pool" if how == "warm" else "a new trainer (cold start)"
        assert f"attempt 1 runs in {expected}" in log, log[-3000:]
        seen[how] = sorted(line.split("WHERE ", 1)[1] for line in log.splitlines() if "WHERE " in line)
        folder = job_folder(settings.artifacts_dir, job["id"])
        assert (folder / "written-by-the-job.txt").read_text() == "ok"
        assert admin.get(f"/api/jobs/{job['id']}").json()["artifacts_dir"] == str(folder)
        assert job["artifacts_dir"] is None, job["artifacts_dir"]
    assert seen["warm"] == seen["cold"] == ["artifacts hidden", "cwd /job", "job seen", "pool hidden"], seen
    client.close()
    admin.close()


MINE = """
import os

import keras

from lab.parts import head


def build(params):
    print("CODE AT", __file__)
    try:
        open("/code/planted.py", "w")
        print("CODE WRITABLE")
    except OSError as err:
        print("CODE READ ONLY", type(err).__name__)
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(), head(params)])
"""
PARTS = """
import keras


def head(params):
    return keras.layers.Dense(params["num_classes"])
"""


def test_in_the_sandbox_a_job_with_its_own_code_starts_warm_and_sees_it_as_a_cold_one_does(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A code bundle is shown at /code, read only, to a warm trainer (filled when the job
    takes it) as to a cold one; the warm one's code folder goes when its attempt ends."""
    client = start(stack, make_token(), sandbox="bwrap")
    worker = stack.processes["worker-lab-a"].pid
    bundle = upload_code(client, {"mine.py": MINE, "lab/__init__.py": "", "lab/parts.py": PARTS})
    spec = {**JOB, "model": "mine:build", "code": bundle}
    seen = {}
    for how in ("warm", "cold"):
        if how == "warm":
            wait_for(lambda: ready(client) == 1, 120, "a warm trainer", 0.3)
            before = warm_pids(worker)
        else:
            stack.stop("worker-lab-a")
            stack.start_worker("lab-a", 2, heartbeat_interval_s=0.3, sandbox="bwrap", trainer_pool=0)
        job = finished(client, client.post("/api/jobs", json=spec).json()["id"])
        log = client.get(f"/api/jobs/{job['id']}/logs.txt").text
        if how == "warm":
            ((started_as,),) = [before.values()]
            assert f"runs in a warm trainer from the pool, pid {started_as}" in log, log[-3000:]
            wait_for(lambda: ready(client) == 1, 120, "the next warm trainer", 0.3)
            left = sorted(path.name.endswith(".code") for path in (settings.artifacts_dir / ".warm").iterdir())
            assert left == [False, True], left  # the next trainer's two folders, not the taken one's code
        else:
            assert "runs in a new trainer (cold start)" in log, log[-3000:]
        seen[how] = sorted(line.split("CODE ", 1)[1] for line in log.splitlines() if "CODE " in line)
    assert seen["warm"] == seen["cold"] == ["AT /code/mine.py", "READ ONLY OSError"], seen
    client.close()


def test_in_the_sandbox_only_jobs_with_every_jobs_view_take_a_warm_trainer(settings: Settings) -> None:
    """A sandboxed warm trainer's view is fixed before its job is known: a job that needs
    more shown (an upload, GPU device nodes) or resumes in its own folder starts cold; a code
    bundle is shown at /code, which a warm trainer has."""
    pool = TrainerPool(settings, "lab-a", 1, sandboxed=True, simulated=True)
    upload = settings.data_dir / "users" / "alice" / "mine"
    upload.mkdir(parents=True)

    def launch(simulated: bool = True, **spec: object) -> Launch:
        return Launch(1, 1, "lab-a", [0], 1.0, {**JOB, **spec}, None, [1024], simulated)

    fresh = settings.artifacts_dir / "job-1"
    assert pool.fits(launch(), fresh)
    assert pool.fits(launch(code="a" * 64), fresh)  # shown at /code when taken
    assert not pool.fits(launch(dataset="npz:users/alice/mine/data.npz"), fresh)
    assert not pool.fits(launch(simulated=False), fresh)
    fresh.mkdir(parents=True)
    assert not pool.fits(launch(), fresh)
    assert TrainerPool(settings, "lab-a", 1, sandboxed=False, simulated=False).fits(launch(simulated=False), fresh)


def test_no_pool_starts_no_warm_trainer_and_a_dead_one_is_replaced(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    token = make_token()
    client = start(stack, token, trainer_pool=0)
    finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    assert not warm_pids(stack.processes["worker-lab-a"].pid) and ready(client) == 0
    stack.stop("worker-lab-a")

    worker = stack.start_worker("lab-a", 2, heartbeat_interval_s=0.3, sandbox="none").pid
    wait_for(lambda: ready(client) == 1, 120, "a warm trainer", 0.3)
    (dead,) = warm_pids(worker).keys()
    os.kill(dead, signal.SIGKILL)
    replaced = wait_for(lambda: (p := warm_pids(worker)) and dead not in p and ready(client) == 1 and p, 120, "another")
    job = finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    log = client.get(f"/api/jobs/{job['id']}/logs.txt").text
    assert f"attempt 1 runs in a warm trainer from the pool, pid {next(iter(replaced))}" in log, log
    client.close()
