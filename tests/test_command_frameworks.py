"""Real frameworks in command jobs (issue 51): a data-parallel program over two processes,
one per (simulated) GPU, meeting through what `"processes": "per_gpu"` gives each rank:
PyTorch's DDP over gloo from `init_method="env://"` (and the same started by `torchrun`), and TensorFlow's
`MultiWorkerMirroredStrategy` in a custom training loop from `TF_CONFIG`. Both in the
sandbox, through the real API, scheduler and worker. The programs are docs/frameworks.md's."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, upload_code, wait_for

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def run_example(
    stack: Stack, make_token: Callable[..., str], example: str, timeout: float, launcher: tuple[str, ...] = ()
) -> tuple[dict, list[str], list[dict]]:
    """`example` over two processes: one per GPU (`per_gpu`), or started by `launcher` in
    the job's one process, which sees both GPUs."""
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, sandbox="bwrap", trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {example: (EXAMPLES / example).read_text()})
    command = [*launcher, example] if launcher else ["python", example]
    spec = {"command": [*command, "--steps", "20"], "code": code, "gpu_count": 2}
    spec["processes"] = "one" if launcher else "per_gpu"
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, timeout, "the job")
    lines = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 2000}).json()]
    points = client.get(f"/api/jobs/{job_id}/metrics").json()
    return job, lines, points


def test_pytorch_ddp_over_gloo_trains_across_two_processes(stack: Stack, make_token: Callable[..., str]) -> None:
    assert importlib.util.find_spec("torch") is not None, "no PyTorch in .venv: run `make frameworks`"
    job, lines, points = run_example(stack, make_token, "torch_ddp.py", 240)
    assert job["state"] == "succeeded", (job["error"], lines[-30:])
    assert "rank 0 of 2 on GPU 0" in lines and "[rank 1] rank 1 of 2 on GPU 1" in lines, lines[-30:]
    assert "the ranks' weights agree: True" in lines, lines[-30:]
    assert not [line for line in lines if "hostname of the client socket" in line], "c10d named its peers"
    train = [p for p in points if p["split"] == "train"]
    assert [p["step"] for p in train] == list(range(1, 21)), "rank 0 reports for the job; rank 1's lines are text"
    assert train[-1]["loss"] < train[0]["loss"]
    assert job["total_steps"] == 20, "as its program said (towerq.report(total_steps=))"


def test_pytorch_ddp_started_by_torchrun_in_the_jobs_one_process(stack: Stack, make_token: Callable[..., str]) -> None:
    """What most PyTorch programs are started with: `torchrun --nproc_per_node=2` in the job's
    one process, which sees both GPUs; its ranks share the job's stdout, and each of rank 0's
    points is the job's though another rank writes meanwhile (`towerq.report` starts a line)."""
    assert importlib.util.find_spec("torch") is not None, "no PyTorch in .venv: run `make frameworks`"
    job, lines, points = run_example(stack, make_token, "torch_ddp.py", 240, ("torchrun", "--nproc_per_node=2"))
    assert job["state"] == "succeeded", (job["error"], lines[-30:])
    assert {"rank 0 of 2 on GPU 0,1", "rank 1 of 2 on GPU 0,1"} <= set(lines), lines[-30:]
    assert "the ranks' weights agree: True" in lines, lines[-30:]
    assert [p["step"] for p in points if p["split"] == "train"] == list(range(1, 21))


def test_tensorflow_multiworker_mirrored_strategy_from_tf_config(stack: Stack, make_token: Callable[..., str]) -> None:
    job, lines, points = run_example(stack, make_token, "tf_multiworker.py", 300)
    assert job["state"] == "succeeded", (job["error"], lines[-30:])
    assert "workers in sync: 2" in lines, lines[-30:]
    train = [p for p in points if p["split"] == "train"]
    assert [p["step"] for p in train] == list(range(1, 21))
    assert train[-1]["loss"] < train[0]["loss"]
