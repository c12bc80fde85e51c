"""Running a Keras model on k towers in lockstep, with batch normalisation synchronised.

Each layer of the model's graph runs on every tower (each on its own device) before the
next layer runs anywhere. A batch-norm layer therefore sees all towers' inputs: every
tower computes the moments of its slice, the variable device combines them into the
moments of the whole global batch (Chan's parallel formula, no E[x²] - E[x]² cancellation),
and every tower normalises with those. The k-tower forward pass is then the one-device
forward pass over the global batch, cut into slices, and the moving statistics are
updated once from the global moments. This is what makes a k-tower job train exactly
like a one-device job with the same global batch.

Works for models built with the functional API or `Sequential` (it walks their graph, and
the graphs of functional or `Sequential` models nested in them); for subclassed models,
`PerTowerRunner` runs each tower on its own, with per-tower batch statistics whose moving
averages are still combined into one update. A batch-norm layer inside a custom layer is
out of the walk's reach and runs per tower; `batch_norm_report` names every one, and the
job shows it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf
from keras import tree

KERAS_TESTED = "3.15"
"""The Keras minor version whose private pieces this module uses (pinned in pyproject.toml)."""


def keras_internals_missing() -> list[str]:
    """The private Keras pieces the lockstep runner relies on that this Keras lacks: a
    functional model's `_run_through_graph(inputs, call_fn=...)` and `_nodes_by_depth`,
    a Sequential's `_functional`, a layer's `_call_context_args` and `_flatten_layers`.
    Without them `make_runner` would quietly fall back to per-tower batch norm."""
    inputs = keras.Input((2,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    sequential = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    layer = keras.layers.BatchNormalization()
    needs = {
        "Functional._run_through_graph(inputs, operation_fn, call_fn)": "call_fn"
        in inspect.signature(getattr(functional, "_run_through_graph", lambda: None)).parameters,
        "Functional._nodes_by_depth": hasattr(functional, "_nodes_by_depth"),
        "Sequential._functional": getattr(sequential, "_functional", None) is not None,
        "Layer._call_context_args": hasattr(layer, "_call_context_args"),
        "Layer._flatten_layers(include_self, recursive)": hasattr(layer, "_flatten_layers"),
    }
    return [name for name, present in needs.items() if not present]


class PerTower:
    """One value per tower; a leaf for Keras' tree utilities."""

    __slots__ = ("values",)

    def __init__(self, values: list[Any]) -> None:
        self.values = values


def functional_graph(model: keras.Model) -> Any | None:
    """The functional graph behind `model`, or None for a subclassed model."""
    graph = getattr(model, "_functional", None) if isinstance(model, keras.Sequential) else model
    if graph is None or not hasattr(graph, "_run_through_graph") or not hasattr(graph, "_nodes_by_depth"):
        return None
    return graph


