"""The trainer as the worker runs it: `python -m worker.trainer SPEC.json`, JSON lines out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from worker.trainer.protocol import EXIT_ERROR, EXIT_OK, EXIT_STOPPED

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def write_spec(tmp_path: Path, name: str, towers: int = 2, runtime: dict[str, Any] | None = None, **train: Any) -> Path:
    hyper = {"steps": 40, "batch_size": 8, "seed": 11, "optimizer": "sgd", "learning_rate": 0.05, "log_every": 1}
    hyper.update(train.pop("hyperparameters", {}))
    body = {
        "train": {
            "model": "lenet5",
            "dataset": "synthetic",
            "dataset_options": {"shape": [12, 12, 3], "train_examples": 200, "test_examples": 40},
            "hyperparameters": hyper,
            **train,
        },
        "runtime": {
            "artifacts_dir": str(tmp_path / name),
            "data_dir": str(tmp_path / "data"),
            "models_path": str(tmp_path / "models"),
            "simulated": True,
            "num_devices": towers,
            **(runtime or {}),
        },
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body))
    return path


def start(spec: Path, new_session: bool = False, **extra_env: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **extra_env}
    return subprocess.Popen(
        [sys.executable, "-m", "worker.trainer", str(spec)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


def run(spec: Path, **extra_env: str) -> tuple[int, list[dict[str, Any]]]:
    process = start(spec, **extra_env)
    out, _ = process.communicate(timeout=300)
    return process.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def stopped_at(spec: Path, step: int) -> tuple[int, list[dict[str, Any]]]:
    """Runs the trainer and stops it as towerq does (SIGTERM) once it reports step `step` or
    later; its exit code and every line it wrote."""
    process = start(spec)
    assert process.stdout is not None
    lines = []
    try:
        for raw in process.stdout:
            if raw.startswith("{"):
                lines.append(json.loads(raw))
                if lines[-1].get("step", 0) >= step:
                    process.send_signal(signal.SIGTERM)
                    break
        out, _ = process.communicate(timeout=120)
    finally:
        process.kill()
        process.communicate()
    return process.returncode, lines + [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def events(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == kind]


def checkpoint_values(folder: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(folder / "checkpoints"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if "save_counter" not in name}


def test_every_line_is_protocol_json_and_the_run_ends_with_done(tmp_path: Path) -> None:
    hyper = {"steps": 12, "log_every": 4, "eval_every": 6, "checkpoint_every": 6}
    code, lines = run(write_spec(tmp_path, "a", hyperparameters=hyper))
    assert code == EXIT_OK
    assert [(line["event"], line.get("step")) for line in lines] == [
        ("started", None),
        ("metric", 4),
        ("eval", 6),
        ("checkpoint", 6),
        ("metric", 8),
        ("metric", 12),
        ("eval", 12),
        ("checkpoint", 12),
        ("log", None),  # the trained model exported as model.keras
        ("done", 12),
    ]
    assert lines[-2]["message"] == "exported the trained model as model.keras"
    started = lines[0]
    assert started["towers"] == 2 and started["tower_batches"] == [8, 8] and started["global_batch"] == 16
    assert started["simulated"] is True and started["memory_limit_enforced"] is False
    assert [m["step"] for m in events(lines, "metric")] == [4, 8, 12]
    assert [e["step"] for e in events(lines, "eval")] == [6, 12]
    assert lines[-1]["event"] == "done" and lines[-1]["final"]["examples"] == 40
    assert all(isinstance(line["time"], float) for line in lines)


def test_same_seed_and_spec_give_the_same_numbers(tmp_path: Path) -> None:
    first = run(write_spec(tmp_path, "one", hyperparameters={"steps": 10}))[1]
    second = run(write_spec(tmp_path, "two", hyperparameters={"steps": 10}))[1]
    assert [m["loss"] for m in events(first, "metric")] == [m["loss"] for m in events(second, "metric")]


def test_killed_and_restarted_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path: Path) -> None:
    hyper = {"steps": 40, "checkpoint_every": 20, "eval_every": 0}
    assert run(write_spec(tmp_path, "whole", hyperparameters=hyper))[0] == EXIT_OK

    spec = write_spec(tmp_path, "killed", hyperparameters=hyper)
    process = start(spec)
    assert process.stdout is not None
    for raw in process.stdout:
        line = json.loads(raw)
        if line["event"] == "metric" and line["step"] == 25:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL

    code, lines = run(spec)
    assert code == EXIT_OK
    assert lines[0]["resumed_from_step"] == 20
    assert [m["step"] for m in events(lines, "metric")] == list(range(21, 41))
    whole, resumed = checkpoint_values(tmp_path / "whole"), checkpoint_values(tmp_path / "killed")
    assert whole.keys() == resumed.keys()
    assert any("optimizer" in name for name in whole)
    for name in whole:
        assert np.array_equal(whole[name], resumed[name]), name


def test_sigterm_checkpoints_then_exits_143_and_the_next_run_resumes_there(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "stop", hyperparameters={"steps": 100000, "checkpoint_every": 0})
    process = start(spec)
    assert process.stdout is not None
    for raw in process.stdout:
        if json.loads(raw).get("step") == 5:
            process.send_signal(signal.SIGTERM)
            break
    rest = [json.loads(line) for line in process.stdout.read().splitlines() if line.startswith("{")]
    assert process.wait(timeout=60) == EXIT_STOPPED
    stopped = events(rest, "stopped")[0]["step"]
    assert events(rest, "checkpoint")[-1]["step"] == stopped
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "stop" / "tensorboard"), size_guidance={"tensors": 0})
    board.Reload()  # the trainer exits without teardown: what it wrote is flushed before
    assert [e.step for e in board.Tensors("train/loss")][-1] == stopped

    resumed = start(write_spec(tmp_path, "stop", hyperparameters={"steps": stopped + 2, "checkpoint_every": 0}))
    out, _ = resumed.communicate(timeout=120)
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["resumed_from_step"] == stopped
    assert lines[-1]["event"] == "done" and lines[-1]["step"] == stopped + 2


def test_a_sigterm_after_the_last_step_is_too_late_the_trainer_finishes_and_says_done(tmp_path: Path) -> None:
    """A cancel that reaches a trainer evaluating, saving or exporting after its last step
    used to end it 'stopped' (exit 143), and the job cancelled with its work done."""
    spec = write_spec(tmp_path, "late", hyperparameters={"steps": 6, "checkpoint_every": 0})
    process = start(spec)
    assert process.stdout is not None
    for raw in process.stdout:
        if raw.startswith("{") and json.loads(raw).get("step") == 6:  # the last step's metric
            process.send_signal(signal.SIGTERM)
            break
    rest = [json.loads(line) for line in process.stdout.read().splitlines() if line.startswith("{")]
    assert process.wait(timeout=60) == EXIT_OK, rest
    assert not events(rest, "stopped")
    assert events(rest, "done")[0]["step"] == 6
    assert (tmp_path / "late" / "model.keras").exists()


IGNORING_MODEL = """
import signal

