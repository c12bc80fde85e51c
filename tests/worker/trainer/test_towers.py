"""The tower step equals one device on the whole global batch: gradients, updates,
batch-norm statistics; and its ops sit where the design says."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.worker.trainer.conftest import DEVICES
from towerq.contract.training import Hyperparameters
from worker.trainer.lockstep import LockstepRunner, PerTowerRunner, batch_norm_report
from worker.trainer.loop import make_optimizer
from worker.trainer.models import ensure_built, lenet5, mlp, resnet20
from worker.trainer.towers import Objective, TowerStep, split_sizes

pytestmark = pytest.mark.slow
BATCH = 64


def build(builder: Callable[..., keras.Model], shape: tuple[int, ...], optimizer: str) -> tuple[keras.Model, Any]:
    keras.utils.set_random_seed(1)
    with tf.device(DEVICES[0]):
        model = builder(shape, 10, {})
        opt = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam(0.01)
    return model, opt


def reference(model: keras.Model, opt: Any) -> Callable[[tf.Tensor, tf.Tensor], list[tf.Tensor]]:
    """One plain Keras step on one device with the whole batch."""

    @tf.function
    def step(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        with tf.device(DEVICES[0]):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
            return grads

    return step


def batch(shape: tuple[int, ...], dtype: str = "float32") -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, *shape)).astype(dtype)
    y = rng.integers(0, 10, BATCH).astype("int32")
    return tf.constant(x), tf.constant(y)


def max_diff(a: list[Any], b: list[Any]) -> float:
    return max(
        float(tf.reduce_max(tf.abs(tf.convert_to_tensor(u) - tf.convert_to_tensor(v))))
        for u, v in zip(a, b, strict=True)
    )


def values(variables: list[Any]) -> list[np.ndarray]:
    """Copies of the variables' current values."""
    return [np.array(v.numpy()) for v in variables]


def pair(
    builder: Callable[..., keras.Model], shape: tuple[int, ...], optimizer: str, k: int, weights: list[float] | None
):
    towers_model, towers_opt = build(builder, shape, optimizer)
    ref_model, ref_opt = build(builder, shape, optimizer)
    step = TowerStep(towers_model, towers_opt, DEVICES[:k], DEVICES[0], Objective(False), BATCH, weights)
    return step, ref_model, reference(ref_model, ref_opt)


CASES = [(2, None), (4, None), (2, [3.0, 1.0])]