class TowerRunner:
    """Runs a model's forward pass on all towers; returns per-tower outputs and the new
    value of every non-trainable variable (one update, from all towers)."""

    def __init__(self, model: keras.Model, devices: Sequence[str], variable_device: str) -> None:
        self.model = model
        self.devices = list(devices)
        self.variable_device = variable_device
        self.trainable = list(model.trainable_variables)
        self.state = list(model.non_trainable_variables)

    def forward(
        self, params: list[tf.Tensor], state: list[tf.Tensor], xs: list[tf.Tensor], training: bool
    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        raise NotImplementedError


class LockstepRunner(TowerRunner):
    """Lockstep execution over the functional graph, with synchronised batch norm."""

    def __init__(self, model: keras.Model, devices: Sequence[str], variable_device: str) -> None:
        super().__init__(model, devices, variable_device)
        graph = functional_graph(model)
        if graph is None:
            raise ValueError(f"{model.name} is not a functional or Sequential model")
        self.graph = graph
        self.position = {id(v): j for j, v in enumerate(self.state)}

    def forward(
        self, params: list[tf.Tensor], state: list[tf.Tensor], xs: list[tf.Tensor], training: bool
    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        mapping = list(zip(self.trainable + self.state, params + state, strict=True))
        self.updates: dict[int, tf.Tensor] = {}
        self.training = training
        with keras.StatelessScope(state_mapping=mapping) as scope:
            outputs = self.graph._run_through_graph(PerTower(list(xs)), call_fn=self._call)
            new_state = [self.updates.get(j, scope.get_current_value(v)) for j, v in enumerate(self.state)]
        result = tree.flatten(outputs)[0]
        return list(result.values), [s if s is not None else old for s, old in zip(new_state, state, strict=True)]

    def _call(self, operation: Any, *args: Any, **kwargs: Any) -> Any:
        nested = functional_graph(operation) if isinstance(operation, keras.Model) else None
        if nested is not None:  # a model inside the model: walk its graph too, so its BN syncs
            return nested._run_through_graph(args[0] if len(args) == 1 else list(args), call_fn=self._call)
        if self.training and _is_batch_norm(operation):
            return self._synchronised_batch_norm(operation, args[0])
        if self.training and "training" in _context_args(operation):
            kwargs["training"] = True
        elif "training" in _context_args(operation):
            kwargs["training"] = False
        outputs = []
        for i, device in enumerate(self.devices):
            tower_args = tree.map_structure(
                lambda a, i=i: a.values[i] if isinstance(a, PerTower) else a, (args, kwargs)
            )
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                outputs.append(operation(*tower_args[0], **tower_args[1]))
        return tree.map_structure(lambda *leaves: PerTower(list(leaves)), *outputs)

    def _synchronised_batch_norm(self, layer: keras.layers.BatchNormalization, inputs: PerTower) -> PerTower:
        xs = inputs.values
        rank = len(xs[0].shape)
        axis = layer.axis % rank
        reduce_axes = [d for d in range(rank) if d != axis]
        means, variances, counts = [], [], []
        for i, (device, x) in enumerate(zip(self.devices, xs, strict=True)):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                mean, variance = tf.nn.moments(x, reduce_axes)
                means.append(mean)
                variances.append(variance)
                counts.append(tf.cast(tf.size(x) // tf.shape(x)[axis], x.dtype))
        with tf.device(self.variable_device), tf.name_scope("sync_batch_norm"):
            total = tf.add_n(counts)
            weights = [c / total for c in counts]
            mean = tf.add_n([w * m for w, m in zip(weights, means, strict=True)])
            variance = tf.add_n(
                [w * (v + tf.square(m - mean)) for w, m, v in zip(weights, means, variances, strict=True)]
            )
            momentum = float(layer.momentum)
            moving_mean = layer.moving_mean.value
            moving_variance = layer.moving_variance.value
            self.updates[self.position[id(layer.moving_mean)]] = moving_mean * momentum + mean * (1.0 - momentum)
            self.updates[self.position[id(layer.moving_variance)]] = moving_variance * momentum + variance * (
                1.0 - momentum
            )
            gamma = layer.gamma.value if layer.scale else None
            beta = layer.beta.value if layer.center else None
        shape = [1] * rank
        shape[axis] = -1
        outputs = []
        for i, (device, x) in enumerate(zip(self.devices, xs, strict=True)):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                outputs.append(
                    tf.nn.batch_normalization(
                        x,
                        tf.reshape(mean, shape),
                        tf.reshape(variance, shape),
                        None if beta is None else tf.reshape(beta, shape),
                        None if gamma is None else tf.reshape(gamma, shape),
                        layer.epsilon,
                    )
                )
        return PerTower(outputs)


class PerTowerRunner(TowerRunner):
    """Each tower runs the whole model on its own (`stateless_call`); the towers' updates
    of non-trainable variables are averaged, by slice size, into one update."""

    def __init__(
        self, model: keras.Model, devices: Sequence[str], variable_device: str, fractions: Sequence[float]
    ) -> None:
        super().__init__(model, devices, variable_device)
        self.fractions = list(fractions)
        self.takes_training = "training" in inspect.signature(model.call).parameters

    def forward(
        self, params: list[tf.Tensor], state: list[tf.Tensor], xs: list[tf.Tensor], training: bool
    ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        outs, states = [], []
        kwargs = {"training": training} if self.takes_training else {}
        for i, device in enumerate(self.devices):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                out, new_state = self.model.stateless_call(params, state, xs[i], **kwargs)
                outs.append(out)
                states.append(new_state)
        with tf.device(self.variable_device):
            combined = []
            for j, value in enumerate(state):
                updates = [s[j] for s in states]
                if value.dtype.is_floating:
                    combined.append(tf.add_n([f * u for f, u in zip(self.fractions, updates, strict=True)]))
                else:
                    combined.append(updates[0])
        return outs, combined


def make_runner(
    model: keras.Model, devices: Sequence[str], variable_device: str, fractions: Sequence[float]
) -> TowerRunner:
    """Lockstep for functional models, per-tower for subclassed ones."""
    if functional_graph(model) is not None:
        return LockstepRunner(model, devices, variable_device)
    return PerTowerRunner(model, devices, variable_device, fractions)


def batch_norm_report(model: keras.Model, runner: TowerRunner) -> dict[str, list[str]]:
    """Which batch-norm layers are synchronised across towers, and which run per tower
    (inside a subclassed model or a custom layer the graph walk cannot enter: each tower
    normalises with its own slice's moments, and the moving statistics get one update per
    tower, one after the other)."""
    report: dict[str, list[str]] = {"synchronized": [], "per_tower": []}
    graph = functional_graph(model) if isinstance(runner, LockstepRunner) else None
    if graph is None:
        report["per_tower"] = [f"{model.name}/{path}" for path in _batch_norms_inside(model)]
    else:
        _walk(graph, model.name, report)
    return report


def _walk(graph: Any, prefix: str, report: dict[str, list[str]]) -> None:
    for layer in graph.layers:
        nested = functional_graph(layer) if isinstance(layer, keras.Model) else None
        if nested is not None:
            _walk(nested, f"{prefix}/{layer.name}", report)
        elif _is_batch_norm(layer):
            report["synchronized"].append(f"{prefix}/{layer.name}")
        else:
            report["per_tower"] += [f"{prefix}/{layer.name}/{path}" for path in _batch_norms_inside(layer)]


def _batch_norms_inside(layer: Any) -> list[str]:
    found = []
    for child in layer._flatten_layers(include_self=False, recursive=False):
        if _is_batch_norm(child):
            found.append(child.name)
        found += [f"{child.name}/{path}" for path in _batch_norms_inside(child)]
    return found


def _is_batch_norm(operation: Any) -> bool:
    return (
        isinstance(operation, keras.layers.BatchNormalization)
        and operation.trainable
        and not getattr(operation, "renorm", False)
    )


def _context_args(operation: Any) -> Any:
    return getattr(operation, "_call_context_args", ())
