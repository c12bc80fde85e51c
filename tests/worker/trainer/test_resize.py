"""A job stopped and resumed on a different number of GPUs trains as if it had kept its
size: a step's global batch is `batch_size × gpu_count` on any number of towers (each
takes a larger slice on fewer), and its input order is a function of the seed, the data
and that global batch, so only the float rounding of the towers' sums differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.worker.trainer.test_process import checkpoint_values, events, run, stopped_at, write_spec
from worker.trainer.protocol import EXIT_OK, EXIT_STOPPED

pytestmark = pytest.mark.slow

STEPS = 200
HYPER = {"steps": STEPS, "checkpoint_every": 0, "eval_every": 0, "log_every": 1}
SIZE = 4

BATCH_NORM_MODEL = """
import keras


def net(params):
    L = keras.layers
    inputs = keras.Input(params["input_shape"])
    x = L.Conv2D(8, 3, use_bias=False)(inputs)
    x = L.ReLU()(L.BatchNormalization(momentum=0.9)(x))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(params["num_classes"])(x))
"""


def segment(spec: Path, until: int) -> list[dict[str, Any]]:
    """The trainer's lines from its start until it is stopped as a resize stops it (SIGTERM
    once it reports step `until`: it checkpoints where it is and exits 143), or until it ends."""
    code, lines = stopped_at(spec, until)
    assert code in (EXIT_OK, EXIT_STOPPED), lines[-3:]
    return lines


@pytest.mark.parametrize("model", ["lenet5", "nets:net"], ids=["lenet5", "batch-norm"])
def test_a_job_resized_4_1_4_ends_with_the_loss_of_one_that_kept_its_4_gpus(tmp_path: Path, model: str) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "nets.py").write_text(BATCH_NORM_MODEL)
    code, whole = run(write_spec(tmp_path, "whole", towers=SIZE, model=model, hyperparameters=HYPER))
    assert code == EXIT_OK

    def resized(towers: int) -> Path:
        return write_spec(
            tmp_path, "resized", towers=towers, runtime={"batch_gpus": SIZE}, model=model, hyperparameters=HYPER
        )

    first = segment(resized(4), until=40)
    stopped = events(first, "stopped")[0]["step"]
    second = segment(resized(1), until=stopped + 60)
    started = second[0]
    assert started["resumed_from_step"] == stopped
    assert (started["towers"], started["tower_batches"], started["global_batch"]) == (1, [8 * SIZE], 8 * SIZE)
    third = segment(resized(4), until=STEPS + 1)
    assert third[0]["resumed_from_step"] == events(second, "stopped")[0]["step"]
    assert events(third, "done")[0]["step"] == STEPS

    # every step once, none twice or missing
    steps = [m["step"] for lines in (first, second, third) for m in events(lines, "metric")]
    assert steps == list(range(1, STEPS + 1))
    losses = {m["step"]: m["loss"] for lines in (first, second, third) for m in events(lines, "metric")}
    expected = {m["step"]: m["loss"] for m in events(whole, "metric")}
    assert losses[STEPS] == pytest.approx(expected[STEPS], rel=1e-5)
    assert losses[stopped] == expected[stopped]  # the same 4 towers up to the first stop: exactly
    worst = max(abs(losses[s] - expected[s]) / abs(expected[s]) for s in range(1, STEPS + 1))
    print(f"{model}: largest relative difference of a step's loss over {STEPS} steps: {worst:.2e}")
    trained, kept = checkpoint_values(tmp_path / "resized"), checkpoint_values(tmp_path / "whole")
    for name, value in kept.items():
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f":  # counts, the checkpoint's own records
            continue
        np.testing.assert_allclose(trained[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
