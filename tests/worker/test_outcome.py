"""How a trainer's lines reach the job's log: TensorFlow's start-up chatter left out, its
warnings and errors kept with their level, and an evaluation said in words."""

from __future__ import annotations

import pytest

from worker.outcome import is_runtime_noise, level_of
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
        ("Traceback (most recent call last):", "error"),
        ("UserWarning: the learning rate is large", "warning"),
        ("I am a line the user's model printed", "info"),
        ("INFO: but not a native log line", "info"),
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