@pytest.mark.parametrize(("k", "weights"), CASES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_step_equals_one_device_on_the_global_batch(k: int, weights: list[float] | None, optimizer: str) -> None:
    step, ref_model, ref_step = pair(lenet5, (28, 28, 3), optimizer, k, weights)
    x, y = batch((28, 28, 3))
    assert max_diff(step.averaged_gradients(x, y), ref_step(x, y)) <= 1e-6  # the reference also applied it
    step.train(x, y)
    assert max_diff(values(step.model.trainable_variables), values(ref_model.trainable_variables)) <= 1e-5


@pytest.mark.parametrize(("k", "weights"), CASES)
def test_ten_sgd_steps_equal_one_device(k: int, weights: list[float] | None) -> None:
    step, ref_model, ref_step = pair(mlp, (8, 8, 1), "sgd", k, weights)
    x, y = batch((8, 8, 1))
    for _ in range(10):
        step.train(x, y)
        ref_step(x, y)
    assert max_diff(values(step.model.trainable_variables), values(ref_model.trainable_variables)) <= 1e-5


def test_ten_adam_steps_on_four_towers_stay_close() -> None:
    # Adam divides by sqrt(v): rounding differences grow, so this bound is loose on purpose.
    step, ref_model, ref_step = pair(lenet5, (28, 28, 3), "adam", 4, None)
    x, y = batch((28, 28, 3))
    for _ in range(10):
        step.train(x, y)
        ref_step(x, y)
    assert max_diff(values(step.model.trainable_variables), values(ref_model.trainable_variables)) <= 5e-3


def test_summed_instead_of_averaged_gradients_would_be_caught() -> None:
    """The bound above is meaningful: k times the gradient differs far beyond it."""
    step, _, ref_step = pair(lenet5, (28, 28, 3), "sgd", 4, None)
    x, y = batch((28, 28, 3))
    grads, ref = step.averaged_gradients(x, y), ref_step(x, y)
    assert max_diff([4 * g for g in grads], ref) > 1e-3


def one_step_moves_the_statistics_like_one_device(step: TowerStep, ref_model: keras.Model, ref_step: Any) -> None:
    x, y = batch((8, 8, 3))
    before = values(step.model.non_trainable_variables)
    step.train(x, y)
    ref_step(x, y)
    after = values(step.model.non_trainable_variables)
    assert max_diff(after, before) > 1e-3, "moving statistics must be updated"
    assert max_diff(after, values(ref_model.non_trainable_variables)) <= 1e-5


@pytest.mark.parametrize(("k", "weights"), CASES)
def test_batch_norm_moving_statistics_agree_after_a_step(k: int, weights: list[float] | None) -> None:
    step, ref_model, ref_step = pair(resnet20, (8, 8, 3), "sgd", k, weights)
    assert isinstance(step.runner, LockstepRunner)
    one_step_moves_the_statistics_like_one_device(step, ref_model, ref_step)


def test_towers_with_batch_norm_train_exactly_like_one_device_in_float64() -> None:
    """In float64 every difference left is rounding: synchronised batch norm makes the
    4-tower resnet20 the same function as the one-device one, step after step."""
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        step, ref_model, ref_step = pair(resnet20, (8, 8, 3), "sgd", 4, [3.0, 1.0, 1.0, 1.0])
        x, y = batch((8, 8, 3), "float64")
        assert max_diff(step.averaged_gradients(x, y), ref_step(x, y)) <= 1e-10  # the reference applied it
        step.train(x, y)
        for _ in range(9):
            step.train(x, y)
            ref_step(x, y)
        assert max_diff(values(step.model.trainable_variables), values(ref_model.trainable_variables)) <= 1e-10
        assert max_diff(values(step.model.non_trainable_variables), values(ref_model.non_trainable_variables)) <= 1e-10
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")


def test_subclassed_models_fall_back_to_per_tower_runs() -> None:
    class Tiny(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(10)

        def call(self, x: tf.Tensor) -> tf.Tensor:
            return self.dense(keras.ops.reshape(x, (-1, 64)))

    with tf.device(DEVICES[0]):
        model = ensure_built(Tiny(), (8, 8, 1))
    step = TowerStep(model, keras.optimizers.SGD(0.1), DEVICES[:2], DEVICES[0], Objective(False), BATCH)
    assert isinstance(step.runner, PerTowerRunner)
    x, y = batch((8, 8, 1))
    assert np.isfinite(float(step.train(x, y)["loss"]))


def test_each_tower_runs_on_its_device_and_the_update_on_the_variable_device() -> None:
    step, _, _ = pair(lenet5, (28, 28, 3), "sgd", 4, None)
    graph = step.train.get_concrete_function(*batch((28, 28, 3))).graph
    placed: dict[str, set[str]] = {}
    for op in graph.get_operations():
        scope = op.name.split("/")[0]
        if op.device:
            placed.setdefault(scope, set()).add(op.device.split("device:")[-1])
    for i in range(4):
        assert placed[f"tower_{i}"] == {f"CPU:{i}"}
    gradient_ops = [op for op in graph.get_operations() if op.name.startswith("gradients/tower_")]
    assert gradient_ops, "the backward pass has per-tower ops"
    for op in gradient_ops:
        tower = op.name.split("/")[1]
        assert op.device.endswith(f"CPU:{tower.split('_')[1]}"), f"{op.name} is on {op.device}"
    assert placed["average"] == {"CPU:0"}


def test_weight_decay_adds_l2_to_kernels_only() -> None:
    model, opt = build(mlp, (8, 8, 1), "sgd")
    plain = TowerStep(model, opt, DEVICES[:2], DEVICES[0], Objective(False), BATCH)
    decayed = TowerStep(model, opt, DEVICES[:2], DEVICES[0], Objective(False), BATCH, weight_decay=0.1)
    x, y = batch((8, 8, 1))
    extra = [d - p for d, p in zip(decayed.averaged_gradients(x, y), plain.averaged_gradients(x, y), strict=True)]
    for variable, difference in zip(model.trainable_variables, extra, strict=True):
        expected = 0.1 * variable.value if variable.path.endswith("kernel") else tf.zeros_like(variable.value)
        assert float(tf.reduce_max(tf.abs(difference - expected))) <= 1e-6, variable.path


def test_evaluation_uses_the_moving_average_of_the_weights() -> None:
    model, opt = build(mlp, (8, 8, 1), "sgd")
    step = TowerStep(model, opt, DEVICES[:2], DEVICES[0], Objective(False), BATCH, ema_decay=0.9)
    x, y = batch((8, 8, 1))
    for _ in range(5):
        step.train(x, y)
    data = tf.data.Dataset.from_tensors((x, y))
    with_ema = step.evaluate(data)
    out, _ = model.stateless_call([v.read_value() for v in step.ema], [], x, training=False)
    expected = float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out)))
    assert with_ema["loss"] == pytest.approx(expected, rel=1e-5)
    live, _ = model.stateless_call([v.value for v in model.trainable_variables], [], x, training=False)
    live_loss = float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=live)))
    assert abs(live_loss - expected) > 1e-4, "the EMA weights must differ from the live ones"


