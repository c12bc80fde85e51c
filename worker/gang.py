"""`python -m worker.gang -- COMMAND...`: a command job's processes, one per GPU
(`"processes": "per_gpu"`), started inside the job's sandbox as one attempt.

Each process sees only its own GPU (`CUDA_VISIBLE_DEVICES` is one of the job's) and gets
what the frameworks read for data parallelism on one host: `RANK`, `LOCAL_RANK`,
`WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (PyTorch's
`init_process_group(init_method="env://")`), `TF_CONFIG` (TensorFlow's
`MultiWorkerMirroredStrategy`) and JAX's `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
`JAX_PROCESS_ID`. Over several hosts (`GANG_ENV`) the same, numbered over the whole job:
each host's worker runs its gang, host h's processes are ranks h × n to h × n + n - 1.
Rank 0's stdout is the job's protocol (its `towerq.report()` lines are the job's metrics);
the other ranks' lines are text in the job's log, each marked `[rank N]`, their protocol
lines too. When one process fails the others are stopped
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

from worker.lines import pieces

GRACE_S = 10.0
"""How long the others have to end after one failed, before SIGKILL."""
SIGNAL_ENV = "TOWERQ_SIGNAL"
"""The job's `signal` (`USR1@600`): the program's warning before its time limit."""


PR_SET_PDEATHSIG = 1


def die_with_the_gang() -> None:
    """In each rank, before exec: SIGKILL when the gang dies (outside the sandbox nothing
    else would end a rank whose worker was killed; inside, bwrap's namespace does)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


GANG_ENV = "TOWERQ_GANG"
"""A rank of a command job over several hosts: `{"hosts": ["address:port", ...], "rank": r}`,
every host's first port of its run (`worker.rendezvous.meet`) and this host's rank."""


def distributed_environment(
    master: str, workers: list[str], rank: int, local_rank: int, local_size: int
) -> dict[str, str]:
    """What the frameworks read of process `rank` of `len(workers)`: PyTorch's and JAX's
    meeting point `master` (rank 0's TCP store, JAX's coordinator), TensorFlow's cluster
    `workers` (one address each, this process listens on its own)."""
    address, _, port = master.rpartition(":")
    size = len(workers)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(size),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": address,
        "MASTER_PORT": port,
        "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}),
        "JAX_COORDINATOR_ADDRESS": master,
        "JAX_NUM_PROCESSES": str(size),
        "JAX_PROCESS_ID": str(rank),
    }


def over_hosts(hosts: list[str], host_rank: int, local_size: int) -> tuple[str, list[str], int]:
    """The meeting point, TensorFlow's cluster and this host's first rank of a job over
    several hosts, `local_size` processes on each: host h's run of ports starts at its
    rendezvous port p; p on host 0 is the meeting point, p + 1 + l process l's own."""
    workers = []
    for host in hosts:
        address, _, port = host.rpartition(":")
        workers += [f"{address}:{int(port) + 1 + local}" for local in range(local_size)]
    return hosts[0], workers, host_rank * local_size


def rank_environments(gpus: list[str], base: dict[str, str]) -> list[dict[str, str]]:
    """The environment of each process of this host: its own GPU, its rank, and the gang's
    meeting points (on this host alone, or over the hosts `GANG_ENV` names). Only the job's
    rank 0 keeps `TOWERQ_METRICS_LOG`: the others' points are not the job's."""
    size = len(gpus)
    base = dict(base)
    gang = base.pop(GANG_ENV, None)
    if gang:
        layout = json.loads(gang)
        master, workers, first = over_hosts(layout["hosts"], int(layout["rank"]), size)
    else:
        master_port, *ports = free_ports(size + 1)
        master, workers, first = f"127.0.0.1:{master_port}", [f"127.0.0.1:{port}" for port in ports], 0
    envs = []
    for local, gpu in enumerate(gpus):
        env = dict(base)
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env.update(distributed_environment(master, workers, first + local, local, size))
        if first + local:
            env.pop("TOWERQ_METRICS_LOG", None)
        envs.append(env)
    return envs


class Gang:
    def __init__(self, command: list[str], envs: list[dict[str, str]]) -> None:
        self.lock = threading.Lock()
        self.ranks = [int(env["RANK"]) for env in envs]
        """Each process's rank in the job (over several hosts, this host's are not from 0)."""
        self.processes = [
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_the_gang
            )
            for env in envs
        ]
        self.last_stderr: dict[int, str] = {}
        self.relays = [
            threading.Thread(target=self._relay, args=(local, stream, out), daemon=True)
            for local, process in enumerate(self.processes)
            for stream, out in ((process.stdout, sys.stdout.buffer), (process.stderr, sys.stderr.buffer))
        ]
        for relay in self.relays:
            relay.start()

    def _relay(self, local: int, stream: IO[bytes] | None, out: IO[bytes]) -> None:
        """Copy a process's output to the gang's, a piece at a time as it comes: a line, or a
        redraw of one (a progress bar's `\r`), each whole and marked with its rank but rank
        0's (`worker.lines`), so the worker reads a rank's bar as the rank's, as it comes."""
        assert stream is not None
        mark = b"[rank %d] " % self.ranks[local] if self.ranks[local] else b""
        rest = b""
        while chunk := os.read(stream.fileno(), 65536):
            cut, rest = pieces(rest + chunk)
            self._write(local, out, cut, mark)
        if rest:
            self._write(local, out, [rest.rstrip(b"\r") + b"\n"], mark)

    def _write(self, local: int, out: IO[bytes], cut: list[bytes], mark: bytes) -> None:
        # marked, a rank's protocol lines too are text: rank 0 speaks for the job
        marked = b"".join(mark + piece if piece.strip() else piece for piece in cut)
        if out is sys.stderr.buffer and (said := [p for p in cut if p.strip()]):
            self.last_stderr[local] = (mark + said[-1]).decode(errors="replace").rstrip("\r\n")
        with self.lock:
            out.write(marked)
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
    # the job's warning before its time limit comes to the gang alone: each rank gets it
    warning = os.environ.get(SIGNAL_ENV, "").partition("@")[0]
    if warning and hasattr(signal, f"SIG{warning}"):
        signal.signal(getattr(signal, f"SIG{warning}"), lambda signum, frame: gang.signal_all(signum))
    return gang.wait()


if __name__ == "__main__":
    sys.exit(main())
