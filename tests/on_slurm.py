"""What the Slurm tests share: a one-node cluster per test file (tests/slurm_cluster.py)
and a towerq stack whose executor is Slurm (`TOWERQ_EXECUTOR=slurm`), with helpers that
wait on jobs through the REST API. A test file imports the fixtures it uses."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import Settings
from tests.slurm_cluster import SlurmCluster, missing
from tests.stack import Stack, wait_for
from tests.wheels import wheel

needs_slurm = pytest.mark.skipif(missing() is not None, reason=missing() or "")

LONG = {"model": "mlp", "dataset": "digits", "gpu_count": 2, "hyperparameters": {"steps": 200000, "batch_size": 16}}
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    running = SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=4, cpus=8)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def slurm_settings(make_settings: Callable[..., Settings], database_url: str, tmp_path: Path) -> Settings:
    index = tmp_path / "index"  # the lab's index for a command job's requirements: one package
    index.mkdir(exist_ok=True)
    wheel(index, "towerq-probe", "1.0", {"towerq_probe.py": "VALUE = 'v1.0'\n"})
    return make_settings(
        database_url,
        executor="slurm",
        slurm_job_prefix=f"t{uuid.uuid4().hex[:8]}",  # one cluster for the file: each test its own jobs
        slurm_log_dir=tmp_path / "slurm-logs",
        simulated_gpus=None,
        scheduler_interval_s=1.0,
        cancel_grace_s=10.0,
        slurm_max_pending=2,
        pip_options=f"--no-index --find-links {index}",
    )


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path) -> Settings:
    return slurm_settings(make_settings, sqlite_url, tmp_path)


@pytest.fixture
def on_slurm(
    cluster: SlurmCluster, stack: Stack, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    stack.start_api()
    stack.start_scheduler(api_url=stack.api_url)  # where each attempt's batch script reports
    token = make_token("alice")
    with stack.client(token) as client:
        client.token = token  # type: ignore[attr-defined]
        yield client
    for job in cluster.jobs():  # what a failed test left
        if job["state"] in ("PENDING", "RUNNING"):
            cluster.run("scancel", job["id"], check=False)


def job_of(client: Any, job_id: int) -> dict[str, Any]:
    return client.get(f"/api/jobs/{job_id}").json()


def wait_state(client: Any, job_id: int, states: tuple[str, ...], timeout: float = 120) -> dict[str, Any]:
    return wait_for(
        lambda: (j := job_of(client, job_id))["state"] in states and j, timeout, f"job {job_id} to be {states}", 0.5
    )


def trained(client: Any, job_id: int, steps: int = 1, timeout: float = 120) -> dict[str, Any]:
    def far_enough() -> dict[str, Any] | None:
        job = job_of(client, job_id)
        assert job["state"] not in FINAL, f"job {job_id} ended: {job['state']}, {job['reason']}"
        return job if (job["latest"]["step"] or 0) >= steps else None

    return wait_for(far_enough, timeout, f"job {job_id} to train {steps} steps", 0.5)


def slurm_job(cluster: SlurmCluster, settings: Settings, job_id: int, attempt: int = 1) -> dict[str, str]:
    name = f"{settings.slurm_job_prefix}-{job_id}-{attempt}"
    return wait_for(
        lambda: next((j for j in reversed(cluster.jobs()) if j["name"] == name), None), 30, f"Slurm job {name}"
    )
