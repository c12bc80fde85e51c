"""A trainer loads TensorFlow and Keras without scikit-learn (Keras imports it only for its
scikit-learn wrappers), a member's model still imports scikit-learn, and the digits read
without it are scikit-learn's digits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.stack import REPO
from worker.trainer import datasets


@pytest.mark.slow  # a trainer process: TensorFlow loads
def test_a_warm_trainer_has_tensorflow_loaded_and_not_scikit_learn() -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-m", "worker.trainer", "--warm", "0"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert trainer.stdout is not None
        assert '"event": "warm"' in trainer.stdout.readline()  # TensorFlow, Keras and the trainer imported
        libraries = Path(f"/proc/{trainer.pid}/maps").read_text()
    finally:
        trainer.kill()
        trainer.communicate()
    assert "/tensorflow/" in libraries
    assert "/sklearn/" not in libraries


MODEL_AFTER_LOAD = """
from worker.trainer import frameworks
frameworks.load()
import keras
assert keras.layers.Dense(2)(keras.ops.ones((1, 3))).shape == (1, 2)
import sklearn.linear_model  # a member's model may
print("ok", round(sklearn.linear_model.LinearRegression().fit([[0.0], [1.0]], [0.0, 2.0]).coef_[0], 6))
"""


@pytest.mark.slow  # a trainer process: TensorFlow loads
def test_a_model_imports_scikit_learn_after_the_trainer_loaded_keras_without_it() -> None:
    run = subprocess.run(
        [sys.executable, "-c", MODEL_AFTER_LOAD], cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0 and run.stdout.split() == ["ok", "2.0"], run.stdout + run.stderr[-3000:]


def test_the_digits_read_without_scikit_learn_are_its_own() -> None:
    from sklearn.datasets import load_digits

    assert datasets.digits_file() is not None  # read from the file, not through scikit-learn
    images, target = datasets.digits_arrays()
    bunch = load_digits()
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)
