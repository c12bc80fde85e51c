"""Models: every built-in one builds and trains; user models come from the models folder only."""

from __future__ import annotations

import os
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.worker.trainer.conftest import DEVICES
from worker.trainer.errors import ModelError
from worker.trainer.models import BUILTIN, build_model
from worker.trainer.towers import Objective, TowerStep

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [n for n in BUILTIN if n != "poly2"])
def test_builtin_classifiers_train_a_step_on_two_towers(name: str, tmp_path: Path) -> None:
    with tf.device(DEVICES[0]):
        model = build_model(name, (12, 12, 3), 10, {}, tmp_path)
    step = TowerStep(model, keras.optimizers.SGD(0.01), DEVICES[:2], DEVICES[0], Objective(False), 8)
    x = tf.random.normal((8, 12, 12, 3))
    y = tf.constant(np.arange(8) % 10, tf.int32)
    assert np.isfinite(float(step.train(x, y)["loss"]))


def test_poly2_learns_the_three_coefficients(tmp_path: Path) -> None:
    with tf.device(DEVICES[0]):
        model = build_model("poly2", (1,), 1, {}, tmp_path)
    step = TowerStep(model, keras.optimizers.Adam(0.1), DEVICES[:2], DEVICES[0], Objective(True), 64)
    x = tf.random.uniform((64, 1), -2, 2, seed=1)
    y = 1.5 * x**2 - 2.0 * x + 0.5
    for _ in range(300):
        result = step.train(x, y)
    assert float(result["loss"]) < 1e-3
    assert np.allclose(model.trainable_variables[0].numpy(), [1.5, -2.0, 0.5], atol=0.05)


USER_MODEL = """
import keras

def build(hparams):
    assert hparams["learning_rate"] == 0.5
    return keras.Sequential([keras.Input(hparams["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(hparams["model_options"].get("width", 8)),
                             keras.layers.Dense(hparams["num_classes"])])

def not_a_model(hparams):
    return 42
"""


def test_user_model_is_built_from_module_function_under_the_models_path(tmp_path: Path) -> None:
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "nets.py").write_text(USER_MODEL)
    model = build_model("lab.nets:build", (4, 4, 1), 5, {"learning_rate": 0.5, "model_options": {"width": 6}}, tmp_path)
    assert [tuple(v.shape) for v in model.trainable_variables] == [(16, 6), (6,), (6, 5), (5,)]


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("missing:build", "no file missing.py under TOWERQ_MODELS_PATH"),
        ("lab.nets:nothing", "lab/nets.py has no function 'nothing'"),
        ("lab.nets:not_a_model", "returned int, not a keras.Model"),
        ("escape:build", "leads outside"),
    ],
)
def test_user_model_errors_say_what_is_wrong(tmp_path: Path, reference: str, message: str) -> None:
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "nets.py").write_text(USER_MODEL)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text(USER_MODEL)
    os.symlink(outside, tmp_path / "escape.py")
    with pytest.raises(ModelError, match=message):
        build_model(reference, (4, 4, 1), 5, {"learning_rate": 0.5}, tmp_path)