import keras

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # user code that wants no signals


class Deaf(keras.layers.Layer):
    def call(self, x):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # again while traced
        return x


def deaf(hparams):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return keras.Sequential([keras.Input(hparams["input_shape"]), Deaf(), keras.layers.Flatten(),
                             keras.layers.Dense(hparams["num_classes"])])
"""


def test_user_code_that_ignores_sigterm_still_checkpoints_when_stopped(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "nets.py").write_text(IGNORING_MODEL)
    spec = write_spec(tmp_path, "deaf", model="nets:deaf", hyperparameters={"steps": 100000, "checkpoint_every": 0})
    code, lines = stopped_at(spec, 5)
    assert code == EXIT_STOPPED
    assert events(lines, "checkpoint")[-1]["step"] == events(lines, "stopped")[0]["step"]


@pytest.mark.parametrize(
    ("train", "kind", "words"),
    [
        ({"hyperparameters": {"learning_rate": 100.0}}, "nan_loss", "loss became"),
        ({"dataset": "npz:missing.npz", "dataset_options": {}}, "dataset", "npz file"),
        ({"model": "nets:huge"}, "oom", "out of memory at step 1"),
        ({"model": "nets:absent"}, "model", "has no function 'absent'"),
    ],
)
def test_failures_end_with_an_error_line_and_a_nonzero_exit(
    tmp_path: Path, train: dict[str, Any], kind: str, words: str
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "nets.py").write_text(HUGE_MODEL)
    (tmp_path / "data").mkdir()
    code, lines = run(write_spec(tmp_path, "bad", **train))
    assert code == EXIT_ERROR
    error = lines[-1]
    assert error["event"] == "error" and error["kind"] == kind
    assert words in error["message"]


HUGE_MODEL = """
import keras
import tensorflow as tf

