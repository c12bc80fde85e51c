"""The training loop around the tower step: resume, train, log, evaluate, checkpoint.

Artifacts of a job (shared by its attempts, so a later attempt resumes):

- `checkpoints/`: `tf.train.CheckpointManager` (model, optimizer with its step counter,
  EMA weights), every `checkpoint_every` steps, at the end, and on SIGTERM.
- `tensorboard/`: event files (train/ and eval/ scalars, the step's graph); open with
  `tensorboard --logdir <artifacts>/tensorboard`.

Step numbers count completed steps: the checkpoint "of step 20" holds the weights after
20 updates, and a job resumed from it trains step 21 next, on the batch step 21 would
have seen without the interruption.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import keras
import tensorflow as tf

from towerq.contract.paths import MODEL_FILE
from towerq.contract.runtime import TrainerInput
from towerq.contract.training import Hyperparameters
from worker.trainer import datasets, devices, feeding, ranks
from worker.trainer.errors import NanLossError, OutOfMemoryError
from worker.trainer.lockstep import batch_norm_report
from worker.trainer.models import ModelError, build_model, user_metrics
from worker.trainer.protocol import EXIT_OK, EXIT_STOPPED, METRICS_LOG, Reporter
from worker.trainer.towers import EvalResult, Objective, TowerStep, UserMetricsError, probe_metrics

MAX_STEPS_PER_CALL = 50


class StopFlag:
    """Set by SIGTERM: the loop checkpoints after the current step and exits. Once the last
    step is trained (`finishing`), a stop is too late to matter: the trainer evaluates,
    saves and exports as always and says `done`, so the job succeeds rather than ending
    stopped with its work done."""

    def __init__(self) -> None:
        self.set = False
        self.in_loop = False
        self.finishing = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def keep(self) -> None:
        """Take SIGTERM back if user code (a model module, a layer while traced) or native
        code replaced the handler: a stop must still checkpoint, not wait for the SIGKILL
        after the grace. Always set again: native code (TensorFlow's gRPC server, in a job
        over several hosts) replaces it where Python's `getsignal` does not see it."""
        self.install()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.finishing:
            return
        if not self.in_loop:
            raise SystemExit(EXIT_STOPPED)  # nothing trained since the last checkpoint
        self.set = True


def make_optimizer(hp: Hyperparameters, precision: str = "float32") -> keras.optimizers.Optimizer:
    """The optimizer the hyperparameters ask for; with float16, wrapped in dynamic loss
    scaling (bfloat16 has float32's range and needs none)."""
    optimizer = _base_optimizer(hp)
    if precision == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _base_optimizer(hp: Hyperparameters) -> keras.optimizers.Optimizer:
    learning_rate: Any = hp.learning_rate
    if hp.lr_decay_rate < 1.0:
        learning_rate = keras.optimizers.schedules.ExponentialDecay(
            hp.learning_rate, hp.lr_decay_steps, hp.lr_decay_rate, staircase=hp.staircase
        )
    if hp.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate)
    if hp.optimizer == "momentum":
        return keras.optimizers.SGD(learning_rate, momentum=hp.momentum)
    return keras.optimizers.SGD(learning_rate)


@dataclass
class Run:
    """One training run, set up and ready to train."""

    spec: TrainerInput
    reporter: Reporter
    setup: devices.DeviceSetup
    data: datasets.Data
    step: TowerStep
    manager: tf.train.CheckpointManager
    checkpoint: tf.train.Checkpoint
    start_step: int
    global_batch: int
    """This host's examples of a step (its towers')."""
    writer: Any
    ranks: ranks.Ranks | None = None
    """A job over several hosts: this trainer's place in the gang."""

    @property
    def hp(self) -> Hyperparameters:
        return self.spec.train.hyperparameters

    @property
    def chief(self) -> bool:
        """This trainer writes the job's files and reports its numbers (rank 0, or alone)."""
        return self.ranks is None or self.ranks.chief

    def train_batches(self) -> tf.data.Dataset:
        """This host's part of each global batch from the start step on (on one host, all)."""
        total = self.step.total_batch
        batches = feeding.train_batches(self.data, total, self.hp.seed or 0, self.start_step, self.hp.steps)
        if self.ranks is None:
            return batches
        first = self.ranks.rank * self.global_batch
        # every rank has the same towers (whole hosts), so rank r takes rows r*b .. r*b+b-1
        return batches.map(lambda x, y: (x[first : first + self.global_batch], y[first : first + self.global_batch]))


