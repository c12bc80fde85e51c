"""Models: the built-in ones, and user models given as `module:function`.

A user model is a function in a `.py` file under `TOWERQ_MODELS_PATH`, called with a dict
of the job's hyperparameters plus `input_shape`, `num_classes` and `model_options`, and
returning a Keras model that maps a batch of inputs to logits (or to predictions for a
regression). Its file must stay inside the models folder (no `..`, no symlink out).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from towerq.contract.catalog import MODELS
from towerq.contract.paths import PathEscapeError, resolve_inside
from worker.trainer.errors import ModelError

Builder = Callable[[tuple[int, ...], int, dict[str, Any]], keras.Model]


def mlp(input_shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
    hidden = options.get("hidden", [128, 64])
    layers: list[keras.layers.Layer] = [keras.Input(input_shape), keras.layers.Flatten()]
    layers += [keras.layers.Dense(int(units), activation="relu") for units in hidden]
    layers.append(keras.layers.Dense(classes))
    return keras.Sequential(layers, name="mlp")


def lenet5(input_shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
    """LeNet-5 with ReLU and 'same' padding, so that it also fits 8×8 digits."""
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input(input_shape),
            L.Conv2D(6, 5, padding="same", activation="relu"),
            L.MaxPooling2D(2),
            L.Conv2D(16, 5, padding="same", activation="relu"),
            L.MaxPooling2D(2),
            L.Flatten(),
            L.Dense(120, activation="relu"),
            L.Dense(84, activation="relu"),
            L.Dense(classes),
        ],
        name="lenet5",
    )


@keras.saving.register_keras_serializable(package="towerq")
class LocalResponseNorm(keras.layers.Layer):
    """The `norm1`/`norm2` layers of the classic CIFAR-10 tutorial (tf.nn.lrn)."""

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return tf.nn.local_response_normalization(inputs, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)


def cifar_cnn(input_shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
    """The classic CIFAR-10 tutorial net: conv-pool-norm, conv-norm-pool, dense 384, 192."""
    L = keras.layers
    return keras.Sequential(
        [
            keras.Input(input_shape),
            L.Conv2D(64, 5, padding="same", activation="relu"),
            L.MaxPooling2D(3, strides=2, padding="same"),
            LocalResponseNorm(),
            L.Conv2D(64, 5, padding="same", activation="relu"),
            LocalResponseNorm(),
            L.MaxPooling2D(3, strides=2, padding="same"),
            L.Flatten(),
            L.Dense(384, activation="relu"),
            L.Dense(192, activation="relu"),
            L.Dense(classes),
        ],
        name="cifar_cnn",
    )


def resnet20(input_shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
    """ResNet-20 for CIFAR-sized images: 3 stages of 3 basic blocks (16, 32, 64 filters)."""
    L = keras.layers
    momentum = float(options.get("bn_momentum", 0.9))

    def conv_bn(x: Any, filters: int, strides: int = 1, relu: bool = True, kernel: int = 3) -> Any:
        x = L.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False)(x)
        x = L.BatchNormalization(momentum=momentum)(x)
        return L.ReLU()(x) if relu else x

    inputs = keras.Input(input_shape)
    x = conv_bn(inputs, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = conv_bn(x, filters, strides)
            y = conv_bn(y, filters, relu=False)
            if strides != 1 or shortcut.shape[-1] != filters:
                shortcut = conv_bn(shortcut, filters, strides, relu=False, kernel=1)
            x = L.ReLU()(L.Add()([y, shortcut]))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(classes)(x), name="resnet20")


@keras.saving.register_keras_serializable(package="towerq")
class Quadratic(keras.layers.Layer):
    """y = a·x² + b·x + c with trainable a, b, c."""

    def build(self, input_shape: Any) -> None:
        self.coefficients = self.add_weight(shape=(3,), initializer="zeros", name="kernel")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        a, b, c = self.coefficients[0], self.coefficients[1], self.coefficients[2]
        return a * tf.square(x) + b * x + c


def poly2(input_shape: tuple[int, ...], classes: int, options: dict[str, Any]) -> keras.Model:
    return keras.Sequential([keras.Input(input_shape), Quadratic()], name="poly2")


def _builtin_builders() -> dict[str, Builder]:
    """The builder of each catalog model: the function of the same name in this module."""
    here = globals()
    missing = [name for name in MODELS if not callable(here.get(name))]
    if missing:
        raise ImportError(f"the catalog lists models without a builder here: {', '.join(missing)}")
    return {name: here[name] for name in MODELS}


BUILTIN: dict[str, Builder] = _builtin_builders()


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    classes: int,
    hyperparameters: dict[str, Any],
    models_path: Path,
    code_path: Path | None = None,
    inputs: dict[str, str] | None = None,
) -> keras.Model:
    """The model called `name`, built for `input_shape` and `classes`: a built-in one, or
    `module:function` from the job's code bundle (`code_path`) or `TOWERQ_MODELS_PATH`. A
    user's function gets `params["inputs"]`: the folders of the jobs this one waited for,
    by job id (a model to fine-tune from: `inputs["12"] + "/model.keras"`)."""
    options = dict(hyperparameters.get("model_options") or {})
    if name in BUILTIN:
        try:
            return ensure_built(BUILTIN[name](input_shape, classes, options), input_shape, name)
        except (TypeError, ValueError) as err:
            raise ModelError(f"cannot build {name} for inputs {input_shape}: {err}") from err
    builder = load_bundle_builder(name, code_path) if code_path else load_user_builder(name, models_path)
    _loaded_builders[name] = builder
    params = {
        **hyperparameters,
        "input_shape": input_shape,
        "num_classes": classes,
        "model_options": options,
        "inputs": dict(inputs or {}),
    }
    try:
        model = builder(params)
    except Exception as err:
        raise ModelError(f"{name} raised {type(err).__name__}: {err}") from err
    if not isinstance(model, keras.Model):
        raise ModelError(f"{name} returned {type(model).__name__}, not a keras.Model")
    return ensure_built(model, input_shape, name)


def user_metrics(name: str) -> Callable[..., Any] | None:
    """The `metrics(labels, logits)` function of the user module `name` (`module:function`)
    comes from, once `build_model` has loaded it; None for built-in models and modules
    without one."""
    if name in BUILTIN:
        return None
    builder = _loaded_builders.get(name)
    module = sys.modules.get(getattr(builder, "__module__", "") or "")
    found = getattr(module, "metrics", None)
    return found if callable(found) else None


_loaded_builders: dict[str, Any] = {}


def ensure_built(model: keras.Model, input_shape: tuple[int, ...], name: str = "model") -> keras.Model:
    """Create the model's variables now (a subclassed model makes them on its first call),
    so the tower step sees all of them; checks that the model takes the dataset's inputs."""
    try:
        model(tf.zeros((1, *input_shape)), training=False)
    except TypeError:
        model(tf.zeros((1, *input_shape)))
    except (ValueError, tf.errors.InvalidArgumentError) as err:
        raise ModelError(f"{name} does not accept inputs of shape {input_shape}: {err}") from err
    if not model.trainable_variables:
        raise ModelError(f"{name} has no trainable variables")
    return model


