"""How a trainer's lines reach the job's log: TensorFlow's start-up chatter left out, its
warnings and errors kept with their level, and an evaluation said in words."""

from __future__ import annotations

import pytest

from service.core.models import JobState
from towerq.contract.spec import stoppable
from worker.outcome import Outcome, StderrLevels, Stop, exit_message, is_runtime_noise, level_of
from worker.relay import evaluation_line

# Printed by TensorFlow 2.21 (CPU) at import with TF_CPP_MIN_LOG_LEVEL=1, twice each.
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
ONEDNN = (
    "I0000 00:00:1795635917.244518   12585 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. "
    "To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`."
)
OLDER_INFO = "2026-11-25 19:33:12.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on."


@pytest.mark.parametrize("line", [BANNER, ONEDNN, OLDER_INFO])
def test_tensorflow_start_up_chatter_is_noise(line: str) -> None:
    assert is_runtime_noise(line)


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("W0000 00:00:1795635917.2 12585 cuda_dnn.cc:8310] Unable to register cuDNN factory", "warning"),
        ("E0000 00:00:1795635917.2 12585 cuda_blas.cc:1418] Unable to register cuBLAS factory", "error"),
        ("2026-11-25 19:33:12.123456: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed", "warning"),
        ("[W1206 21:29:30.183097557 socket.cpp:207] [c10d] The hostname of the client socket cannot be", "warning"),
        ("[E1206 21:29:30.183097557 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed", "error"),
        ("Traceback (most recent call last):", "error"),
        ("UserWarning: the learning rate is large", "warning"),
        ("I am a line the user's model printed", "info"),
        ("INFO: but not a native log line", "info"),
        ("/job/work/train.py:12: UserWarning: the learning rate is large", "warning"),
        ("WARNING:root:no GPU, on the CPU", "warning"),
        ("ERROR:__main__:the data is short", "error"),
        ("ERROR: No matching distribution found for x==9", "error"),
        ("[WARN] slow step", "warning"),
        ("WARNINGS counted: 3", "info"),
    ],
)
def test_what_matters_is_kept_with_its_level(line: str, level: str) -> None:
    assert not is_runtime_noise(line)
    assert level_of(line) == level


def test_an_evaluation_is_said_in_words() -> None:
    # The point as the relay keeps it: numbers checked, the model's own metrics under `custom`.
    point = {"step": 400, "split": "eval", "loss": 0.41234, "accuracy": 0.912, "custom": {"top5": 0.99, "odd": None}}
    assert evaluation_line(point) == "evaluation at step 400: loss 0.4123, accuracy 91.20%, top5 0.99"
    empty = {"step": 7, "split": "eval", "loss": None, "accuracy": None, "custom": None}
    assert evaluation_line(empty) == "evaluation at step 7: no figures"


@pytest.mark.parametrize(
    ("stop", "state", "said"),
    [
        (Stop.IDLE, JobState.SUCCEEDED, "idle for 20 s"),
        (Stop.TIME_LIMIT, JobState.SUCCEEDED, "idle for 20 s"),
        (Stop.SHUTDOWN, JobState.CANCELLED, "the session ended"),
        (Stop.NOT_READY, JobState.FAILED, "idle for 20 s"),
        (Stop.CANCEL, JobState.CANCELLED, "idle for 20 s"),
    ],
)
def test_a_notebook_session_ends_rather_than_queues_again(stop: Stop, state: JobState, said: str) -> None:
    outcome = Outcome(program=True, session=True, stop=stop, stop_message="idle for 20 s", returncode=0)
    ended, message = outcome.verdict()
    assert ended == state and said in (message or ""), (ended, message)
    program = Outcome(program=True, stop=Stop.SHUTDOWN, stop_message="worker shut down")
    assert program.verdict()[0] == JobState.QUEUED, "a command job's attempt is queued again"


def test_the_scheduler_never_stops_a_session_for_another_job() -> None:
    assert stoppable({"model": "mlp"}) and stoppable({"command": ["x"], "resumable": True})
    assert not stoppable({"command": ["x"]})
    assert not stoppable({"kind": "notebook", "command": None, "resumable": False})


@pytest.mark.parametrize("stop", [Stop.CANCEL, Stop.PREEMPT, Stop.SHUTDOWN, Stop.TIME_LIMIT, Stop.GPU_IDLE])
def test_a_stop_after_the_last_step_leaves_a_trained_job_succeeded(stop: Stop) -> None:
    done = {"step": 100, "final": None, "seconds": 3.0}
    assert Outcome(done=done, stop=stop, stop_message="cancelled by alice", returncode=0).verdict() == (
        JobState.SUCCEEDED,
        None,
    )
    stopped = Outcome(stop=stop, stop_message="cancelled by alice", returncode=143, step=60).verdict()[0]
    assert stopped != JobState.SUCCEEDED, "a stop before the last step still stops the job"
    program = Outcome(program=True, stop=Stop.CANCEL, stop_message="cancelled by alice", returncode=0)
    assert program.verdict()[0] == JobState.CANCELLED, "a program that exits 0 on SIGTERM is still cancelled"