def prepare(spec: TrainerInput, reporter: Reporter) -> Run:
    """Devices, data, model, optimizer and the latest checkpoint, in that order (devices
    must be set up before TensorFlow runs anything)."""
    setup = devices.configure(spec.runtime, spec.train.variable_device)
    gang = ranks.connect(spec.runtime)  # before any other op
    hp = spec.train.hyperparameters
    keras.utils.set_random_seed(hp.seed or 0)
    keras.config.set_dtype_policy(spec.train.precision)  # before any layer is made
    data = datasets.load(spec.train, Path(spec.runtime.data_dir))
    global_batch = hp.batch_size * (spec.runtime.batch_gpus or len(setup.devices))
    artifacts = Path(spec.runtime.artifacts_dir)
    with tf.device(setup.variable_device):
        code = Path(spec.runtime.code_path) if spec.runtime.code_path else None
        model = build_model(
            spec.train.model,
            data.input_shape,
            data.classes,
            hp.model_dump(),
            Path(spec.runtime.models_path),
            code,
            spec.runtime.inputs,
        )
        optimizer = make_optimizer(hp, spec.train.precision)
        metrics_fn = user_metrics(spec.train.model)
        try:
            names = probe_metrics(metrics_fn, model, data.input_shape, data.task == "regression") if metrics_fn else []
        except UserMetricsError as err:
            raise ModelError(f"model {spec.train.model}: {err}") from err
    step = TowerStep(
        model,
        optimizer,
        setup.devices,
        setup.variable_device,
        Objective(regression=data.task == "regression"),
        global_batch,
        spec.train.tower_weights,
        hp.weight_decay,
        hp.ema_decay,
        metrics_fn,
        names,
        spec.train.jit_compile,
        gang,
    )
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, ema=step.ema, steps_done=step.steps_done)
    manager = tf.train.CheckpointManager(checkpoint, str(artifacts / "checkpoints"), max_to_keep=3)
    start_step = resume(step, checkpoint, manager, gang)
    if gang is None or gang.chief:
        writer = tf.summary.create_file_writer(str(artifacts / "tensorboard"))
        atexit.register(writer.flush)  # the trainer exits without tearing its objects down
        reporter.keep_metrics(artifacts / METRICS_LOG, start_step, spec.runtime.attempt)
    else:
        writer = tf.summary.create_noop_writer()
    return Run(spec, reporter, setup, data, step, manager, checkpoint, start_step, global_batch, writer, gang)


def resume(
    step: TowerStep, checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager, gang: ranks.Ranks | None
) -> int:
    """The step training starts after: the latest checkpoint's (restored into the model,
    optimizer and moving averages), or 0. Over several hosts, rank 0 restores and every
    rank starts from its weights, optimizer state and step."""
    start_step = 0
    if (gang is None or gang.chief) and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        # steps_done counts the steps loss scaling skipped too; a checkpoint from before it
        # existed has only the optimizer's count
        start_step = int(step.steps_done.numpy()) or int(step.optimizer.iterations.numpy())
        step.steps_done.assign(start_step)
    if gang is not None:
        gang.broadcast([*step.model.variables, *step.optimizer.variables, *step.ema, step.steps_done])
        start_step = int(step.steps_done.numpy())
    return start_step


