"""`python -m worker.trainer SPEC.json`: one training run, reported as JSON lines.

`python -m worker.trainer --warm NICE` is a warm trainer of the worker's pool
(`worker.pool`): it imports TensorFlow and the trainer, touching no device, prints a
`warm` line and waits on stdin for one line, `{"spec": PATH, "cwd": DIR, "env": {...}}`,
the job it is given. It sets that environment (`CUDA_VISIBLE_DEVICES` above all) before
TensorFlow initialises any device, then runs the job as a cold trainer would, once: a
trainer process never serves a second job. End of input (the pool closing) ends it.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from pydantic import ValidationError

from towerq.contract.runtime import TrainerInput
from towerq.contract.spec import describe
from worker.trainer import frameworks
from worker.trainer.errors import SpecFileError, TrainerError
from worker.trainer.protocol import EXIT_ERROR, EXIT_OK, Reporter

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None) -> None:
    """Ask the kernel to SIGKILL this process when the worker thread that started it dies,
    and exit now if that already happened (the race before the request took effect)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return  # not Linux: the worker's process-group kill still applies
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(EXIT_ERROR)


def lower_priority(nice: int) -> None:
    """Run at CPU niceness `nice`. The trainer leads a session of its own, and Linux's
    autogroup weighs sessions against each other before niceness counts inside one, so the
    session's group is niced too (where the kernel has autogroup)."""
    if not nice:
        return
    os.nice(nice)
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError:
        pass  # no autogroup here: the process's niceness is what counts


def read_spec(path: str) -> TrainerInput:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SpecFileError(f"cannot read spec file {path}: {err}") from err
    try:
        return TrainerInput.model_validate(raw)
    except ValidationError as err:
        raise SpecFileError(f"invalid spec: {describe(err)}") from err


def wait_for_job(reporter: Reporter, nice: int) -> str | None:
    """A warm trainer's life before its job: TensorFlow imported, the job read from stdin,
    its environment and folder taken. The spec path, or None when the pool closed first."""
    die_with_parent(None)
    lower_priority(nice)
    frameworks.load()
    from worker.trainer import loop  # noqa: F401 - the import is the point: TensorFlow, Keras, the trainer

    reporter.emit("warm", pid=os.getpid())
    line = sys.stdin.readline()
    if not line.strip():
        return None
    job = json.loads(line)
    os.environ.update({str(name): str(value) for name, value in job.get("env", {}).items()})
    os.chdir(job["cwd"])
    return str(job["spec"])


def main(argv: list[str]) -> int:
    reporter = Reporter()
    warm = len(argv) == 3 and argv[1] == "--warm"
    if len(argv) != 2 and not warm:
        reporter.emit("error", kind="spec", message="usage: python -m worker.trainer SPEC.json | --warm NICE")
        return EXIT_ERROR
    try:
        if warm:
            path = wait_for_job(reporter, int(argv[2]))
            if path is None:
                return EXIT_OK
            spec = read_spec(path)
            die_with_parent(spec.runtime.parent_pid)
        else:
            spec = read_spec(argv[1])
            die_with_parent(spec.runtime.parent_pid)
            lower_priority(spec.runtime.nice)
        frameworks.load()  # TensorFlow loads here, after the cheap checks
        from worker.trainer import loop

        stop = loop.StopFlag()
        stop.install()
        run = loop.prepare(spec, reporter)
        loop.announce(run, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return loop.train(run, stop)
    except TrainerError as err:
        reporter.emit("error", kind=err.kind, message=err.message)
        return EXIT_ERROR
    except Exception as err:  # noqa: BLE001 - any crash must end as an `error` line
        traceback.print_exc()
        if type(err).__name__ == "ResourceExhaustedError":  # outside the step (evaluation, setup)
            reporter.emit("error", kind="oom", message=f"out of memory: {str(err)[:300]}")
        else:
            reporter.emit("error", kind="internal", message=f"{type(err).__name__}: {err}")
        return EXIT_ERROR


def exit_now(code: int) -> None:
    """Exit with `code` at once (`os._exit`), after the exit handlers Python code registered
    (`atexit`) and with stdout and stderr flushed: the trainer has said its last word and
    saved what it saves, and tearing down TensorFlow's objects one by one only keeps the
    job's GPUs from the next job (about a second for the smallest model, more for a large
    one). A rank of a job over several hosts skips the handlers too: TensorFlow's cluster
    shutdown at exit waits for the other ranks, which may be gone."""
    if "TF_CONFIG" not in os.environ:
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv))
