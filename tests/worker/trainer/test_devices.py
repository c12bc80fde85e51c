"""Device setup: memory limits from the GPUs' total memory; what cannot be combined."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.trainer.devices import configure, memory_limits_mb
from worker.trainer.errors import DeviceError
from worker.trainer.spec import RuntimeSpec, TrainerInput, TrainSpec


def test_a_memory_fraction_becomes_a_limit_in_mb_of_each_gpus_total() -> None:
    assert memory_limits_mb(0.5, [81920, 40960], 2) == [40960, 20480]
    assert memory_limits_mb(0.25, [16384], 1) == [4096]
    assert memory_limits_mb(1.0, [81920], 1) is None


def test_a_fraction_needs_the_total_memory_of_every_gpu() -> None:
    with pytest.raises(DeviceError, match="total memory of 2 GPUs needed"):
        memory_limits_mb(0.5, [81920], 2)


def test_memory_growth_and_a_fraction_together_are_refused_before_anything_starts() -> None:
    runtime = {
        "artifacts_dir": "a",
        "data_dir": "d",
        "models_path": "m",
        "gpu_memory_fraction": 0.5,
        "memory_growth": True,
    }
    with pytest.raises(ValidationError, match="memory_growth cannot be combined with gpu_memory_fraction < 1"):
        TrainerInput(train=TrainSpec(model="mlp", dataset="digits"), runtime=RuntimeSpec(**runtime))


def test_real_gpus_that_tensorflow_cannot_see_are_a_device_error() -> None:
    runtime = RuntimeSpec(artifacts_dir="a", data_dir="d", models_path="m", simulated=False, num_devices=2)
    with pytest.raises(DeviceError, match="2 GPUs allocated but TensorFlow sees 0"):
        configure(runtime, "cpu")


def test_tower_weights_must_match_the_towers() -> None:
    runtime = RuntimeSpec(artifacts_dir="a", data_dir="d", models_path="m", num_devices=2)
    with pytest.raises(ValidationError, match="tower_weights has 3 entries but the job has 2 towers"):
        TrainerInput(train=TrainSpec(model="mlp", dataset="digits", tower_weights=[1, 1, 1]), runtime=runtime)