def announce(run: Run, cuda_visible_devices: str | None) -> None:
    batch_norm = batch_norm_report(run.step.model, run.step.runner)
    run.reporter.emit(
        "started",
        pid=os.getpid(),
        towers=len(run.setup.devices) if run.ranks is None else round(len(run.setup.devices) / run.ranks.share),
        devices=run.setup.devices,
        rank=run.ranks.rank if run.ranks is not None else None,
        ranks=run.ranks.size if run.ranks is not None else None,
        variable_device=run.setup.variable_device,
        cuda_visible_devices=cuda_visible_devices,
        simulated=run.setup.simulated,
        memory_limit_enforced=run.setup.memory_limit_enforced,
        memory_limit_mb=run.setup.memory_limit_mb,
        global_batch=run.step.total_batch,
        tower_batches=run.step.sizes,
        resumed_from_step=run.start_step if run.start_step else None,
        total_steps=run.hp.steps,
        dataset=run.data.name,
        train_examples=run.data.train.size,
        synchronized_batch_norm=not batch_norm["per_tower"],
        batch_norm=batch_norm,
    )


def next_pause(done: int, hp: Hyperparameters) -> int:
    """The next step at which the loop must be back in Python: a log, eval or checkpoint
    step, the last step, or at most `MAX_STEPS_PER_CALL` steps on (so SIGTERM is heard)."""

    def next_multiple(every: int | None) -> int:
        return (done // every + 1) * every if every else hp.steps

    return min(
        hp.steps,
        done + MAX_STEPS_PER_CALL,
        next_multiple(hp.log_every),
        next_multiple(hp.eval_every),
        next_multiple(hp.checkpoint_every),
    )


def train(run: Run, stop: StopFlag) -> int:
    """Train from `run.start_step` to the last step; returns the process exit code.

    Steps run in calls of several steps each (one graph, no Python in between) up to the
    next step that logs, evaluates or checkpoints, so nothing is reported less often."""
    hp = run.hp
    started = time.monotonic()
    if run.start_step >= hp.steps:
        stop.finishing = True
        return finish(run, hp.steps, started)
    batches = run.train_batches()
    graph_due = not run.start_step and run.chief  # written after the first report, which it must not delay
    iterator = iter(batches)
    # The throughput window counts training only: time spent evaluating or checkpointing
    # inside it is taken out, so examples/s does not dip after every evaluation.
    window_start, window_steps, window_paused = time.monotonic(), 0, 0.0
    done = run.start_step
    stop.keep()
    stop.in_loop = True
    while done < hp.steps:
        pause = next_pause(done, hp)
        try:
            with run.ranks.peers() if run.ranks is not None else nullcontext():
                result = run.step.train_steps(iterator, tf.constant(pause - done))
        except tf.errors.ResourceExhaustedError as err:
            raise OutOfMemoryError(
                f"out of memory at step {done + 1}: lower batch_size or raise gpu_memory_fraction ({err.message[:300]})"
            ) from err
        stop.keep()
        window_steps += pause - done
        done = pause
        if done % hp.log_every == 0 or done == hp.steps:
            elapsed = max(time.monotonic() - window_start - window_paused, 1e-9)
            if run.chief:
                report_metric(run, done, result, window_steps * run.step.total_batch / elapsed, elapsed / window_steps)
            window_start, window_steps, window_paused = time.monotonic(), 0, 0.0
        paused = time.monotonic()
        if graph_due:
            write_graph(run, batches.element_spec)
            graph_due = False
        if hp.eval_every and done % hp.eval_every == 0 and done != hp.steps:
            evaluate(run, done)
        if hp.checkpoint_every and done % hp.checkpoint_every == 0 and done != hp.steps:
            save(run, done)
        window_paused += time.monotonic() - paused
        if done < hp.steps and agreed_stop(run, stop.set):  # every rank has the same `done`
            save(run, done)
            run.reporter.emit("stopped", step=done)
            return EXIT_STOPPED
    stop.finishing, stop.in_loop = True, False
    return finish(run, done, started)


def agreed_stop(run: Run, mine: bool) -> bool:
    """Whether to stop now: this trainer was asked to; over several hosts, any rank was (so
    all stop after the same step, and rank 0's checkpoint is the one)."""
    return mine if run.ranks is None else run.ranks.any_stops(mine)


def finish(run: Run, done: int, started: float) -> int:
    if not run.chief:  # rank 0 evaluates, saves and exports; the others are done
        run.reporter.emit("done", step=done, final=None, seconds=round(time.monotonic() - started, 3))
        return EXIT_OK
    final = evaluate(run, done)
    save(run, done)
    export_model(run)
    run.writer.flush()
    run.reporter.emit("done", step=done, final=final, seconds=round(time.monotonic() - started, 3))
    return EXIT_OK


def export_model(run: Run) -> None:
    """The trained model as `model.keras` in the artifacts, the weights evaluation scored (the
    moving averages when `ema_decay` is set); written aside and renamed, so a reader never
    sees half a file. A model Keras cannot save (an unregistered custom layer) is a warning,
    not a failed run."""
    target = Path(run.spec.runtime.artifacts_dir) / MODEL_FILE
    partial = target.with_name(f".partial-{os.getpid()}.keras")
    try:
        with run.step.averaged_weights():
            run.step.model.save(partial)
        os.replace(partial, target)
    except Exception as err:  # noqa: BLE001 - user models may fail to serialize in any way
        partial.unlink(missing_ok=True)
        run.reporter.emit("log", level="warning", message=f"{MODEL_FILE} not exported: {type(err).__name__}: {err}")
        return
    run.reporter.emit("log", level="info", message=f"exported the trained model as {MODEL_FILE}")


def report_metric(run: Run, done: int, result: dict[str, tf.Tensor], examples_per_sec: float, step_time: float) -> None:
    loss = float(result["loss"])
    if not math.isfinite(loss):
        raise NanLossError(f"loss became {loss} at step {done}: lower learning_rate (now {run.hp.learning_rate:g})")
    accuracy = None if run.step.objective.regression else float(result["accuracy"])
    learning_rate = run.step.learning_rate()
    custom = {name: float(value) for name, value in result.get("metrics", {}).items()}
    run.reporter.emit(
        "metric",
        step=done,
        loss=loss,
        accuracy=accuracy,
        learning_rate=learning_rate,
        examples_per_sec=round(examples_per_sec, 1),
        step_time_s=round(step_time, 6),
        **({"metrics": custom} if custom else {}),
    )
    with run.writer.as_default(step=done):
        for name, value in custom.items():
            tf.summary.scalar(f"train/{name}", value)
        tf.summary.scalar("train/loss", loss)
        if accuracy is not None:
            tf.summary.scalar("train/accuracy", accuracy)
        tf.summary.scalar("train/learning_rate", learning_rate)
        tf.summary.scalar("train/examples_per_sec", examples_per_sec)


def evaluate(run: Run, done: int) -> EvalResult:
    result = run.step.evaluate(feeding.eval_batches(run.data, max(run.global_batch, 256)))
    if not math.isfinite(result["loss"]):
        raise NanLossError(f"evaluation loss became {result['loss']} at step {done}")
    if not run.chief:  # evaluated only to keep pace with rank 0 (the next step waits for all)
        return result
    fields: dict[str, Any] = {**result}
    if not fields["metrics"]:
        del fields["metrics"]
    run.reporter.emit("eval", step=done, **fields)
    with run.writer.as_default(step=done):
        for name, value in result["metrics"].items():
            tf.summary.scalar(f"eval/{name}", value)
        tf.summary.scalar("eval/loss", result["loss"])
        if result["accuracy"] is not None:
            tf.summary.scalar("eval/accuracy", result["accuracy"])
    return result


def save(run: Run, done: int) -> None:
    if not run.chief:
        return
    run.reporter.sync_metrics()
    run.writer.flush()  # TensorBoard's points up to a checkpoint are kept with it
    path = run.manager.save(checkpoint_number=done)
    run.reporter.emit("checkpoint", step=done, path=path)


def write_graph(run: Run, spec: tuple[tf.TensorSpec, tf.TensorSpec]) -> None:
    """The traced step graph, for TensorBoard's graph tab."""
    with run.writer.as_default():
        tf.summary.graph(run.step.train.get_concrete_function(*spec).graph)
