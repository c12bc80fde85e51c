"""Training throughput: towerq's tower step against Keras, side by side in one run.

LeNet-5 on 28×28×3 synthetic data, 64 examples per tower, SGD, on logical CPU devices
(simulated GPUs). Measured:

- towerq with k = 1, 2, 4 towers, set up exactly as the trainer sets itself up
  (`worker.trainer.devices.configure`: k logical devices, cores/k threads per op) and
  training in the trainer's calls of 10 steps (its default `log_every`);
- Keras `model.fit` under `tf.distribute.MirroredStrategy` over k = 2, 4 logical devices;
- single-device Keras `fit` on the same global batch (64 × k);
- for transparency, Keras given towerq's process settings (one thread per op for
  MirroredStrategy; `steps_per_execution=10` for the single device): how much of the gap
  those explain.

Every configuration runs in its own process (two MirroredStrategies over different device
sets cannot share one), and the repetitions are interleaved so that drift on a shared
machine hits all alike; medians are printed. Throughput is steady state (after a warm-up,
between the first and last timed step), so set-up and tracing are left out for everyone.
How long `fit` takes to return after its last batch is printed too.

Usage: `python bench/trainer_throughput.py [--steps 120] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PER_TOWER = 64
SHAPE = (28, 28, 3)
STEPS_PER_CALL = 10
Measure = Callable[[int], tuple[float, float]]


def load_data():  # type: ignore[no-untyped-def]
    from towerq.contract.training import DatasetOptions
    from worker.trainer import datasets

    return datasets.synthetic(DatasetOptions(shape=list(SHAPE), classes=10, train_examples=8192, test_examples=64))


def towerq(k: int) -> Measure:
    from towerq.contract.runtime import RuntimeSpec
    from worker.trainer.devices import configure

    setup = configure(RuntimeSpec(artifacts_dir="-", data_dir="-", models_path="-", num_devices=k), "cpu")
    import keras
    import tensorflow as tf

    from worker.trainer import feeding
    from worker.trainer.models import lenet5
    from worker.trainer.towers import Objective, TowerStep

    data = load_data()
    with tf.device(setup.variable_device):
        model = lenet5(SHAPE, 10, {})
    step = TowerStep(
        model, keras.optimizers.SGD(0.01), setup.devices, setup.variable_device, Objective(False), PER_TOWER * k
    )
    iterator = iter(feeding.train_batches(data, PER_TOWER * k, 0, 0, 10**9))
    chunk = tf.constant(STEPS_PER_CALL)

    def measure(steps: int) -> tuple[float, float]:
        float(step.train_steps(iterator, chunk)["loss"])
        start = time.perf_counter()
        for _ in range(steps // STEPS_PER_CALL):
            result = step.train_steps(iterator, chunk)
        float(result["loss"])
        return (steps // STEPS_PER_CALL) * STEPS_PER_CALL * PER_TOWER * k / (time.perf_counter() - start), 0.0

    return measure


def keras_fit(k: int, mirrored: bool, steps_per_execution: int = 1, one_thread_per_op: bool = False) -> Measure:
    import tensorflow as tf

    if one_thread_per_op:
        tf.config.threading.set_intra_op_parallelism_threads(max(1, len(os.sched_getaffinity(0)) // k))
        tf.config.threading.set_inter_op_parallelism_threads(max(2, k))
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * k
    )
    import keras

    from worker.trainer.models import lenet5

    data = load_data()
    global_batch = PER_TOWER * k
    pipeline = (
        tf.data.Dataset.from_tensor_slices((data.train.x, data.train.y))
        .shuffle(8192, seed=0)
        .repeat()
        .batch(global_batch, drop_remainder=True)
        .prefetch(2)
    )
    devices = [f"/device:CPU:{i}" for i in range(k)]
    strategy = tf.distribute.MirroredStrategy(devices) if mirrored else tf.distribute.OneDeviceStrategy(devices[0])
    with strategy.scope():
        model = lenet5(SHAPE, 10, {})
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
        )

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            now = time.perf_counter()
            if not hasattr(self, "start"):
                self.start, self.first = now, batch
            self.end, self.last = now, batch

    def measure(steps: int) -> tuple[float, float]:
        clock = Clock()
        model.fit(pipeline, steps_per_epoch=steps + steps_per_execution, epochs=1, verbose=0, callbacks=[clock])
        returned = time.perf_counter()
        return (clock.last - clock.first) * global_batch / (clock.end - clock.start), returned - clock.end

    return measure


CONFIGS: dict[str, Callable[[], Measure]] = {
    "towerq k=1": lambda: towerq(1),
    "towerq k=2": lambda: towerq(2),
    "towerq k=4": lambda: towerq(4),
    "MirroredStrategy+fit k=2": lambda: keras_fit(2, mirrored=True),
    "MirroredStrategy+fit k=4": lambda: keras_fit(4, mirrored=True),
    "single-device fit, batch 128": lambda: keras_fit(2, mirrored=False),
    "single-device fit, batch 256": lambda: keras_fit(4, mirrored=False),
    # Keras 3.15 fails with MirroredStrategy and steps_per_execution > 1 ("You must feed a
    # value for placeholder tensor ... in multi_step_on_iterator"), so only the threads here.
    "[towerq's threads] Mirrored+fit k=4": lambda: keras_fit(4, True, one_thread_per_op=True),
    "[towerq's settings] 1-device fit 256": lambda: keras_fit(4, False, STEPS_PER_CALL, one_thread_per_op=False),
}


def child(name: str, steps: int) -> None:
    """Measure one configuration in this process and print it as JSON."""
    measure = CONFIGS[name]()
    measure(20)  # warm up: trace, build, fill caches
    examples_per_s, after = measure(steps)
    print(json.dumps({"name": name, "examples_per_s": examples_per_s, "fit_returns_after_s": after}))


def run_child(name: str, steps: int) -> dict[str, float]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--steps", str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    speed: dict[str, list[float]] = defaultdict(list)
    stall: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.repeats):
        for name in CONFIGS:
            result = run_child(name, args.steps)
            speed[name].append(result["examples_per_s"])
            stall[name].append(result["fit_returns_after_s"])
    median = {name: statistics.median(values) for name, values in speed.items()}
    cores = len(os.sched_getaffinity(0))
    print(
        f"LeNet-5, 28x28x3 synthetic, {PER_TOWER} per tower, SGD, logical CPU devices on {cores} cores; "
        f"median of {args.repeats} interleaved runs of {args.steps} steps"
    )
    print(f"{'configuration':<38} {'examples/s':>10}  {'runs':<24} fit returns after")
    for name, value in median.items():
        runs_text = ", ".join(f"{v:.0f}" for v in speed[name])
        after = f"{statistics.median(stall[name]):.2f} s" if "fit" in name else ""
        print(f"{name:<38} {value:>10.0f}  {runs_text:<24} {after}")
    ratios = [
        ("towerq k=2 / MirroredStrategy+fit k=2", "towerq k=2", "MirroredStrategy+fit k=2", 1.3),
        ("towerq k=4 / MirroredStrategy+fit k=4", "towerq k=4", "MirroredStrategy+fit k=4", 1.3),
        ("towerq k=4 / single-device fit, batch 256", "towerq k=4", "single-device fit, batch 256", 1.1),
        ("towerq k=2 / single-device fit, batch 128", "towerq k=2", "single-device fit, batch 128", None),
        (
            "towerq k=4 / Mirrored+fit k=4 with towerq's threads",
            "towerq k=4",
            "[towerq's threads] Mirrored+fit k=4",
            None,
        ),
        (
            "towerq k=4 / 1-device fit 256 with towerq's settings",
            "towerq k=4",
            "[towerq's settings] 1-device fit 256",
            None,
        ),
    ]
    print()
    for label, ours, theirs, bar in ratios:
        ratio = median[ours] / median[theirs]
        verdict = "" if bar is None else f"  (bar >= {bar}: {'met' if ratio >= bar else 'NOT met'})"
        print(f"{label:<54} {ratio:5.2f}x{verdict}")


if __name__ == "__main__":
    main()