def test_evaluation_splits_odd_batches_over_towers() -> None:
    model, opt = build(mlp, (8, 8, 1), "sgd")
    four = TowerStep(model, opt, DEVICES, DEVICES[0], Objective(False), BATCH, [3, 1, 1, 1])
    one = TowerStep(model, opt, DEVICES[:1], DEVICES[0], Objective(False), BATCH)
    x, y = batch((8, 8, 1))
    data = tf.data.Dataset.from_tensor_slices((x[:37], y[:37])).batch(13)
    a, b = four.evaluate(data), one.evaluate(data)
    assert a["examples"] == b["examples"] == 37
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert a["accuracy"] == b["accuracy"]


@pytest.mark.parametrize(
    ("total", "weights", "sizes"),
    [(64, [1, 1], [32, 32]), (64, [3, 1], [48, 16]), (10, [1, 1, 1], [4, 3, 3]), (4, [100, 1, 1, 1], [1, 1, 1, 1])],
)
def test_split_sizes_follow_the_weights(total: int, weights: list[float], sizes: list[int]) -> None:
    assert split_sizes(total, weights) == sizes


def test_a_batch_smaller_than_the_towers_is_refused() -> None:
    with pytest.raises(ValueError, match="a global batch of 2 cannot feed 4 towers"):
        split_sizes(2, [1, 1, 1, 1])


