"""`python -m worker.gang -- COMMAND...`: a command job's processes, one per GPU
(`"processes": "per_gpu"`), started inside the job's sandbox as one attempt.

Each process sees only its own GPU (`CUDA_VISIBLE_DEVICES` is one of the job's) and gets
what the frameworks read for data parallelism on one host: `RANK`, `LOCAL_RANK`,
`WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (PyTorch's
`init_process_group(init_method="env://")`), `TF_CONFIG` (TensorFlow's
`MultiWorkerMirroredStrategy`) and JAX's `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
`JAX_PROCESS_ID`. Rank 0's stdout is the job's protocol (its `towerq.report()` lines are
the job's metrics); the other ranks' lines are text in the job's log, each marked
`[rank N]`, their protocol lines too. When one process fails the others are stopped
(SIGTERM, then SIGKILL after the grace) and the gang exits with its code, its last stderr
line last. A stop (cancel, preemption) signals the attempt's whole process group, the
ranks with the gang, and the gang waits for them.

Standard library only: it runs with the sandbox's Python before any user code.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

GRACE_S = 10.0
"""How long the others have to end after one failed, before SIGKILL."""


def die_with_the_gang() -> None:
    """In each rank, before exec: SIGKILL when the gang dies (outside the sandbox nothing
    else would end a rank whose worker was killed; inside, bwrap's namespace does)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def rank_environments(gpus: list[str], base: dict[str, str]) -> list[dict[str, str]]:
    """The environment of each rank: its own GPU, its rank, and the gang's meeting points."""
    size = len(gpus)
    master, *workers = free_ports(size + 1)
    cluster = {"cluster": {"worker": [f"127.0.0.1:{port}" for port in workers]}}
    envs = []
    for rank, gpu in enumerate(gpus):
        env = dict(base)
        env.update(
            CUDA_VISIBLE_DEVICES=gpu,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(size),
            LOCAL_WORLD_SIZE=str(size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master),
            TF_CONFIG=json.dumps({**cluster, "task": {"type": "worker", "index": rank}}),
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{master}",
            JAX_NUM_PROCESSES=str(size),
            JAX_PROCESS_ID=str(rank),
        )
        envs.append(env)
    return envs


class Gang:
    def __init__(self, command: list[str], envs: list[dict[str, str]]) -> None:
        self.lock = threading.Lock()
        self.processes = [
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_the_gang
            )
            for env in envs
        ]
        self.last_stderr: dict[int, str] = {}
        self.relays = [
            threading.Thread(target=self._relay, args=(rank, stream, out), daemon=True)
            for rank, process in enumerate(self.processes)
            for stream, out in ((process.stdout, sys.stdout.buffer), (process.stderr, sys.stderr.buffer))
        ]
        for relay in self.relays:
            relay.start()

    def _relay(self, rank: int, stream: IO[bytes] | None, out: IO[bytes]) -> None:
        assert stream is not None
        for line in iter(stream.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            if rank:  # marked, its protocol lines too are text: rank 0 speaks for the job
                line = b"[rank %d] " % rank + line
            if out is sys.stderr.buffer and line.strip():
                self.last_stderr[rank] = line.decode(errors="replace").rstrip("\n")
            with self.lock:
                out.write(line)
                out.flush()

    def signal_all(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    process.send_signal(signum)
                except ProcessLookupError:
                    pass

    def wait(self) -> int:
        """Until all end; the gang's exit code: the first failure's, else 0."""
        failed: int | None = None
        deadline: float | None = None
        while True:
            codes = [process.poll() for process in self.processes]
            if failed is None:
                failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
                if failed is not None:
                    self.signal_all(signal.SIGTERM)
                    deadline = time.monotonic() + GRACE_S
            if all(code is not None for code in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                self.signal_all(signal.SIGKILL)
                deadline = None
            time.sleep(0.1)
        for relay in self.relays:
            relay.join(timeout=5)
        if failed is None:
            return 0
        code = self.processes[failed].returncode
        said = self.last_stderr.get(failed)
        if said:
            with self.lock:
                sys.stderr.write(said + "\n")  # the job's reason: the rank that failed first
                sys.stderr.flush()
        return code if code > 0 else 128 - code


def main() -> int:
    command = sys.argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("usage: python -m worker.gang -- COMMAND...", file=sys.stderr)
        return 2
    gpus = [gpu for gpu in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if gpu.strip()]
    gang = Gang(command, rank_environments(gpus or ["0"], dict(os.environ)))
    # a stop signals the attempt's whole process group, the ranks too: the gang waits for them
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    return gang.wait()


if __name__ == "__main__":
    sys.exit(main())
