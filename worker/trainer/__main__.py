"""`python -m worker.trainer SPEC.json`: one training run, reported as JSON lines."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from pydantic import ValidationError

from worker.trainer.errors import SpecFileError, TrainerError
from worker.trainer.protocol import EXIT_ERROR, Reporter
from worker.trainer.spec import TrainerInput, describe

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


def main(argv: list[str]) -> int:
    reporter = Reporter()
    if len(argv) != 2:
        reporter.emit("error", kind="spec", message="usage: python -m worker.trainer SPEC.json")
        return EXIT_ERROR
    try:
        spec = read_spec(argv[1])
        die_with_parent(spec.runtime.parent_pid)
        lower_priority(spec.runtime.nice)
        from worker.trainer import loop  # TensorFlow loads here, after the cheap checks

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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