def nested_block_model(shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
    """As a user's bundle might write it: a Sequential block with batch norm, inside a
    functional model."""
    L = keras.layers
    block = keras.Sequential([L.Conv2D(8, 3, padding="same"), L.BatchNormalization(), L.ReLU()], name="block")
    inputs = keras.Input(shape)
    x = L.GlobalAveragePooling2D()(block(inputs))
    return keras.Model(inputs, L.Dense(classes)(x), name="nested")


class ConvBn(keras.layers.Layer):
    """A custom layer holding its own batch norm: out of the lockstep walk's reach."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, padding="same")
        self.norm = keras.layers.BatchNormalization(name="inner_bn")

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        return self.norm(self.conv(x), training=training)


@pytest.mark.parametrize(("k", "weights"), [(2, None), (4, [3.0, 1.0, 1.0, 1.0])])
def test_batch_norm_inside_a_nested_model_is_synchronised(k: int, weights: list[float] | None) -> None:
    step, ref_model, ref_step = pair(nested_block_model, (8, 8, 3), "sgd", k, weights)
    one_step_moves_the_statistics_like_one_device(step, ref_model, ref_step)
    assert max_diff(values(step.model.trainable_variables), values(ref_model.trainable_variables)) <= 1e-5
    report = batch_norm_report(step.model, step.runner)
    assert report["synchronized"] == ["nested/block/" + step.model.get_layer("block").layers[1].name]
    assert report["per_tower"] == []


def test_batch_norm_the_walk_cannot_reach_is_reported_per_tower() -> None:
    def builder(shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
        inputs = keras.Input(shape)
        x = keras.layers.BatchNormalization(name="top_bn")(ConvBn(name="convbn")(inputs))
        return keras.Model(inputs, keras.layers.Dense(classes)(keras.layers.Flatten()(x)), name="custom")

    step, _, _ = pair(builder, (8, 8, 3), "sgd", 2, None)
    assert batch_norm_report(step.model, step.runner) == {
        "synchronized": ["custom/top_bn"],
        "per_tower": ["custom/convbn/inner_bn"],
    }


# -- mixed precision and XLA ---------------------------------------------------------------


@pytest.fixture
def precision_reset() -> Iterator[None]:
    """The dtype policy is global: every test here leaves it at float32."""
    yield
    keras.config.set_dtype_policy("float32")


def one_step(
    precision: str, k: int, jit: bool = False, scale: float | None = None
) -> tuple[list[np.ndarray], TowerStep]:
    """lenet5 after one SGD step (L2 on) on `k` towers in `precision`."""
    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(1)
    with tf.device(DEVICES[0]):
        model = lenet5((28, 28, 3), 10, {})
        opt = make_optimizer(Hyperparameters(optimizer="sgd", learning_rate=0.1), precision)
        if scale is not None:
            opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=scale)
    step = TowerStep(model, opt, DEVICES[:k], DEVICES[0], Objective(False), BATCH, weight_decay=0.01, jit_compile=jit)
    step.train(*batch((28, 28, 3)))
    return values(model.trainable_variables), step


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("k", [2, 4])
def test_mixed_precision_towers_match_one_device_within_the_precision(
    precision: str, k: int, precision_reset: None
) -> None:
    exact, _ = one_step("float32", 1)
    one, single = one_step(precision, 1)
    towers, step = one_step(precision, k)
    assert step.model.dtype_policy.name == precision and step.model.layers[-1].compute_dtype != "float32"
    rounding = max_diff(one, exact)  # what the precision itself costs one device
    assert 0 < rounding <= 0.02  # in effect, and the loss scale (float16) taken back out of the update
    assert max_diff(towers, one) <= 2 * rounding  # the split over towers adds no more than that
    assert int(step.steps_done.numpy()) == 1 == int(step.optimizer.iterations.numpy())
    if precision == "mixed_float16":
        assert isinstance(single.optimizer, keras.optimizers.LossScaleOptimizer)


def test_a_float16_step_whose_scaled_gradients_overflow_is_skipped_and_the_scale_halved(
    precision_reset: None,
) -> None:
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(1)
    with tf.device(DEVICES[0]):
        before = values(lenet5((28, 28, 3), 10, {}).trainable_variables)
    after, step = one_step("mixed_float16", 2, scale=2.0**60)  # float16 overflows far below 2**60
    assert max_diff(after, before) == 0.0  # nothing applied, weight decay included
    assert float(step.optimizer.dynamic_scale.numpy()) == 2.0**59
    assert int(step.steps_done.numpy()) == 1 and int(step.optimizer.iterations.numpy()) == 0


def test_xla_towers_train_like_the_plain_step_and_keep_their_devices(precision_reset: None) -> None:
    plain, _ = one_step("float32", 2)
    compiled, step = one_step("float32", 2, jit=True)
    assert max_diff(compiled, plain) <= 1e-5
    graph = step.train.get_concrete_function(*batch((28, 28, 3))).graph
    marked = [op for op in graph.get_operations() if "_XlaCompile" in op.node_def.attr and op.get_attr("_XlaCompile")]
    towers = {op.device for op in marked if "tower_" in op.name and op.device}
    assert {tf.DeviceSpec.from_string(d).device_index for d in towers} == {0, 1}, towers
