"""`towerq.report_logs`: a framework's dict of numbers as towerq's points (Keras' `logs`,
Hugging Face's `on_log` dict, Lightning's `callback_metrics`), held-out numbers (`val_`,
`eval_`) as an evaluation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import towerq
from towerq.contract import events


def points(capsys: pytest.CaptureFixture[str]) -> list[Any]:
    return [events.decode(line) for line in capsys.readouterr().out.splitlines() if line]


def test_keras_logs_make_a_training_point_and_an_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    logs = {"loss": np.float32(0.5), "accuracy": 0.8, "val_loss": 0.6, "val_accuracy": 0.75, "learning_rate": 0.01}
    towerq.report_logs(3, logs, total_steps=100)
    train, held_out = points(capsys)
    assert isinstance(train, events.Metric) and isinstance(held_out, events.Eval)
    assert (train.step, train.loss, train.accuracy, train.learning_rate, train.total_steps) == (3, 0.5, 0.8, 0.01, 100)
    assert (held_out.step, held_out.loss, held_out.accuracy) == (3, 0.6, 0.75)


def test_hugging_face_and_lightning_names_are_kept_as_towerq_can(capsys: pytest.CaptureFixture[str]) -> None:
    towerq.report_logs(
        40,
        {
            "eval_loss": 0.4, "eval_f1": 0.9, "eval_runtime": 1.5, "epoch": 2.0,  # Hugging Face's on_evaluate
            "train/loss": 0.3, "lr-Adam": 1e-3, "3rd": 1,  # Lightning's names
            "step": 40, "split": 1, "model": "bert", "sizes": [1, 2], "done": True, "none": None,  # not metrics
        },
    )  # fmt: skip
    train, held_out = points(capsys)
    assert train.metrics == {"epoch": 2.0, "train.loss": 0.3, "lr-Adam": 0.001, "_3rd": 1.0}
    assert held_out.loss == 0.4 and held_out.metrics == {"f1": 0.9, "runtime": 1.5}


def test_only_what_a_split_has_is_reported_and_past_16_names_the_first_are_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    towerq.report_logs(1, {"val_loss": 0.2})
    (only,) = points(capsys)
    assert isinstance(only, events.Eval) and only.loss == 0.2, "no empty training point"
    towerq.report_logs(2, {"loss": 0.1, **{f"m{i:02}": float(i) for i in range(20)}})
    (train,) = points(capsys)
    assert train.loss == 0.1 and list(train.metrics) == [f"m{i:02}" for i in range(16)]
    towerq.report_logs(3, {"note": "nothing to chart"})
    assert points(capsys) == []


@pytest.mark.slow
def test_the_keras_callback_of_the_docs_reports_each_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/command-jobs.md's callback, in a real `fit` with validation data."""
    import keras

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            towerq.report_logs(epoch + 1, logs or {})

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = np.random.default_rng(0).normal(size=(32, 4)), np.arange(32) % 2
    model.fit(x, y, validation_split=0.25, epochs=2, verbose=0, callbacks=[Report()])
    reported = points(capsys)
    assert [(type(p).__name__, p.step) for p in reported] == [("Metric", 1), ("Eval", 1), ("Metric", 2), ("Eval", 2)]
    assert all(p.loss is not None and p.accuracy is not None for p in reported), reported
