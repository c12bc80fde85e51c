"""The loop's schedule: learning-rate decay as reported, and where the loop pauses."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from tests.worker.trainer.conftest import DEVICES
from towerq.contract.training import Hyperparameters
from worker.trainer.loop import MAX_STEPS_PER_CALL, make_optimizer, next_pause
from worker.trainer.models import mlp
from worker.trainer.towers import Objective, TowerStep


@pytest.mark.parametrize(("staircase", "expected"), [(True, 0.1 * 0.5**2), (False, 0.1 * 0.5**2.5)])
def test_exponential_decay_is_what_the_trainer_reports(staircase: bool, expected: float) -> None:
    hp = Hyperparameters(optimizer="sgd", learning_rate=0.1, lr_decay_rate=0.5, lr_decay_steps=10, staircase=staircase)
    with tf.device(DEVICES[0]):
        model = mlp((4,), 3, {})
        optimizer = make_optimizer(hp)
    step = TowerStep(model, optimizer, DEVICES[:1], DEVICES[0], Objective(False), 4)
    optimizer.iterations.assign(25)
    assert step.learning_rate() == pytest.approx(expected, rel=1e-6)


def test_momentum_and_adam_are_what_they_say() -> None:
    momentum = make_optimizer(Hyperparameters(optimizer="momentum", momentum=0.8))
    assert isinstance(momentum, keras.optimizers.SGD) and momentum.momentum == 0.8
    assert isinstance(make_optimizer(Hyperparameters(optimizer="adam")), keras.optimizers.Adam)


def test_the_loop_pauses_at_every_step_that_reports_and_at_most_every_50() -> None:
    hp = Hyperparameters(steps=1000, log_every=10, eval_every=25, checkpoint_every=0)
    pauses, done = [], 0
    while done < 120:
        done = next_pause(done, hp)
        pauses.append(done)
    assert pauses == [10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, 100, 110, 120]
    sparse = Hyperparameters(steps=1000, log_every=500, eval_every=0, checkpoint_every=0)
    assert next_pause(0, sparse) == MAX_STEPS_PER_CALL
    assert next_pause(990, sparse) == 1000
