"""Device setup: memory limits from the GPUs' total memory; what cannot be combined."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from towerq.contract.runtime import RuntimeSpec, TrainerInput
from towerq.contract.training import TrainSpec
from worker.trainer.devices import configure, memory_limits_mb
from worker.trainer.errors import DeviceError


def runtime(fraction: float, totals: list[int], reserved: int = 0, overhead: int = 0) -> RuntimeSpec:
    return RuntimeSpec(
        artifacts_dir="a",
        data_dir="d",
        models_path="m",
        gpu_memory_fraction=fraction,
        gpu_memory_total_mb=totals,
        gpu_memory_reserved_mb=reserved,
        gpu_process_overhead_mb=overhead,
    )


def test_a_memory_fraction_becomes_a_limit_in_mb_of_each_gpus_total() -> None:
    assert memory_limits_mb(runtime(0.5, [81920, 40960]), 2) == [40960, 20480]
    assert memory_limits_mb(runtime(0.25, [16384]), 1) == [4096]
    assert memory_limits_mb(runtime(1.0, [81920]), 1) is None


def test_a_shared_gpu_s_limit_leaves_room_for_the_card_s_reserve_and_each_process_s_context() -> None:
    # An H100 as measured: 81,559 MB total, 480 MB used with no process on it; each process
    # pays for its CUDA context outside any framework limit.
    halves = [memory_limits_mb(runtime(0.5, [81559], 480, 526), 1) for _ in range(2)]
    assert halves == [[40_013], [40_013]]
    assert sum(h[0] + 526 for h in halves) + 480 <= 81559, "two 0.5 jobs fit on the card, contexts and all"
    assert 2 * (81559 // 2) + 2 * 526 + 480 > 81559, "the plain f × total limits would not have"


def test_a_fraction_too_small_to_leave_memory_after_the_context_is_refused() -> None:
    assert memory_limits_mb(runtime(0.05, [16384], 480, 500), 1) == [295]  # 0.05 × 15,904 − 500
    with pytest.raises(DeviceError, match=r"gpu_memory_fraction 0.04 leaves 136 MB .* \(at least 256 MB needed\)"):
        memory_limits_mb(runtime(0.04, [16384], 480, 500), 1)


def test_a_fraction_needs_the_total_memory_of_every_gpu() -> None:
    with pytest.raises(DeviceError, match="total memory of 2 GPUs needed"):
        memory_limits_mb(runtime(0.5, [81920]), 2)


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


@pytest.mark.parametrize(
    ("train", "runtime", "words"),
    [
        ({}, {"num_devices": 4, "batch_gpus": 2}, r"4 devices for a job of 2 GPUs \(batch_gpus\)"),
        ({"tower_weights": [1]}, {"num_devices": 1, "batch_gpus": 2}, "a job on fewer GPUs than batch_gpus has none"),
        ({}, {"num_devices": 1, "batch_gpus": 2, "cluster": ["a:1", "b:1"]}, "runs at its full size"),
    ],
)
def test_a_job_on_fewer_gpus_than_its_size_is_refused_where_its_batch_cannot_follow(
    train: dict[str, object], runtime: dict[str, object], words: str
) -> None:
    folders = {"artifacts_dir": "a", "data_dir": "d", "models_path": "m"}
    with pytest.raises(ValidationError, match=words):
        TrainerInput(train=TrainSpec(model="mlp", dataset="digits", **train), runtime=RuntimeSpec(**folders, **runtime))
    fewer = RuntimeSpec(**folders, num_devices=1, batch_gpus=2)
    assert TrainerInput(train=TrainSpec(model="mlp", dataset="digits"), runtime=fewer).runtime.batch_gpus == 2
