"""The synchronous tower-parallel step: one replica (tower) per device, one update.

Each step takes a global batch and splits it among the k towers (`tower_weights` gives
unequal slices to unequal GPUs). Tower i runs the model on its slice on its own device,
and computes its loss and gradients there (`tf.gradients` colocates each gradient op with
its forward op). The gradients are averaged on the variable device, weighted by slice
size, so the update equals the update of one device on the whole global batch; an L2
term and the optimizer step follow, once. Loss and accuracy are the same weighted
averages over towers.

Variables live once, on the variable device, and every tower reads them. The model runs
through Keras' `stateless_call`, so no tower assigns to a variable: batch normalisation's
moving statistics come back from every tower and are combined once, exactly as one
device would have updated them from the whole batch (means weighted by slice size; the
variance gets the between-tower term back). Evaluation uses those moving statistics, and
the moving averages of the weights when `ema_decay` is set.

The step is one compiled graph (`tf.function`); see `bench/trainer_throughput.py`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypedDict

import keras
import tensorflow as tf

from worker.trainer.lockstep import make_runner
from worker.trainer.ranks import Ranks

TOWER_SCOPE = "tower_{}"


class EvalResult(TypedDict):
    loss: float
    accuracy: float | None
    examples: int
    metrics: dict[str, float]
    """The user module's own metrics (`metrics(labels, logits)`), averaged over the examples."""


MetricsFn = Callable[[tf.Tensor, tf.Tensor], dict[str, tf.Tensor]]
MAX_USER_METRICS = 16
METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")


class UserMetricsError(ValueError):
    """A user's `metrics(labels, logits)` that does not return per-example values."""


def probe_metrics(fn: MetricsFn, model: keras.Model, input_shape: tuple[int, ...], regression: bool) -> list[str]:
    """The names `fn` returns, checked once on a batch of 2 zeros: a dict of at most 16
    names (letters, digits, _), each a number per example (or one number for the batch)."""
    labels = tf.zeros((2, 1) if regression else (2,), tf.float32 if regression else tf.int32)
    try:
        values = fn(labels, model(tf.zeros((2, *input_shape)), training=False))
    except Exception as err:
        raise UserMetricsError(f"metrics(labels, logits) raised {type(err).__name__}: {err}") from err
    if not isinstance(values, dict) or not values:
        raise UserMetricsError("metrics(labels, logits) must return a dict of name -> per-example values")
    if len(values) > MAX_USER_METRICS:
        raise UserMetricsError(f"metrics(labels, logits) returned {len(values)} metrics; at most {MAX_USER_METRICS}")
    for name, value in values.items():
        if not isinstance(name, str) or not METRIC_NAME.match(name) or name in ("loss", "accuracy"):
            raise UserMetricsError(f"metric name {name!r}: letters, digits and _, at most 48, not loss or accuracy")
        shape = tf.convert_to_tensor(value).shape
        if shape.rank not in (0, 1) or (shape.rank == 1 and shape[0] not in (None, 2)):
            raise UserMetricsError(f"metric {name!r} has shape {shape}: one value per example, or one per batch")
    return sorted(values)


def split_sizes(total: int, weights: Sequence[float]) -> list[int]:
    """`total` examples apportioned by `weights` (largest remainder), every share >= 1."""
    if total < len(weights):
        raise ValueError(f"a global batch of {total} cannot feed {len(weights)} towers")
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    sizes = [max(1, int(e)) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(sizes) < total:
        sizes[by_remainder[i % len(sizes)]] += 1
        i += 1
    while sum(sizes) > total:
        j = max((i for i in range(len(sizes)) if sizes[i] > 1), key=lambda i: sizes[i] - exact[i])
        sizes[j] -= 1
    return sizes


def _widened(out: tf.Tensor) -> tf.Tensor:
    """A mixed-precision model's 16-bit outputs as float32: the loss is computed in float32."""
    return tf.cast(out, tf.float32) if out.dtype in (tf.float16, tf.bfloat16) else out


@dataclass(frozen=True)
class Objective:
    """What is minimised and counted: cross-entropy and accuracy, or squared error."""

    regression: bool

    def losses(self, y: tf.Tensor, out: tf.Tensor) -> tf.Tensor:
        out = _widened(out)
        if self.regression:
            return tf.reduce_mean(tf.square(tf.cast(y, out.dtype) - out), axis=-1)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32), logits=out)

    def correct(self, y: tf.Tensor, out: tf.Tensor) -> tf.Tensor:
        out = _widened(out)
        if self.regression:
            return tf.zeros(tf.shape(out)[:1])
        return tf.cast(tf.equal(tf.argmax(out, axis=-1, output_type=tf.int32), tf.cast(y, tf.int32)), tf.float32)


