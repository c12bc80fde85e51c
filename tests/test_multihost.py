"""Several GPU hosts: two real workers with different names on this machine."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import psutil
import pytest

from service.core.settings import Settings
from tests.faults.helpers import backdate_allocations
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
QUICK = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 60, "batch_size": 16, "log_every": 20}}
FINAL = ("succeeded", "failed", "cancelled")


def two_hosts(stack: Stack, token: str) -> httpx.Client:
    """API, scheduler and two 2-GPU workers (lab-a, lab-b) that give 127.0.0.1 as their
    address and keep no warm trainer; a client of `token` once both have registered."""
    stack.start_api()
    stack.start_scheduler()
    for host in ("lab-a", "lab-b"):
        stack.start_worker(host, 2, worker_address="127.0.0.1", trainer_pool=0)
    client = stack.client(token)
    wait_for(lambda: len(client.get("/api/workers").json()) == 2, 30, "both workers to register")
    return client


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_jobs_spread_over_two_hosts_and_a_bound_job_goes_only_to_its_host(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    stack.start_worker("lab-b", 2)
    client = stack.client(make_token("alice"))
    wait_for(lambda: len(client.get("/api/workers").json()) == 2, 30, "both workers to register")

    spread = [client.post("/api/jobs", json={**QUICK, "gpu_count": 2}).json()["id"] for _ in range(2)]
    # Only once both are placed: a fresh one-GPU job would otherwise go first (smaller gangs
    # lead among fresh jobs) and leave no host with two free GPUs for the second.
    wait_for(lambda: all(client.get(f"/api/jobs/{i}").json()["allocation"] for i in spread), 60, "both placed")
    bound = client.post("/api/jobs", json={**QUICK, "host": "lab-b", "gpus": [1]}).json()["id"]
    jobs = {
        i: wait_for(
            lambda i=i: (j := client.get(f"/api/jobs/{i}").json())["state"] in FINAL and j, 240, f"job {i}", 0.5
        )
        for i in [*spread, bound]
    }
    assert all(j["state"] == "succeeded" for j in jobs.values()), {i: j["error"] for i, j in jobs.items()}
    assert {jobs[i]["allocation"]["host"] for i in spread} == {"lab-a", "lab-b"}
    assert jobs[bound]["allocation"]["host"] == "lab-b" and jobs[bound]["allocation"]["gpus"] == [1]
    workers = {w["name"]: w for w in client.get("/api/workers").json()}
    assert workers["lab-a"]["state"] == workers["lab-b"]["state"] == "up"
    assert workers["lab-b"]["simulated"] is True and workers["lab-b"]["gpus"] == 2


def test_a_job_over_two_hosts_trains_like_one_device_on_the_whole_batch(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """Through REST: 4 GPUs over two 2-GPU workers (one rank on each, 2 towers each, batch
    b per tower) trains step by step like one GPU on 4b; a job larger than the lab gets a
    422 naming the largest that fits."""
    client = two_hosts(stack, make_token("alice"))
    refused = client.post("/api/jobs", json={**QUICK, "gpu_count": 6})
    assert refused.status_code == 422 and "4 GPUs (2 hosts of 2)" in refused.text, refused.text
    uneven = client.post("/api/jobs", json={**QUICK, "gpu_count": 3})
    assert uneven.status_code == 422 and "multiple of 2" in uneven.text, uneven.text

    hyper = {"steps": 20, "batch_size": 4, "seed": 3, "log_every": 1, "optimizer": "momentum"}
    gang = client.post("/api/jobs", json={**QUICK, "gpu_count": 4, "hyperparameters": hyper}).json()["id"]
    one = client.post(
        "/api/jobs", json={**QUICK, "gpu_count": 1, "hyperparameters": {**hyper, "batch_size": 16}}
    ).json()["id"]
    jobs = {
        i: wait_for(
            lambda i=i: (j := client.get(f"/api/jobs/{i}").json())["state"] in FINAL and j, 300, f"job {i}", 0.5
        )
        for i in (gang, one)
    }
    assert all(j["state"] == "succeeded" for j in jobs.values()), {i: j["error"] for i, j in jobs.items()}
    ranks = jobs[gang]["allocation"]["ranks"]
    assert [(r["rank"], r["gpus"]) for r in ranks] == [(0, [0, 1]), (1, [0, 1])]
    assert {r["host"] for r in ranks} == {"lab-a", "lab-b"} and jobs[gang]["towers"] == 4
    series = {
        i: [(p["step"], p["loss"]) for p in client.get(f"/api/jobs/{i}/metrics").json() if p["split"] == "train"]
        for i in (gang, one)
    }
    assert [s for s, _ in series[gang]] == list(range(1, 21))
    assert all(abs(a[1] - b[1]) <= 1e-4 * max(1.0, abs(b[1])) for a, b in zip(series[gang], series[one], strict=True))
    lines = [line["message"] for line in client.get(f"/api/jobs/{gang}/logs").json()]
    assert any(m.startswith("[rank 1 on ") for m in lines), lines[-20:]


def rank_trainer(stack: Stack, rank: int, attempt: int) -> psutil.Process | None:
    """The trainer of `rank` (its Python process, not bwrap) for the attempt, from its spec
    file's name, `spec-attempt-<n>-rank-<r>.json`, among the processes below this stack's
    workers: other tests running beside this one have trainers of their own attempt 1."""
    name = f"spec-attempt-{attempt}-rank-{rank}.json" if rank else f"spec-attempt-{attempt}.json"
    for worker in [p for n, p in stack.processes.items() if n.startswith("worker-") and p.poll() is None]:
        try:
            below = psutil.Process(worker.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for process in below:
            try:
                line = process.cmdline()
            except psutil.Error:  # gone, or a zombie
                continue
            if "worker.trainer" in line and line[-1].endswith(name) and "bwrap" not in line[0]:
                return process
    return None


def train_steps(client: httpx.Client, job_id: int) -> list[int]:
    return [p["step"] for p in client.get(f"/api/jobs/{job_id}/metrics").json() if p["split"] == "train"]


def test_a_killed_rank_sends_the_whole_job_back_and_it_resumes_then_a_cancel_stops_every_rank(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """Rank 1's trainer is killed: rank 0 notices, the job goes back to the queue with all
    four GPUs released, and its next attempt resumes from rank 0's checkpoint on both hosts
    with no train step twice or missing. Then a cancel stops both ranks after one
    checkpoint and frees every GPU."""
    client = two_hosts(stack, make_token("alice"))
    hyper = {"steps": 10_000_000, "batch_size": 4, "log_every": 10, "checkpoint_every": 50}
    job_id = client.post("/api/jobs", json={**QUICK, "gpu_count": 4, "hyperparameters": hyper}).json()["id"]
    wait_for(lambda: max(train_steps(client, job_id), default=0) >= 120, 300, "attempt 1 past its first checkpoints")
    victim = wait_for(lambda: rank_trainer(stack, 1, 1), 10, "rank 1's trainer")
    victim.kill()
    killed_at = time.monotonic()
    wait_for(lambda: client.get(f"/api/jobs/{job_id}").json()["attempts"] == 2, 60, "the job to go back", 0.2)
    requeued_in = time.monotonic() - killed_at
    assert requeued_in < 30, requeued_in
    job = wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] == "running" and j, 120, "attempt 2 running"
    )
    # on each host the next rank starts only once the lost attempt's rank there is gone
    assert rank_trainer(stack, 0, 1) is None and rank_trainer(stack, 1, 1) is None
    back = [e for e in job["events"] if e["state"] == "queued" and e["attempt"] == 2]
    said = back[0]["message"] if back else ""  # whichever rank's worker records first: the killed one, or its peer
    assert said.startswith("rank 1 on lab-b: trainer exited") or "another rank of this job stopped" in said, said
    assert job["crashes"] == 1 and {r["host"] for r in job["allocation"]["ranks"]} == {"lab-a", "lab-b"}, job
    wait_for(lambda: rank_trainer(stack, 1, 2), 60, "rank 1 of attempt 2")
    past = max(train_steps(client, job_id))
    wait_for(lambda: max(train_steps(client, job_id)) >= past + 40, 120, "attempt 2 training")
    lines = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    resumed = [m for m in lines if "resumed from the checkpoint of step" in m]
    assert len(resumed) == 1 and resumed[0].startswith("[rank 0 on "), "\n".join(lines)

    waiting = client.post("/api/jobs", json={**QUICK, "gpu_count": 4, "hyperparameters": hyper}).json()["id"]
    assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
    job = wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 120, "the cancel", 0.5
    )
    assert job["state"] == "cancelled", job["error"]
    steps = train_steps(client, job_id)
    assert steps == list(range(10, steps[-1] + 1, 10)), steps  # none twice, none missing, over both attempts
    lines = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    stop_checkpoints = [m for m in lines if "checkpoint at step" in m and f"ckpt-{steps[-1]}" in m]
    assert len(stop_checkpoints) == 1 and stop_checkpoints[0].startswith("[rank 0 on "), "\n".join(lines[-25:])
    assert not [m for m in lines if m.startswith("[rank 1") and "checkpoint at step" in m]

    # The waiting job takes all four GPUs as soon as rank 0 records the cancel; on each host
    # its rank starts once the cancelled job's rank there is gone (here: its attempt 2).
    wait_for(lambda: rank_trainer(stack, 0, 1) and rank_trainer(stack, 1, 1), 120, "the waiting job's ranks", 0.05)
    assert rank_trainer(stack, 0, 2) is None and rank_trainer(stack, 1, 2) is None
    assert client.post(f"/api/jobs/{waiting}/cancel").status_code == 202
    wait_for(lambda: client.get(f"/api/jobs/{waiting}").json()["state"] in FINAL, 120, "the second cancel", 0.5)
    wait_for(lambda: all(not g["holders"] for g in client.get("/api/gpus").json()), 30, "every GPU free")
    wait_for(lambda: not any(rank_trainer(stack, r, a) for r in (0, 1) for a in (1, 2)), 15, "every rank to exit")


def test_time_slicing_stops_every_rank_after_one_checkpoint_and_the_job_resumes_on_both_hosts(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """A job over two hosts past its time slice is stopped for a fresh job that needs one
    host's two GPUs: both ranks stop after the same step, rank 0 alone writes the one checkpoint, both
    ranks' trainers are gone, and the next attempt resumes from it with no train step twice
    or missing. (Preemption asks the worker to stop the same way: `preempt_requested_at`.)"""
    client = two_hosts(stack, make_token("alice"))
    hyper = {"steps": 1200, "batch_size": 4, "log_every": 10, "checkpoint_every": 500}
    gang = client.post("/api/jobs", json={**QUICK, "gpu_count": 4, "hyperparameters": hyper}).json()["id"]
    wait_for(lambda: max(train_steps(client, gang), default=0) >= 100, 300, "attempt 1 past step 100")
    first = [wait_for(lambda r=r: rank_trainer(stack, r, 1), 10, f"rank {r}'s trainer") for r in (0, 1)]
    # As if it had run two hours on its four GPUs: past its one-GPU-hour slice and the 10-minute floor.
    backdate_allocations(stack.settings.database_url, gang, 2)
    fresh = {**QUICK, "gpu_count": 2, "hyperparameters": {"steps": 30, "batch_size": 4, "log_every": 10}}
    short = client.post("/api/jobs", json=fresh).json()["id"]

    ended = lambda i: (j := client.get(f"/api/jobs/{i}").json())["state"] in FINAL and j  # noqa: E731
    done = wait_for(lambda: ended(short), 240, "the fresh job")
    assert done["state"] == "succeeded", done["error"]
    assert not any(p.is_running() for p in first), "a rank of the stopped attempt outlived it"
    job = wait_for(lambda: ended(gang), 300, "the gang job")
    assert job["state"] == "succeeded", job["error"]
    assert (job["attempts"], job["crashes"]) == (2, 0), job
    requeued = [e["message"] for e in job["events"] if e["state"] == "queued"][-1]
    # 4 GPUs over two hosts for 2 hours (it said 4.0 when slicing counted one host's part)
    assert requeued.startswith("had its time slice (8.0 GPU-hours so far)"), requeued
    assert f"to make room for job {short}" in requeued
    lines = [line["message"] for line in client.get(f"/api/jobs/{gang}/logs", params={"tail": 5000}).json()]
    resumed = [m for m in lines if "resumed from the checkpoint of step" in m]
    assert len(resumed) == 1 and resumed[0].startswith("[rank 0 on "), "\n".join(lines[-30:])
    step = int(resumed[0].rsplit(" ", 1)[1])
    assert step >= 100, "it checkpointed when stopped, not only every 500 steps"
    stop_checkpoints = [m for m in lines if "checkpoint at step" in m and m.endswith(f"/ckpt-{step}")]
    assert len(stop_checkpoints) == 1 and stop_checkpoints[0].startswith("[rank 0 on "), "\n".join(lines[-30:])
    assert not [m for m in lines if m.startswith("[rank 1") and "checkpoint at step" in m]
    assert len([m for m in lines if f"trainer stopped at step {step} after a checkpoint" in m]) == 2, "both ranks"
    assert train_steps(client, gang) == list(range(10, 1201, 10))


def test_a_rank_frozen_while_the_ranks_start_sends_the_job_back_within_the_collective_timeout(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """Before the ranks meet, the first collective waits up to 300 s for every rank's
    start-up, so a rank frozen (SIGSTOP) then hung its peer that long. Its worker now sees
    the trainer stopped, kills it after the collective timeout (20 s), and the job goes back
    whole as a crash; the next attempt runs on both hosts and succeeds."""
    client = two_hosts(stack, make_token("alice"))
    hyper = {"steps": 40, "batch_size": 4, "log_every": 10}
    job_id = client.post("/api/jobs", json={**QUICK, "gpu_count": 4, "hyperparameters": hyper}).json()["id"]
    frozen = wait_for(lambda: rank_trainer(stack, 1, 1), 120, "rank 1's trainer", 0.05)
    frozen.suspend()
    frozen_at = time.monotonic()
    assert not train_steps(client, job_id), "frozen before the ranks met"
    wait_for(lambda: client.get(f"/api/jobs/{job_id}").json()["attempts"] == 2, 90, "the job to go back", 0.2)
    back_in = time.monotonic() - frozen_at
    assert back_in < 30, back_in
    assert not frozen.is_running() or frozen.status() == psutil.STATUS_ZOMBIE
    job = wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 240, "attempt 2 to end", 0.5
    )
    assert job["state"] == "succeeded" and (job["attempts"], job["crashes"]) == (2, 1), job
    said = [e["message"] for e in job["events"] if e["state"] == "queued" and e["attempt"] == 2][0]
    assert said.startswith("rank 1 on lab-") and "its trainer was frozen (stopped by a signal) for 2" in said, said
    assert train_steps(client, job_id) == [10, 20, 30, 40]
