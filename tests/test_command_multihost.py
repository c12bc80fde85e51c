"""Command jobs over several hosts: two real workers (lab-a, lab-b) on this machine, each
with two simulated GPUs, the program in the bubblewrap sandbox with the hosts' network
(`network: true`, an admin's job here). The ranks meet at rank 0's address from the
rendezvous, and the gang is stopped and resumed as one."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from service.cli.redis_server import EmbeddedRedis, embedded_url
from service.core.settings import Settings
from tests.conftest import free_port
from tests.stack import Stack, finished, log_messages, upload_code, wait_for
from tests.test_command_jobs import FAKE_NVML

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"

RING = """
import json, os, socket, sys, time
from pathlib import Path
import towerq

steps = int(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
state = Path(os.environ["TOWERQ_CHECKPOINT_DIR"]) / "state.json"
start, total = 0, 0.0
if state.exists():
    saved = json.loads(state.read_text())
    start, total = saved["step"], saved["total"]
print(f"rank {rank} of {world} starts after step {start}", flush=True)
if rank == 0:
    server = socket.create_server(("", master[1]))
    peers = [server.accept()[0].makefile("rw") for _ in range(world - 1)]
else:
    for _ in range(600):
        try:
            peers = [socket.create_connection(master).makefile("rw")]
            break
        except OSError:
            time.sleep(0.1)
for step in range(start + 1, steps + 1):
    mine = float(rank + 1)
    if rank == 0:
        said = [peer.readline() for peer in peers]
        if not all(said):
            sys.exit(f"step {step}: a rank went away")
        summed = mine + sum(float(s) for s in said)
        for peer in peers:
            peer.write(f"{summed}\\n")
            peer.flush()
    else:
        peers[0].write(f"{mine}\\n")
        peers[0].flush()
        answer = peers[0].readline()
        if not answer:
            sys.exit(f"step {step}: rank 0 went away")
        summed = float(answer)
    total += summed
    if rank == 0:
        towerq.report(step=step, loss=1.0 / step, total=total)
        if step % 5 == 0:
            state.write_text(json.dumps({"step": step, "total": total}))
    elif step % 20 == 0:
        towerq.report(step=step, loss=99.0)  # not the job's: text in its log
    time.sleep(0.2)
print(f"rank {rank} done: total {total}", flush=True)
"""


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis with a password, as `towerq up` starts: a job with the network is refused
    where Redis takes none."""
    server = EmbeddedRedis(embedded_url(f"redis://127.0.0.1:{free_port()}/0"), tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str, password_redis: EmbeddedRedis) -> Settings:
    return make_settings(sqlite_url, redis_url=password_redis.url, heartbeat_timeout_s=3.0)


def two_hosts(stack: Stack, token: str) -> httpx.Client:
    stack.start_api()
    stack.start_scheduler()
    for host in ("lab-a", "lab-b"):
        stack.start_worker(host, 2, worker_address="127.0.0.1", trainer_pool=0, sandbox="bwrap")
    client = stack.client(token)
    wait_for(lambda: len(client.get("/api/workers").json()) == 2, 60, "both workers to register")
    return client


def train_steps(client: httpx.Client, job_id: int) -> list[int]:
    return [p["step"] for p in client.get(f"/api/jobs/{job_id}/metrics").json() if p["split"] == "train"]


def test_pytorch_ddp_runs_as_four_processes_over_two_hosts(stack: Stack, make_token: Callable[..., str]) -> None:
    """docs/examples/torch_ddp.py as written, one process per GPU over two 2-GPU hosts:
    ranks 0-3 of 4 (gloo), rank 0 speaks for the job. Without the network the same job is
    refused, naming the field."""
    client = two_hosts(stack, make_token("root", admin=True))
    code = upload_code(client, {"torch_ddp.py": (EXAMPLES / "torch_ddp.py").read_text()})
    spec = {"command": ["python", "torch_ddp.py", "--steps", "20"], "code": code, "gpu_count": 4}
    refused = client.post("/api/jobs", json={**spec, "processes": "per_gpu"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "network", refused.text
    assert "needs network: true" in refused.text
    uneven = client.post("/api/jobs", json={**spec, "gpu_count": 3, "network": True})
    assert uneven.status_code == 422 and "multiple of 2" in uneven.text, uneven.text

    created = client.post("/api/jobs", json={**spec, "processes": "per_gpu", "network": True})
    assert created.status_code == 201, created.text
    job = finished(client, created.json()["id"], 300)
    lines = log_messages(client, job["id"])
    assert job["state"] == "succeeded", (job["error"], lines[-30:])
    assert {r["host"] for r in job["allocation"]["ranks"]} == {"lab-a", "lab-b"}
    said = {line.partition("] ")[2] for line in lines}
    assert "rank 0 of 4 on GPU 0" in said, lines[-30:]
    assert {"[rank 1] rank 1 of 4 on GPU 1", "[rank 2] rank 2 of 4 on GPU 0", "[rank 3] rank 3 of 4 on GPU 1"} <= said
    assert "the ranks' weights agree: True" in said, lines[-30:]
    train = [p for p in client.get(f"/api/jobs/{job['id']}/metrics").json() if p["split"] == "train"]
    assert [p["step"] for p in train] == list(range(1, 21)), "rank 0 alone reports for the job"


def rank_program(stack: Stack, host: str) -> psutil.Process | None:
    """The ring program running below `host`'s worker (its Python, not bwrap)."""
    worker = stack.processes[f"worker-{host}"]
    for process in psutil.Process(worker.pid).children(recursive=True):
        try:
            line = process.cmdline()
        except psutil.Error:
            continue
        if "ring.py" in line and "bwrap" not in line[0]:
            return process
    return None


def test_a_killed_rank_sends_the_gang_back_and_both_hosts_resume_from_rank_0s_checkpoint(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """A resumable program, one process a host, the ranks exchanging a number every step
    through rank 0's MASTER_ADDR:MASTER_PORT. Rank 1's program is killed: the whole job
    goes back as a crash, and its next attempt runs on both hosts from rank 0's last
    checkpoint: every step reported once, and the sum of what the ranks sent is whole. Only
    rank 0 reports for the job: rank 1's `towerq.report()` lines are text."""
    client = two_hosts(stack, make_token("root", admin=True))
    code = upload_code(client, {"ring.py": RING})
    spec = {"command": ["python", "ring.py", "60"], "code": code, "gpu_count": 4, "network": True, "resumable": True}
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    wait_for(lambda: max(train_steps(client, job_id), default=0) >= 12, 120, "attempt 1 past its checkpoint at 10")
    job = client.get(f"/api/jobs/{job_id}").json()
    rank_1_host = next(r["host"] for r in job["allocation"]["ranks"] if r["rank"] == 1)
    victim = wait_for(lambda: rank_program(stack, rank_1_host), 10, "rank 1's program")
    victim.kill()
    killed_at = time.monotonic()
    wait_for(lambda: client.get(f"/api/jobs/{job_id}").json()["attempts"] == 2, 60, "the job to go back", 0.2)
    assert time.monotonic() - killed_at < 30
    job = finished(client, job_id, 240)
    lines = log_messages(client, job_id)
    assert job["state"] == "succeeded", (job["error"], lines[-30:])
    assert job["crashes"] == 1 and job["attempts"] == 2, job
    steps = train_steps(client, job_id)
    assert steps == list(range(1, 61)), steps  # none twice, none missing, over both attempts
    resumed = [m for m in lines if "starts after step" in m and not m.endswith("after step 0")]
    assert sorted(m.split(" on ")[0] for m in resumed) == ["[rank 0", "[rank 1"], resumed
    assert len({m.rpartition(" ")[2] for m in resumed}) == 1, f"both ranks resumed from one checkpoint: {resumed}"
    points = client.get(f"/api/jobs/{job_id}/metrics").json()
    assert points[-1]["custom"]["total"] == 60 * 3.0, "each step summed both ranks' numbers once"
    assert all(p["loss"] != 99.0 for p in points), "rank 1's towerq.report() is not the job's"
    assert any(m.startswith("[rank 1 on ") and '"loss": 99.0' in m for m in lines), lines[-30:]


GANG = """
import os, sys, time

if os.environ["RANK"] == os.environ.get("BUSY_RANK") and "FAKE_GPU_BUSY" not in os.environ:
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "FAKE_GPU_BUSY": "60"})  # its kernels
import towerq

for step in range(1, int(sys.argv[1]) + 1):
    if os.environ["RANK"] == "0":
        towerq.report(step=step, loss=1.0 / step)
    time.sleep(0.5)
print("rank", os.environ["RANK"], "held its GPUs to the end", flush=True)
"""


def test_a_job_over_two_hosts_is_stopped_once_every_rank_held_its_gpus_idle_the_labs_stop_time(
    stack: Stack, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOWERQ_GPU_IDLE_STOP_S (3 s here) over two hosts on the fake NVML (tests/fakenvml: each
    worker sees both hosts' programs on its GPUs, and takes its own rank's part of their use):
    a gang whose rank 1 keeps its GPUs busy runs on past the stop time though rank 0's are idle,
    and succeeds; the same gang with both ranks idle is stopped on both hosts and fails, saying
    so."""
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_NVML}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("FAKE_NVML_GPUS", "81559,81559")
    stack.start_api()
    stack.start_scheduler()
    for host in ("lab-a", "lab-b"):
        monkeypatch.setenv("FAKE_NVML_HOST", host)
        stack.spawn(f"worker-{host}", "worker", "--name", host, simulated_gpus=None, worker_address="127.0.0.1",
                    trainer_pool=0, sandbox="bwrap", gpu_use_sample_s=0.5, gpu_idle_stop_s=3)  # fmt: skip
    client = stack.client(make_token("root", admin=True))
    wait_for(lambda: len(client.get("/api/gpus").json()) == 4, 60, "both workers to register their GPUs")
    code = upload_code(client, {"gang.py": GANG})
    spec = {"command": ["python", "gang.py", "16"], "code": code, "gpu_count": 4, "network": True}

    busy = client.post("/api/jobs", json={**spec, "env": {"FAKE_GPU_MB": "900", "BUSY_RANK": "1"}})
    assert busy.status_code == 201, busy.text
    ran = finished(client, busy.json()["id"], 120)
    assert ran["state"] == "succeeded", (ran["error"], log_messages(client, ran["id"])[-20:])
    assert {r["host"] for r in ran["allocation"]["ranks"]} == {"lab-a", "lab-b"}
    assert ran["gpu_use"]["samples"] >= 10, ran["gpu_use"]  # the stop time passed, sampled

    idle = client.post(
        "/api/jobs", json={**spec, "command": ["python", "gang.py", "400"], "env": {"FAKE_GPU_MB": "900"}}
    )
    assert idle.status_code == 201, idle.text
    stopped = finished(client, idle.json()["id"], 60)
    assert stopped["state"] == "failed", stopped
    said = r"stopped: its GPUs were idle for [3-6]s on each of its 2 hosts \(busy under 5% at every sample; the lab "
    assert re.fullmatch(said + r"stops a job whose GPUs stay idle 3s: TOWERQ_GPU_IDLE_STOP_S\)", stopped["error"]), (
        stopped["error"]
    )
    assert (stopped["attempts"], stopped["crashes"]) == (1, 0), stopped["events"]
    wait_for(lambda: all(not g["holders"] for g in client.get("/api/gpus").json()), 30, "every GPU free")


def test_a_job_over_two_hosts_stops_at_its_time_limit_and_fails_so_with_no_crash(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """The time limit counts from the attempt's start, the same for every rank: rank 0's worker
    stops its program at the limit, and towerq asks rank 1's. This program ends when a peer
    goes, so one rank's program often ends of the other's stop before its own worker stops it,
    and that rank's end is a crash: at the limit it is the limit, and the job fails so, once,
    with no crash counted. (Before, each rank's worker counted from its own start, and such a
    crash sent the job back to run its time limit again; on hosts that start their ranks
    seconds apart it was the rule. On one machine the ranks start within milliseconds:
    tests/service/core/test_attempts.py shows the crash at the limit taken for the limit.)"""
    client = two_hosts(stack, make_token("root", admin=True))
    code = upload_code(client, {"ring.py": RING})
    spec = {"command": ["python", "ring.py", "400"], "code": code, "gpu_count": 4, "network": True, "time_limit_s": 6}
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job = finished(client, created.json()["id"], 120)
    lines = log_messages(client, job["id"])
    assert job["state"] == "failed", (job["error"], lines[-20:])
    assert re.fullmatch(r"time limit of 6s reached at step \d+", job["error"]), job["error"]
    assert (job["attempts"], job["crashes"]) == (1, 0), job["events"]
    # the stop is said by a rank still running when its worker stopped it: rank 0's, or rank 1's
    # when towerq's word reached its worker first and rank 0's program then ended of its peer's end
    hosts = {r["rank"]: r["host"] for r in job["allocation"]["ranks"]}
    stopped = [
        f"[rank {rank} on {host}] stopping it: time limit of 6s reached (SIGTERM now; SIGKILL in "
        for rank, host in hosts.items()
    ]
    assert any(line.startswith(tuple(stopped)) for line in lines), [line for line in lines if '"event"' not in line]
    wait_for(lambda: all(not g["holders"] for g in client.get("/api/gpus").json()), 30, "every GPU free")