def load_bundle_builder(reference: str, code_path: Path) -> Callable[[dict[str, Any]], Any]:
    """The function named by `module:function` in the job's code bundle, imported as a normal
    module with the bundle first on the import path (so the bundle's own imports work). The
    bundle is read-only: no bytecode is written into it."""
    module_name, _, function = reference.partition(":")
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(code_path))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        where = _user_frame(err, code_path)
        raise ModelError(
            f"model {reference}: importing {module_name} raised {type(err).__name__}: {err}{where}"
        ) from err
    builder = getattr(module, function, None)
    if not callable(builder):
        raise ModelError(f"model {reference}: module {module_name} has no function {function!r}")
    return builder


def _user_frame(err: BaseException, root: Path) -> str:
    """` (at file.py:12)`: the deepest line of the traceback inside the bundle, if any."""
    import traceback

    inside = [f for f in traceback.extract_tb(err.__traceback__) if f.filename.startswith(str(root))]
    if not inside:
        return ""
    frame = inside[-1]
    return f" (at {Path(frame.filename).relative_to(root)}:{frame.lineno})"


def load_user_builder(reference: str, models_path: Path) -> Callable[[dict[str, Any]], Any]:
    """The function named by `module:function`, from a file under `models_path`."""
    module_name, _, function = reference.partition(":")
    relative = module_name.replace(".", "/") + ".py"
    try:
        path = resolve_inside(models_path, relative)
    except PathEscapeError as err:
        raise ModelError(f"model {reference}: {err}") from err
    if not path.is_file():
        raise ModelError(f"model {reference}: no file {relative} under TOWERQ_MODELS_PATH ({models_path})")
    spec = importlib.util.spec_from_file_location(f"towerq_user_models.{module_name}", path)
    if spec is None or spec.loader is None:
        raise ModelError(f"model {reference}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise ModelError(f"model {reference}: importing {relative} raised {type(err).__name__}: {err}") from err
    builder = getattr(module, function, None)
    if not callable(builder):
        raise ModelError(f"model {reference}: {relative} has no function {function!r}")
    return builder
