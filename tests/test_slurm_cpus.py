"""A Slurm attempt gets the CPUs it asks (`--cpus-per-task`, service/executors/slurm_cpus.py)
where the cluster confines jobs to their CPUs: a one-node cluster with `task/affinity` on
this machine's own CPUs, and a command job on all of its GPUs, one process per GPU, sees
every CPU (the node's share for its GPUs), a 1-GPU job its share. Before, every attempt was
one task of one CPU: the processes of a job on several GPUs shared one core."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.on_slurm import FINAL, needs_slurm, on_slurm, settings, wait_state
from tests.slurm_cluster import SlurmCluster
from tests.stack import upload_code

pytestmark = [pytest.mark.slow, needs_slurm]
FIXTURES = (on_slurm, settings)  # pytest finds them by name in this module
CPUS = os.cpu_count() or 1
AFFINITY = """
import os
print("RANK", os.environ.get("RANK", "0"), "CPUS", len(os.sched_getaffinity(0)), flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if CPUS < 2:
        pytest.skip("one CPU: nothing to share between GPUs")
    running = SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=2, cpus=CPUS, confined=True)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def cpus_seen(client: Any, spec: dict[str, Any]) -> list[int]:
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    done = wait_state(client, job_id, FINAL, 120)
    lines = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 1000}).json()]
    assert done["state"] == "succeeded", (done["reason"], lines[-20:])
    return sorted(int(line.split()[-1]) for line in lines if "RANK " in line and " CPUS " in line)


def test_an_attempt_runs_on_the_cpus_it_asked_slurm_for(on_slurm: Any, cluster: SlurmCluster) -> None:
    client = on_slurm
    code = upload_code(client, {"affinity.py": AFFINITY})
    command = ["python", "affinity.py"]
    both = cpus_seen(client, {"command": command, "code": code, "gpu_count": 2, "processes": "per_gpu"})
    assert both == [CPUS, CPUS], "each process of the job on both GPUs may run on all the node's CPUs"
    one = cpus_seen(client, {"command": command, "code": code, "gpu_count": 1})
    assert one == [CPUS // 2], "a 1-GPU job, its share"
