"""Datasets: what each loads, the input order, resumption, and refusing paths outside."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from pydantic import ValidationError

from towerq.contract.catalog import BUILTIN_DATASETS, MODELS
from towerq.contract.training import TrainSpec
from worker.trainer import datasets, feeding
from worker.trainer.errors import DatasetError
from worker.trainer.models import BUILTIN


def spec(dataset: str, **options: object) -> TrainSpec:
    model = "poly2" if dataset == "quadratic" else "mlp"
    return TrainSpec(model=model, dataset=dataset, dataset_options=options)


def batches(data: datasets.Data, global_batch: int, seed: int, start: int, steps: int) -> list[np.ndarray]:
    return [y.numpy() for _, y in feeding.train_batches(data, global_batch, seed, start, steps)]


def test_synthetic_has_the_shape_and_classes_asked_for(tmp_path: Path) -> None:
    data = datasets.load(spec("synthetic", shape=[6, 5, 2], classes=3, train_examples=100, test_examples=20), tmp_path)
    assert (data.input_shape, data.classes, data.train.size, data.test.size) == ((6, 5, 2), 3, 100, 20)


def test_digits_are_split_80_20_the_same_way_every_time(tmp_path: Path) -> None:
    first = datasets.load(spec("digits"), tmp_path)
    again = datasets.load(spec("digits"), tmp_path)
    assert (first.train.size, first.test.size) == (1438, 359)
    assert first.input_shape == (8, 8, 1)
    assert isinstance(first.test, datasets.ArraySource) and isinstance(again.test, datasets.ArraySource)
    assert np.array_equal(first.test.y, again.test.y)


def test_fashion_mnist_comes_from_the_debian_package(tmp_path: Path) -> None:
    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists():
        with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
            datasets.load(spec("fashion_mnist"), tmp_path)
        pytest.fail("dataset-fashion-mnist is not installed: scripts/setup-system --test installs it")
    data = datasets.load(spec("fashion_mnist"), tmp_path)
    assert (data.train.size, data.test.size, data.input_shape, data.classes) == (60000, 10000, (28, 28, 1), 10)
    x, y = next(iter(feeding.eval_batches(data, 8)))
    assert x.dtype == tf.float32 and 0.0 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 1.0


def test_the_order_depends_on_the_seed_and_the_global_batch_only(tmp_path: Path) -> None:
    data = datasets.load(spec("synthetic", train_examples=50, test_examples=10), tmp_path)
    run = batches(data, 16, seed=3, start=0, steps=10)
    assert [len(b) for b in run] == [16] * 10
    assert all(np.array_equal(a, b) for a, b in zip(run, batches(data, 16, seed=3, start=0, steps=10), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(run, batches(data, 16, seed=4, start=0, steps=10), strict=True))
    # every example once per epoch: the first 3 steps (48 positions) repeat none of 50
    assert isinstance(data.train, datasets.ArraySource)


def test_a_resumed_run_sees_exactly_the_rest_of_the_batches(tmp_path: Path) -> None:
    data = datasets.load(spec("synthetic", train_examples=37, test_examples=10), tmp_path)
    whole = batches(data, 8, seed=5, start=0, steps=12)
    rest = batches(data, 8, seed=5, start=7, steps=12)
    assert len(rest) == 5
    assert all(np.array_equal(a, b) for a, b in zip(whole[7:], rest, strict=True))


def test_each_epoch_visits_every_example_once(tmp_path: Path) -> None:
    data = datasets.load(spec("synthetic", train_examples=24, test_examples=4), tmp_path)
    assert isinstance(data.train, datasets.ArraySource)
    xs = [x.numpy() for x, _ in feeding.train_batches(data, 8, 1, 0, 3)]
    seen = np.concatenate(xs).reshape(24, -1)
    expected = data.train.x.reshape(24, -1)
    assert sorted(map(bytes, seen)) == sorted(map(bytes, expected))


def test_npz_with_its_own_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "set.npz",
        x_train=rng.integers(0, 255, (40, 5, 5), dtype=np.uint8),
        y_train=rng.integers(0, 3, 40),
        x_test=rng.integers(0, 255, (10, 5, 5), dtype=np.uint8),
        y_test=rng.integers(0, 3, 10),
    )
    data = datasets.load(spec("npz:set.npz"), tmp_path)
    assert (data.train.size, data.test.size, data.input_shape, data.classes) == (40, 10, (5, 5, 1), 3)
    x, _ = next(iter(feeding.train_batches(data, 4, 0, 0, 1)))
    assert float(tf.reduce_max(x)) <= 1.0  # uint8 scaled


def test_npz_of_x_and_y_is_split_by_test_fraction(tmp_path: Path) -> None:
    np.savez(tmp_path / "xy.npz", x=np.zeros((20, 3), np.float32), y=np.arange(20) % 2)
    data = datasets.load(spec("npz:xy.npz", test_fraction=0.25), tmp_path)
    assert (data.train.size, data.test.size) == (15, 5)


def test_npz_without_the_expected_arrays_is_a_clear_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", images=np.zeros((2, 2)))
    with pytest.raises(
        DatasetError, match=r"must hold x_train, y_train, x_test, y_test \(or x, y\); it has \['images'\]"
    ):
        datasets.load(spec("npz:bad.npz"), tmp_path)


def write_png(path: Path, value: int, size: tuple[int, int] = (6, 4)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = tf.fill((*size, 3), tf.constant(value, tf.uint8))
    path.write_bytes(tf.io.encode_png(image).numpy())


def test_image_folder_has_one_class_per_subfolder(tmp_path: Path) -> None:
    for label, name in enumerate(["cat", "dog"]):
        for i in range(5):
            write_png(tmp_path / "pets" / name / f"{i}.png", 100 * label)
    data = datasets.load(spec("images:pets", test_fraction=0.2, image_size=[3, 2]), tmp_path)
    assert (data.classes, data.input_shape, data.train.size, data.test.size) == (2, (3, 2, 3), 8, 2)
    x, y = next(iter(feeding.eval_batches(data, 2)))
    assert x.shape == (2, 3, 2, 3)


def test_tfrecords_of_encoded_images(tmp_path: Path) -> None:
    with tf.io.TFRecordWriter(str(tmp_path / "train.tfrecord")) as writer:
        for i in range(12):
            png = tf.io.encode_png(tf.fill((4, 4, 1), tf.constant(20 * i, tf.uint8))).numpy()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    data = datasets.load(spec("tfrecord:*.tfrecord", classes=3, test_fraction=0.25), tmp_path)
    assert data.input_shape == (4, 4, 1)
    assert data.train.size == 9
    assert sum(int(x.shape[0]) for x, _ in feeding.eval_batches(data, 2)) == 3
    assert len(batches(data, 3, 0, 0, 5)) == 5


def test_paths_outside_the_data_folder_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    np.savez(outside / "secret.npz", x=np.zeros((4, 2)), y=np.zeros(4, int))
    root = tmp_path / "data"
    root.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(DatasetError, match="leads outside"):
        datasets.load(spec("npz:link/secret.npz"), root)
    with pytest.raises(ValueError, match="must not contain '..'"):
        spec("npz:../outside/secret.npz")


def test_options_that_do_not_apply_are_refused_before_anything_loads() -> None:
    with pytest.raises(
        ValidationError, match=r"dataset_options\n  Value error, shape does not apply to dataset 'digits'"
    ):
        spec("digits", shape=[2, 2])


def test_every_catalog_dataset_and_model_has_a_loader_and_a_builder(tmp_path: Path) -> None:
    assert set(BUILTIN) == set(MODELS)
    for name in BUILTIN_DATASETS:
        try:
            data = datasets.load(spec(name, train_examples=8, test_examples=4), tmp_path)
        except DatasetError as err:  # only when Debian's dataset-fashion-mnist is missing
            assert name == "fashion_mnist" and "is not installed" in str(err)
            continue
        assert data.train.size == 8


def test_quadratic_points_follow_the_coefficients(tmp_path: Path) -> None:
    data = datasets.load(spec("quadratic", coefficients=[2.0, 0.0, -1.0], noise=0.0), tmp_path)
    assert isinstance(data.train, datasets.ArraySource)
    x, y = data.train.x[:, 0], data.train.y[:, 0]
    assert np.allclose(y, 2 * x**2 - 1, atol=1e-5)
    assert data.task == "regression"
