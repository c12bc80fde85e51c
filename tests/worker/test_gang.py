"""worker.gang, a command job's processes one per GPU: each rank's environment, rank 0's
protocol lines and the others' marked text, one failure ending the rest, and no rank
outliving the gang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.stack import REPO, wait_for
from worker.processes import pid_alive

RANK = r"""
import json, os, sys, time
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
        "TF_CONFIG", "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_ID", "TOWERQ_METRICS_LOG", "TOWERQ_GANG")
seen = {k: os.environ.get(k) for k in keys}
print(json.dumps({"event": "log", "message": json.dumps(seen)}), flush=True)
if sys.argv[1] == "fail" and os.environ["RANK"] == "1":
    sys.exit("rank 1 ran out of patience")
if sys.argv[1] == "sleep":
    print("pid", os.getpid(), flush=True)
    time.sleep(600)
"""


def gang(*args: str, gpus: str = "3,5", **extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": str(REPO), **extra}
    command = [sys.executable, "-m", "worker.gang", "--", sys.executable, "-c", RANK, *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_each_rank_sees_its_own_gpu_and_the_gang_and_rank_0_speaks_for_the_job() -> None:
    done = gang("ok", TOWERQ_METRICS_LOG="/job/metrics-attempt-1.jsonl")
    out, _ = done.communicate(timeout=60)
    assert done.returncode == 0
    lines = out.splitlines()
    own = [json.loads(json.loads(line)["message"]) for line in lines if line.startswith("{")]
    marked = [line for line in lines if line.startswith("[rank 1] {")]
    assert len(own) == 1 and len(marked) == 1, lines
    other = json.loads(json.loads(marked[0][len("[rank 1] ") :])["message"])
    assert (own[0]["RANK"], own[0]["CUDA_VISIBLE_DEVICES"], own[0]["WORLD_SIZE"]) == ("0", "3", "2")
    assert (other["RANK"], other["LOCAL_RANK"], other["CUDA_VISIBLE_DEVICES"]) == ("1", "1", "5")
    assert own[0]["MASTER_PORT"] == other["MASTER_PORT"]
    configs = [json.loads(rank["TF_CONFIG"]) for rank in (own[0], other)]
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert own[0]["TOWERQ_METRICS_LOG"] and other["TOWERQ_METRICS_LOG"] is None, "rank 1's points are not the job's"


def test_over_two_hosts_host_1_runs_ranks_2_and_3_of_4_meeting_at_host_0() -> None:
    """A job over two hosts of two GPUs: host 1's gang numbers its processes 2 and 3 of 4,
    all meet at host 0's first port (PyTorch, JAX), each listens on its own port of its
    host's run (TensorFlow), and none of them speaks for the job: every line is marked, and
    no process of this host keeps the job's metrics log."""
    layout = json.dumps({"hosts": ["10.0.0.1:29400", "10.0.0.2:29410"], "rank": 1})
    done = gang("ok", TOWERQ_GANG=layout, TOWERQ_METRICS_LOG="/job/metrics-attempt-1.jsonl")
    out, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    lines = out.splitlines()
    assert all(line.startswith(("[rank 2] ", "[rank 3] ")) for line in lines), lines
    seen = {line[1:7]: json.loads(json.loads(line[len("[rank 2] ") :])["message"]) for line in lines}
    two, three = seen["rank 2"], seen["rank 3"]
    assert (two["RANK"], two["LOCAL_RANK"], two["CUDA_VISIBLE_DEVICES"]) == ("2", "0", "3")
    assert (three["RANK"], three["LOCAL_RANK"], three["CUDA_VISIBLE_DEVICES"]) == ("3", "1", "5")
    assert two["WORLD_SIZE"] == three["WORLD_SIZE"] == "4" and two["LOCAL_WORLD_SIZE"] == "2"
    assert (two["MASTER_ADDR"], two["MASTER_PORT"], two["JAX_COORDINATOR_ADDRESS"]) == (
        "10.0.0.1",
        "29400",
        "10.0.0.1:29400",
    )
    workers = ["10.0.0.1:29401", "10.0.0.1:29402", "10.0.0.2:29411", "10.0.0.2:29412"]
    for rank, env in ((2, two), (3, three)):
        assert json.loads(env["TF_CONFIG"]) == {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": rank},
        }
        assert env["JAX_PROCESS_ID"] == str(rank)
        assert env["TOWERQ_METRICS_LOG"] is None and env["TOWERQ_GANG"] is None


def test_one_rank_failing_ends_the_gang_with_its_words_last() -> None:
    done = gang("fail")
    _, err = done.communicate(timeout=60)
    assert done.returncode == 1
    assert err.splitlines()[-1] == "[rank 1] rank 1 ran out of patience", err


def test_no_rank_outlives_a_killed_gang() -> None:
    running = gang("sleep")
    assert running.stdout is not None
    pids = []
    deadline = time.monotonic() + 60
    while len(pids) < 2 and time.monotonic() < deadline:
        line = running.stdout.readline()
        if "pid " in line:
            pids.append(int(line.rsplit(" ", 1)[1]))
    assert len(pids) == 2
    running.send_signal(signal.SIGKILL)
    running.wait()
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), 10, "the ranks to die with their gang")