class TowerStep:
    """The compiled training and evaluation steps of one model over k tower devices."""

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        devices: Sequence[str],
        variable_device: str,
        objective: Objective,
        global_batch: int,
        tower_weights: Sequence[float] | None = None,
        weight_decay: float = 0.0,
        ema_decay: float | None = None,
        metrics_fn: MetricsFn | None = None,
        metric_names: Sequence[str] = (),
        jit_compile: bool = False,
        ranks: Ranks | None = None,
    ) -> None:
        self.model = model
        self.ranks = ranks
        """A job over several hosts: this rank's place (its towers take its part of the batch)."""
        self.metrics_fn = metrics_fn
        self.metric_names = list(metric_names) if metrics_fn else []
        self.optimizer = optimizer
        self.devices = list(devices)
        self.variable_device = variable_device
        self.objective = objective
        self.weights = list(tower_weights or [1.0] * len(self.devices))
        if len(self.weights) != len(self.devices):
            raise ValueError(f"{len(self.weights)} tower weights for {len(self.devices)} towers")
        self.sizes = split_sizes(global_batch, self.weights)
        self.global_batch = global_batch
        self.total_batch = global_batch if ranks is None else round(global_batch / ranks.share)
        """Every rank's examples of a step (this host's alone on one host)."""
        self.weight_decay = weight_decay
        self.ema_decay = ema_decay
        self.trainable = list(model.trainable_variables)
        self.state = list(model.non_trainable_variables)
        self.decayed = [i for i, v in enumerate(self.trainable) if _is_kernel(v)]
        self.fractions = [n / global_batch for n in self.sizes]
        self.runner = make_runner(model, self.devices, variable_device, self.fractions)
        with tf.device(variable_device):
            optimizer.build(self.trainable)
            self.ema = [tf.Variable(v.value, trainable=False, name="ema") for v in self.trainable] if ema_decay else []
            self.steps_done = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_done")
            """Steps trained (the optimizer's count leaves out steps that loss scaling skipped)."""
        self.jit_compile = jit_compile
        self.train = tf.function(self._train)
        self.train_steps = tf.function(self._train_steps)
        self.averaged_gradients = tf.function(self._averaged_gradients)
        self.evaluate_batch = tf.function(self._evaluate_batch, reduce_retracing=True)

    # -- training ---------------------------------------------------------------------------

    def _train(self, x: tf.Tensor, y: tf.Tensor) -> dict[str, Any]:
        grads, loss, correct, new_state, sums = self._towers(x, y)
        with tf.device(self.variable_device):
            self.optimizer.apply(grads, self.trainable)
            for variable, value in zip(self.state, new_state, strict=True):
                variable.assign(value)
            if self.ema:
                self._update_ema()
            self.steps_done.assign_add(1)
            result: dict[str, Any] = {"loss": loss, "accuracy": correct / self.total_batch}
            if self.metric_names:
                result["metrics"] = {name: sums[name] / self.total_batch for name in self.metric_names}
            return result

    def _train_steps(self, batches: Any, steps: tf.Tensor) -> dict[str, Any]:
        """`steps` training steps on batches drawn from the `batches` iterator, in one call
        (no Python between steps); returns the last step's loss, accuracy and user metrics."""
        result: dict[str, Any] = {"loss": tf.constant(0.0), "accuracy": tf.constant(0.0)}
        if self.metric_names:
            result["metrics"] = {name: tf.constant(0.0) for name in self.metric_names}
        for _ in tf.range(steps):
            x, y = next(batches)
            result = self._train(x, y)
        return result

    def _averaged_gradients(self, x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        return self._towers(x, y)[0]

    def _metric_sums(self, ys: list[tf.Tensor], outs: list[tf.Tensor]) -> dict[str, tf.Tensor]:
        """The user metrics summed over every tower's examples (a per-batch value counts once
        per example), on the variable device: divided by the batch, an average like accuracy."""
        if not self.metric_names or self.metrics_fn is None:
            return {}
        per_tower: dict[str, list[tf.Tensor]] = {name: [] for name in self.metric_names}
        for i, device in enumerate(self.devices):
            with tf.device(device), tf.name_scope(TOWER_SCOPE.format(i)):
                values = self.metrics_fn(ys[i], outs[i])
                n = tf.cast(tf.shape(outs[i])[0], tf.float32)
                for name in self.metric_names:
                    value = tf.cast(tf.convert_to_tensor(values[name]), tf.float32)
                    per_tower[name].append(tf.reduce_sum(value) if value.shape.rank == 1 else value * n)
        with tf.device(self.variable_device):
            return {name: tf.add_n(sums) for name, sums in per_tower.items()}

    def _towers(
        self, x: tf.Tensor, y: tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, list[tf.Tensor], dict[str, tf.Tensor]]:
        """Forward and backward on every tower; returns (averaged gradients, loss, number
        correct, the non-trainable variables' new values, the user metrics' sums).

        With `jit_compile` the towers' ops are marked for XLA (`jit_scope`, their gradients
        too) and compiled in clusters that each stay on one device, so every tower still runs
        on its own GPU. (`tf.function(jit_compile=True)` would compile the whole step for one
        device and silently drop the towers' placement.)"""
        with self._xla():
            return self._tower_ops(x, y)

    def _xla(self) -> AbstractContextManager[object]:
        return tf.xla.experimental.jit_scope() if self.jit_compile else nullcontext()

    def _tower_ops(
        self, x: tf.Tensor, y: tf.Tensor
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, list[tf.Tensor], dict[str, tf.Tensor]]:
        with tf.device(self.variable_device):
            params = [v.value for v in self.trainable]
            state = [v.value for v in self.state]
        xs = tf.split(x, self.sizes)
        ys = tf.split(y, self.sizes)
        outs, new_state = self.runner.forward(params, state, xs, training=True)
        tower_losses, tower_correct = [], []
        for i, device in enumerate(self.devices):
            with tf.device(device), tf.name_scope(TOWER_SCOPE.format(i)):
                tower_losses.append(tf.reduce_mean(self.objective.losses(ys[i], outs[i])))
                tower_correct.append(tf.reduce_sum(self.objective.correct(ys[i], outs[i])))
        with tf.device(self.variable_device), tf.name_scope("average"):
            loss = _weighted_sum(tower_losses, self.fractions)
        # One backward pass through all towers: each gradient op lands on its forward op's
        # device, and the towers' contributions to a variable meet (are summed) where the
        # variable was read, on the variable device.
        #
        # With float16 loss scaling the loss is scaled before the backward pass, so small
        # gradients survive in float16; the sums that meet on the variable device are then
        # unscaled once, by the optimizer (`LossScaleOptimizer.apply`), which skips a step
        # whose gradients overflowed and lowers the scale.
        scale = self.loss_scale()
        grads = tf.gradients(loss * scale if scale is not None else loss, params)
        grads = [tf.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
        correct, sums = tf.add_n(tower_correct), self._metric_sums(ys, outs)
        if self.ranks is not None:  # every host's towers: one all-reduce over the network
            with tf.device(self.variable_device), tf.name_scope("all_reduce"):
                grads, loss, correct, new_state, sums = self.ranks.step_reduce(grads, loss, correct, new_state, sums)
        with tf.device(self.variable_device), tf.name_scope("average"):
            if self.weight_decay:
                decay = self.weight_decay * scale if scale is not None else self.weight_decay
                for j in self.decayed:
                    grads[j] = grads[j] + decay * params[j]
                loss = loss + 0.5 * self.weight_decay * tf.add_n(
                    [tf.reduce_sum(tf.square(params[j])) for j in self.decayed]
                )
            return grads, loss, correct, new_state, sums

    def loss_scale(self) -> tf.Tensor | None:
        """The current float16 loss scale, or None without loss scaling."""
        if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            return tf.cast(self.optimizer.dynamic_scale, tf.float32)
        return None

    def _update_ema(self) -> None:
        count = tf.cast(self.optimizer.iterations, tf.float32)
        decay = tf.minimum(tf.constant(self.ema_decay, tf.float32), (1.0 + count) / (10.0 + count))
        for average, variable in zip(self.ema, self.trainable, strict=True):
            average.assign(decay * average + (1.0 - decay) * variable.value)

    @contextmanager
    def averaged_weights(self) -> Iterator[None]:
        """The moving averages in the model's own variables for a while (to export the model
        that evaluation scores), then the trained values back. Without EMA: nothing to do."""
        if not self.ema:
            yield
            return
        trained = [v.numpy() for v in self.trainable]  # copies: the restore must not see the swap
        for variable, average in zip(self.trainable, self.ema, strict=True):
            variable.assign(average.read_value())
        try:
            yield
        finally:
            for variable, value in zip(self.trainable, trained, strict=True):
                variable.assign(value)

    # -- evaluation -------------------------------------------------------------------------

    def _evaluate_batch(
        self, x: tf.Tensor, y: tf.Tensor, use_ema: bool
    ) -> tuple[tf.Tensor, tf.Tensor, dict[str, tf.Tensor]]:
        """(sum of losses, number correct, the user metrics' sums) over a batch of any size,
        split over the towers."""
        with tf.device(self.variable_device):
            params = [v.read_value() for v in self.ema] if use_ema and self.ema else [v.value for v in self.trainable]
            state = [v.value for v in self.state]
        n = tf.shape(x)[0]
        cumulative = tf.constant(list(itertools.accumulate(self.fractions)), tf.float32)
        bounds = tf.concat([[0], tf.cast(tf.round(tf.cast(n, tf.float32) * cumulative), tf.int32)], 0)
        sizes = bounds[1:] - bounds[:-1]
        k = len(self.devices)
        xs, ys = tf.split(x, sizes, num=k), tf.split(y, sizes, num=k)
        outs, _ = self.runner.forward(params, state, xs, training=False)
        losses, correct = [], []
        for i, device in enumerate(self.devices):
            with tf.device(device):
                losses.append(tf.reduce_sum(self.objective.losses(ys[i], outs[i])))
                correct.append(tf.reduce_sum(self.objective.correct(ys[i], outs[i])))
        sums = self._metric_sums(ys, outs)
        with tf.device(self.variable_device):
            return tf.add_n(losses), tf.add_n(correct), sums

    def evaluate(self, batches: tf.data.Dataset) -> EvalResult:
        """Mean loss, accuracy and user metrics over a finite dataset of (x, y) batches."""
        total_loss = total_correct = 0.0
        totals = dict.fromkeys(self.metric_names, 0.0)
        count = 0
        for x, y in batches:
            loss, correct, sums = self.evaluate_batch(x, y, bool(self.ema))
            total_loss += float(loss)
            total_correct += float(correct)
            for name, value in sums.items():
                totals[name] += float(value)
            count += int(x.shape[0])
        if count == 0:
            return EvalResult(loss=float("nan"), accuracy=None, examples=0, metrics={})
        accuracy = None if self.objective.regression else total_correct / count
        metrics = {name: total / count for name, total in totals.items()}
        return EvalResult(loss=total_loss / count, accuracy=accuracy, examples=count, metrics=metrics)

    def learning_rate(self) -> float:
        lr = self.optimizer.learning_rate
        return float(lr(self.optimizer.iterations) if callable(lr) else lr)


def _weighted_sum(tensors: list[tf.Tensor], fractions: list[float]) -> tf.Tensor:
    if len(tensors) == 1:
        return tensors[0] * fractions[0] if fractions[0] != 1.0 else tensors[0]
    return tf.add_n([t * f for t, f in zip(tensors, fractions, strict=True)])


def _is_kernel(variable: Any) -> bool:
    name = getattr(variable, "path", None) or getattr(variable, "name", "")
    return str(name).split("/")[-1].startswith("kernel")
