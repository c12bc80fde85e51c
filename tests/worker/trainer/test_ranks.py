"""A job over several hosts, the trainer's side: two trainer processes (ranks) joined by
TensorFlow's collective ops on this machine train like one device on the whole batch,
stop together, and never hang when a peer dies, freezes or stalls."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.worker.trainer.test_process import REPO, events, run, write_spec
from worker.trainer.protocol import EXIT_ERROR, EXIT_OK, EXIT_STOPPED

pytestmark = pytest.mark.slow
HYPER = {"steps": 12, "batch_size": 4, "seed": 5, "optimizer": "momentum", "learning_rate": 0.05, "log_every": 1}


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def gang_specs(tmp_path: Path, size: int = 2, towers: int = 2, timeout_s: float = 20.0, **train: Any) -> list[Path]:
    cluster = [f"127.0.0.1:{port}" for port in free_ports(size)]
    paths = []
    for rank in range(size):
        path = write_spec(tmp_path, "gang", towers=towers, **train)
        body = json.loads(path.read_text())
        body["runtime"].update(cluster=cluster, rank=rank, collective_timeout_s=timeout_s)
        ranked = tmp_path / f"rank-{rank}.json"
        ranked.write_text(json.dumps(body))
        paths.append(ranked)
    return paths


def start_ranks(paths: list[Path], stall_rank: int | None = None) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "worker.trainer", str(path)],
            cwd=REPO,
            env={**env, "STALL": "1"} if rank == stall_rank else env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, path in enumerate(paths)
    ]


def lines_of(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def finish_all(processes: list[subprocess.Popen[str]], timeout: float = 240) -> list[tuple[int, list[dict[str, Any]]]]:
    results = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=timeout)
        finally:
            process.kill()
        results.append((process.returncode, lines_of(out)))
    return results


def test_two_hosts_of_two_towers_train_like_one_device_on_the_whole_batch(tmp_path: Path) -> None:
    model = {"model": "mlp", "dataset": "synthetic"}
    one_code, one = run(write_spec(tmp_path, "one", towers=1, hyperparameters={**HYPER, "batch_size": 16}, **model))
    (rank0_code, rank0), (rank1_code, rank1) = finish_all(
        start_ranks(gang_specs(tmp_path, hyperparameters=HYPER, **model))
    )
    assert one_code == EXIT_OK and rank0_code == EXIT_OK and rank1_code == EXIT_OK, (rank0[-1:], rank1[-1:])
    started = events(rank0, "started")[0]
    assert (started["towers"], started["global_batch"], started["rank"], started["ranks"]) == (4, 16, 0, 2)
    single = [m["loss"] for m in events(one, "metric")]
    gang = [m["loss"] for m in events(rank0, "metric")]
    assert len(gang) == HYPER["steps"] and np.allclose(gang, single, rtol=1e-4, atol=1e-5), (gang, single)
    assert [m["step"] for m in events(rank0, "metric")] == list(range(1, 13))
    assert not events(rank1, "metric") and not events(rank1, "eval") and not events(rank1, "checkpoint")
    assert events(rank0, "done") and events(rank1, "done")
    assert (tmp_path / "gang" / "checkpoints").is_dir()


@pytest.mark.parametrize("how", ["killed", "frozen", "stalled"])
def test_a_lost_peer_is_noticed_in_bounded_time_and_nobody_hangs(tmp_path: Path, how: str) -> None:
    hyper = {**HYPER, "steps": 100_000, "log_every": 10}
    paths = gang_specs(tmp_path, timeout_s=8.0, hyperparameters=hyper, model="mlp", dataset="synthetic")
    if how == "stalled":  # rank 1's model sleeps for 10 minutes after 200 tower calls (~100 steps): alive, silent
        (tmp_path / "models").mkdir(exist_ok=True)
        (tmp_path / "models" / "stall_at_60.py").write_text(STALLING_MODEL)
        for path in paths:
            body = json.loads(path.read_text())
            body["train"]["model"] = "stall_at_60:build"
            body["runtime"]["models_path"] = str(tmp_path / "models")
            path.write_text(json.dumps(body))
    processes = start_ranks(paths, stall_rank=1 if how == "stalled" else None)
    try:
        assert _wait_for_step(processes[0], 30, 180) is not None
        lost_at = time.monotonic()
        if how == "killed":
            processes[1].kill()
        elif how == "frozen":
            processes[1].send_signal(signal.SIGSTOP)
        out, err = processes[0].communicate(timeout=90)
        noticed = time.monotonic() - lost_at
    finally:
        for process in processes:
            process.kill()
            process.communicate()
    errors = events(lines_of(out), "error")
    code = processes[0].returncode
    said = f"exit code {code}\n{out[-2000:]}\n--- stderr ---\n{err[-3000:]}"
    said_so = code == EXIT_ERROR and errors and errors[0]["kind"] == "peer_lost"
    # TensorFlow itself sometimes dies while it cancels the timed-out collective (seen in
    # 2026-11: "Mutex corrupt: waiting writer with no waiters", SIGABRT; in 2026-12 after
    # "RAW: Lock blocking" lines): the rank still ended in bounded time, by a signal of its
    # own (the test kills it only after), and its worker takes that exit for a lost rank
    aborted = code is not None and code < 0 and "Collective has timed out" in err
    assert said_so or aborted, said
    assert noticed < 30, noticed


STALL_FILE = "stall-rank-1"
STALLING_MODEL = """
import json
import os
import time
import keras
import tensorflow as tf

calls = [0]

def _stalls():
    \"\"\"After 200 tower calls where STALL is set (trainer processes of these tests), or rank 1
    once the file stall-rank-1 is in its working folder (bench/multihost.py, through the service).\"\"\"
    if os.environ.get("STALL"):
        return calls[0] > 200
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    return task.get("index") == 1 and os.path.exists("stall-rank-1")

def _nap(x):
    calls[0] += 1
    if _stalls():
        time.sleep(600)  # alive, but silent: a stall
    return x

class Stall(keras.layers.Layer):
    def call(self, x):
        out = tf.py_function(_nap, [x], x.dtype)
        out.set_shape(x.shape)
        return out

    def compute_output_shape(self, shape):
        return shape

def build(params):
    inputs = keras.Input(params["input_shape"])
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(16, activation="relu")(x)
    x = Stall()(x)
    return keras.Model(inputs, keras.layers.Dense(params["num_classes"])(x))
"""


def _wait_for_step(process: subprocess.Popen[str], step: int, timeout: float) -> int | None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            return None
        if line.startswith("{"):
            event = json.loads(line)
            if event["event"] == "metric" and event["step"] >= step:
                return event["step"]
    return None


def test_a_stop_asked_of_one_rank_stops_both_after_the_same_step(tmp_path: Path) -> None:
    hyper = {**HYPER, "steps": 100_000, "log_every": 5}
    processes = start_ranks(gang_specs(tmp_path, hyperparameters=hyper, model="mlp", dataset="synthetic"))
    try:
        assert _wait_for_step(processes[0], 20, 180) is not None
        processes[1].send_signal(signal.SIGTERM)
        (code0, lines0), (code1, lines1) = finish_all(processes, timeout=90)
    finally:
        for process in processes:
            process.kill()
    assert (code0, code1) == (EXIT_STOPPED, EXIT_STOPPED), (lines0[-2:], lines1[-2:])
    stopped0, stopped1 = events(lines0, "stopped")[0]["step"], events(lines1, "stopped")[0]["step"]
    assert stopped0 == stopped1
    assert events(lines0, "checkpoint")[-1]["step"] == stopped0 and not events(lines1, "checkpoint")