class Greedy(keras.layers.Layer):
    def call(self, x, training=False):
        if training:  # asks for 128 GB: the allocator refuses with ResourceExhaustedError
            waste = tf.reduce_sum(tf.random.uniform(tf.stack([tf.shape(x)[0] * 4096, 2**20])))
            return x + 0.0 * waste
        return x

def huge(hparams):
    return keras.Sequential([keras.Input(hparams["input_shape"]), Greedy(), keras.layers.Flatten(),
                             keras.layers.Dense(hparams["num_classes"])])
"""


def test_an_unreadable_spec_file_is_an_error_line(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"train": {"model": "lenet5", "dataset": "digits"}, "runtime": {}}))
    code, lines = run(path)
    assert code == EXIT_ERROR
    assert lines[-1]["kind"] == "spec"
    assert "runtime.artifacts_dir: Field required" in lines[-1]["message"]


def test_tensorboard_events_hold_scalars_and_the_graph(tmp_path: Path) -> None:
    assert run(write_spec(tmp_path, "tb", hyperparameters={"steps": 6, "log_every": 2, "eval_every": 3}))[0] == EXIT_OK
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path / "tb" / "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags()["tensors"])
    assert {
        "train/loss",
        "train/accuracy",
        "train/learning_rate",
        "train/examples_per_sec",
        "eval/loss",
        "eval/accuracy",
    } <= tags
    assert [e.step for e in accumulator.Tensors("train/loss")] == [2, 4, 6]
    assert accumulator.Graph() is not None


def test_examples_per_sec_counts_training_only_not_the_evaluations_between(tmp_path: Path) -> None:
    # A test split far larger than a few training steps: each evaluation takes much longer
    # than the 5 steps after it, so a window that counted it would show a deep dip.
    spec = write_spec(
        tmp_path,
        "speed",
        dataset_options={"shape": [12, 12, 3], "train_examples": 200, "test_examples": 20_000},
        hyperparameters={"steps": 60, "log_every": 5, "eval_every": 10},
    )
    code, lines = run(spec)
    assert code == EXIT_OK
    speed = {e["step"]: e["examples_per_sec"] for e in events(lines, "metric")}
    after_eval = [speed[s] for s in (15, 25, 35, 45, 55)]
    others = [speed[s] for s in (20, 30, 40, 50, 60)]  # the first window holds the compile
    assert float(np.median(after_eval)) > 0.5 * float(np.median(others)), speed


def test_the_trainer_runs_at_the_niceness_it_is_given_and_so_does_its_session(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "nice", hyperparameters={"steps": 100000})
    spec = json.loads(path.read_text())
    spec["runtime"]["nice"] = 7
    path.write_text(json.dumps(spec))
    process = start(path, new_session=True)  # as the worker starts it
    try:
        assert process.stdout is not None
        assert json.loads(process.stdout.readline())["event"] == "started"
        with open(f"/proc/{process.pid}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[16]) == 7
        autogroup = Path(f"/proc/{process.pid}/autogroup")
        if autogroup.exists():  # Linux with autogroup: sessions are weighed before niceness
            assert autogroup.read_text().split()[-1] == "7"
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_a_mixed_precision_xla_run_trains_checkpoints_resumes_and_exports(tmp_path: Path, precision: str) -> None:
    """Each tower's step is compiled by XLA (one cluster per tower device at least), and a
    run stopped half-way resumes at its step in the same precision."""
    dumps = tmp_path / "xla"
    hyper = {"steps": 8, "log_every": 2, "eval_every": 0, "checkpoint_every": 4, "learning_rate": 0.01}
    spec = write_spec(tmp_path, "mixed", precision=precision, jit_compile=True, hyperparameters=hyper)
    code, lines = run(spec, XLA_FLAGS=f"--xla_dump_to={dumps}")
    assert code == EXIT_OK, lines
    losses = [m["loss"] for m in events(lines, "metric")]
    assert len(losses) == 4 and all(np.isfinite(losses)), losses
    modules = {path.name.split(".")[1] for path in dumps.glob("module_*.txt")}
    assert len(modules) >= 2, sorted(dumps.iterdir())[:10]
    model = keras.models.load_model(tmp_path / "mixed" / "model.keras")
    assert {layer.dtype_policy.name for layer in model.layers if layer.weights} == {precision}

    again = write_spec(tmp_path, "mixed", precision=precision, jit_compile=True, hyperparameters={**hyper, "steps": 12})
    code, lines = run(again)
    assert code == EXIT_OK
    assert events(lines, "started")[0]["resumed_from_step"] == 8
    assert [m["step"] for m in events(lines, "metric")] == [10, 12]