def test_a_full_folder_fails_a_job_even_when_it_trained() -> None:
    done = {"step": 100, "final": None, "seconds": 3.0}
    full = Outcome(done=done, stop=Stop.FOLDER_FULL, stop_message="its folder takes 2 GB", returncode=0)
    assert full.verdict() == (JobState.FAILED, "its folder takes 2 GB")


def test_a_job_stopped_for_gpus_held_idle_fails_saying_so() -> None:
    said = "stopped: its GPUs were idle for 2h (busy under 5% at every sample; ...)"
    for program in (False, True):  # a model job's trainer and a command alike, however they exit
        for returncode in (0, 143):
            idle = Outcome(program=program, stop=Stop.GPU_IDLE, stop_message=said, returncode=returncode, step=40)
            assert idle.verdict() == (JobState.FAILED, said), (program, returncode)


def test_a_time_limit_before_the_first_step_says_so_in_words() -> None:
    early = Outcome(stop=Stop.TIME_LIMIT, stop_message="time limit of 5s reached", returncode=143)
    assert early.verdict() == (JobState.FAILED, "time limit of 5s reached before its first step")
    late = Outcome(stop=Stop.TIME_LIMIT, stop_message="time limit of 5s reached", returncode=143, step=40)
    assert late.verdict() == (JobState.FAILED, "time limit of 5s reached at step 40")


def test_each_rank_records_only_what_is_its_to_record() -> None:
    """Rank 0 (or a job's only rank) records every end; another rank of a job over several
    hosts leaves a success and a stop every rank was asked for to rank 0, and says where it
    ran in a failure it records; nobody records a stale attempt's end or an executor's stop."""
    failed = Outcome(ranks=2, returncode=1, error={"kind": "error", "message": "ValueError: bad"})
    end = failed.recorded_end(1.0, False, "lab-b")
    assert end is not None and (end.ending, end.message, end.exit_code) == ("failed", "lab-b: ValueError: bad", 1)
    end = failed.recorded_end(1.0, True, "lab-a")
    assert end is not None and (end.ending, end.message) == ("failed", "ValueError: bad")

    done = Outcome(ranks=2, returncode=0, done={"step": 10})
    assert done.recorded_end(1.0, False, "lab-b") is None
    end = done.recorded_end(1.0, True, "lab-a")
    assert end is not None and (end.ending, end.message) == ("succeeded", None)
    for stop in (Stop.CANCEL, Stop.PREEMPT, Stop.TIME_LIMIT, Stop.GPU_IDLE, Stop.SWEEP):
        asked = Outcome(ranks=2, returncode=-15, stop=stop, stop_message="asked")
        assert asked.recorded_end(1.0, False, "lab-b") is None, stop
        assert asked.recorded_end(1.0, True, "lab-a") is not None, stop
    agreed = Outcome(ranks=2, returncode=0, agreed_stop=True)
    assert agreed.recorded_end(1.0, False, "lab-b") is None  # stopped with the others: rank 0's to say
    for stop in (Stop.STALE, Stop.EXECUTOR):
        assert Outcome(returncode=-9, stop=stop).recorded_end(1.0, True, "lab-a") is None, stop

    crashed = Outcome(ranks=2, returncode=1)  # a rank died without a word: its peers notice, a crash
    end = crashed.recorded_end(1.0, False, "lab-b")
    assert end is not None and (end.ending, end.crashed) == ("queued", True)


def test_a_programs_last_words_are_its_last_line_that_says_something() -> None:
    """torchrun's failure summary ends with a rule of `=`: the reason was that rule."""
    summary = [
        "  exitcode  : -6 (pid: 8)  (SIGABRT)",
        "  traceback : Signal 6 (SIGABRT) received by PID 8",
        "=" * 51,
        "",
    ]
    assert exit_message(1, summary, "the program") == (
        "the program exited with code 1: traceback : Signal 6 (SIGABRT) received by PID 8"
    )
    assert exit_message(2, ["-----", "   "], "the program") == "the program exited with code 2"


def test_every_line_of_a_traceback_is_an_error_and_a_warnings_source_line_a_warning() -> None:
    """What Python writes to stderr, line by line: a chained traceback, then a warning and
    its source line, and lines of the program's own around them."""
    lines = [
        ("epoch 1", "info"),
        ("/job/work/train.py:3: UserWarning: the learning rate is large", "warning"),
        ('  warnings.warn("the learning rate is large")', "warning"),
        ("epoch 2", "info"),
        ("Traceback (most recent call last):", "error"),
        ('  File "/job/work/train.py", line 8, in <module>', "error"),
        ("    load()", "error"),
        ("    ~~~~^^", "error"),
        ("KeyError: 'data'", "error"),
        ("The above exception was the direct cause of the following exception:", "error"),
        ("Traceback (most recent call last):", "error"),
        ('  File "/job/work/train.py", line 10, in <module>', "error"),
        ("__main__.DataMissing: no data", "error"),
        ("  an indented line of the program's own", "info"),
        ("epoch 3: loss 0.4", "info"),
        ("Traceback (most recent call last):", "error"),
        ("a line of another process comes in", "info"),
        ('  File "/job/work/train.py", line 8, in <module>', "info"),
    ]
    levels = StderrLevels()
    assert [(line, levels(line)) for line, _ in lines] == lines
