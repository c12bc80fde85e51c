"""towerq on a real Slurm cluster (`TOWERQ_EXECUTOR=slurm`): a single node from Debian's
packages (`munged`, `slurmctld`, `slurmd`) with four fake GPUs as gres, started by this
file (tests/slurm_cluster.py). Everything goes through towerq's REST API, as a user would;
Slurm is asked only what an admin would ask it (`squeue`) or told what an admin would do
(`scancel`, a node's daemon dying)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import Settings
from tests.slurm_cluster import SlurmCluster, missing
from tests.stack import Stack, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

LONG = {"model": "mlp", "dataset": "digits", "gpu_count": 2, "hyperparameters": {"steps": 200000, "batch_size": 16}}
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    running = SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=4, cpus=4)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path) -> Settings:
    return make_settings(
        sqlite_url,
        executor="slurm",
        slurm_job_prefix=f"t{uuid.uuid4().hex[:8]}",  # one cluster for the file: each test its own jobs
        slurm_log_dir=tmp_path / "slurm-logs",
        simulated_gpus=None,
        scheduler_interval_s=1.0,
        cancel_grace_s=10.0,
    )


@pytest.fixture
def on_slurm(
    cluster: SlurmCluster, stack: Stack, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    stack.start_api()
    stack.start_scheduler()
    with stack.client(make_token("alice")) as client:
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


def test_jobs_share_the_gres_gpus_wait_with_slurms_reason_and_end_by_cancel_or_scancel(
    on_slurm: Any, cluster: SlurmCluster, settings: Settings
) -> None:
    client = on_slurm
    ids = [client.post("/api/jobs", json={**LONG, "name": f"long-{i}"}).json()["id"] for i in range(3)]
    first, second = (trained(client, i) for i in ids[:2])
    assert {first["cuda_visible_devices"], second["cuda_visible_devices"]} == {"0,1", "2,3"}  # Slurm's choice
    assert first["state"] == "running" and first["allocation"] is None or first["allocation"]["host"] == cluster.node

    third = wait_for(
        lambda: (j := job_of(client, ids[2]))["reason"] and "Resources" in j["reason"] and j, 30, "Slurm's reason"
    )
    assert third["state"] == "dispatched"
    assert third["reason"].startswith("Slurm job ") and "the GPUs it asks for are in use" in third["reason"]
    assert slurm_job(cluster, settings, ids[2])["state"] == "PENDING"

    # Cancel in towerq: the trainer checkpoints, the job is cancelled, its GPUs go to the third.
    assert client.post(f"/api/jobs/{ids[0]}/cancel").status_code == 202
    cancelled = wait_state(client, ids[0], FINAL)
    assert cancelled["state"] == "cancelled" and cancelled["reason"] == "cancelled by alice"
    started = trained(client, ids[2])
    assert started["cuda_visible_devices"] == first["cuda_visible_devices"]

    # An admin's scancel: the towerq job ends cancelled, saying so, never left running.
    cluster.run("scancel", slurm_job(cluster, settings, ids[1])["id"])
    ended = wait_state(client, ids[1], FINAL, 60)
    assert ended["state"] == "cancelled" and "cancelled in Slurm" in ended["reason"], ended["reason"]

    client.post(f"/api/jobs/{ids[2]}/cancel")
    assert wait_state(client, ids[2], FINAL)["state"] == "cancelled"
