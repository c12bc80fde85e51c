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
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "MASTER_PORT", "TF_CONFIG")
print(json.dumps({"event": "log", "message": json.dumps({k: os.environ[k] for k in keys})}), flush=True)
if sys.argv[1] == "fail" and os.environ["RANK"] == "1":
    sys.exit("rank 1 ran out of patience")
if sys.argv[1] == "sleep":
    print("pid", os.getpid(), flush=True)
    time.sleep(600)
"""


def gang(*args: str, gpus: str = "3,5") -> subprocess.Popen[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "worker.gang", "--", sys.executable, "-c", RANK, *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_each_rank_sees_its_own_gpu_and_the_gang_and_rank_0_speaks_for_the_job() -> None:
    done = gang("ok")
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
