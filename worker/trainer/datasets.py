"""Datasets: what each name in the catalog loads, as arrays, image files or TFRecords.

Nothing is downloaded at run time. The input pipeline that feeds them to the towers is
`worker.trainer.feeding`.
"""

from __future__ import annotations

import glob
import gzip
import importlib.util
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf

from towerq.contract.catalog import Task
from towerq.contract.paths import PathEscapeError, resolve_inside
from towerq.contract.training import DatasetOptions, TrainSpec
from worker.trainer.errors import DatasetError

FASHION_MNIST_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)
FASHION_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
SPLIT_SEED = 20_171_023
"""Fixed seed of train/test splits and synthetic data: the same for every job."""


@dataclass
class ArraySource:
    """Examples held in memory; uint8 images are scaled to [0, 1] when batched."""

    x: np.ndarray
    y: np.ndarray

    @property
    def size(self) -> int:
        return int(self.x.shape[0])


@dataclass
class FileSource:
    """Image files decoded when batched: paths and their labels."""

    paths: list[str]
    labels: np.ndarray
    image_size: tuple[int, int]
    channels: int

    @property
    def size(self) -> int:
        return len(self.paths)


@dataclass
class RecordSource:
    """TFRecord files of `image` (encoded bytes) and `label` (int64), streamed."""

    files: list[str]
    image_size: tuple[int, int]
    channels: int
    holdout: tuple[int, bool] | None = None
    """(k, keep_test): split one record in k off as the test set."""
    size: int | None = None


Source = ArraySource | FileSource | RecordSource


@dataclass
class Data:
    name: str
    task: Task
    input_shape: tuple[int, ...]
    classes: int
    train: Source
    test: Source
    notes: list[str] = field(default_factory=list)


# -- loading ------------------------------------------------------------------------------


def load(spec: TrainSpec, data_dir: Path) -> Data:
    """The dataset the spec names, ready to feed."""
    kind = spec.dataset_kind
    options = spec.dataset_options
    loaders = {
        "synthetic": lambda: synthetic(options),
        "digits": lambda: digits(options),
        "fashion_mnist": lambda: fashion_mnist(options, data_dir),
        "quadratic": lambda: quadratic(options),
        "npz": lambda: npz(_inside(data_dir, spec.dataset_path), options, data_dir),
        "images": lambda: image_folder(_inside(data_dir, spec.dataset_path), options, data_dir),
        "tfrecord": lambda: tfrecords(spec.dataset_path or "", options, data_dir),
    }
    if kind not in loaders:
        raise DatasetError(f"unknown dataset {spec.dataset!r}")
    data = loaders[kind]()
    if data.train.size == 0:
        raise DatasetError(f"dataset {spec.dataset!r} has no training examples")
    return data


def _inside(root: Path, relative: str | None) -> Path:
    try:
        return resolve_inside(root, relative or "")
    except PathEscapeError as err:
        raise DatasetError(f"dataset path refused: {err}") from err


def _limit(source: ArraySource, count: int | None) -> ArraySource:
    return source if count is None else ArraySource(source.x[:count], source.y[:count])


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float) -> tuple[ArraySource, ArraySource]:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = max(1, int(round(len(x) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return ArraySource(x[train], y[train]), ArraySource(x[test], y[test])


def synthetic(options: DatasetOptions) -> Data:
    """Noisy copies of one random prototype per class: learnable, and the same for every job."""
    shape = tuple(options.shape or (28, 28, 3))
    classes = options.classes or 10
    n_train = options.train_examples or 4096
    n_test = options.test_examples or 1024
    rng = np.random.default_rng(SPLIT_SEED)
    prototypes = rng.normal(size=(classes, *shape)).astype(np.float32)
    y = rng.integers(0, classes, size=n_train + n_test).astype(np.int32)
    x = 0.5 * prototypes[y] + rng.normal(size=(len(y), *shape)).astype(np.float32)
    data = Data(
        "synthetic",
        "classification",
        shape,
        classes,
        ArraySource(x[:n_train], y[:n_train]),
        ArraySource(x[n_train:], y[n_train:]),
    )
    return data


def digits_file() -> Path | None:
    """scikit-learn's bundled digits (the file its `load_digits` reads), found without
    importing scikit-learn (`frameworks` says why); None where it is not installed there."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits: 8x8 images of 0-16 and their labels."""
    path = digits_file()
    if path is None:  # a scikit-learn that keeps them elsewhere
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    table = np.loadtxt(path, delimiter=",")  # 64 pixels and the label a row, as `load_digits` reads it
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def digits(options: DatasetOptions) -> Data:
    images, target = digits_arrays()
    x = (images / 16.0).astype(np.float32)[..., None]
    y = target.astype(np.int32)
    train, test = _split(x, y, options.test_fraction)
    return Data(
        "digits",
        "classification",
        (8, 8, 1),
        10,
        _limit(train, options.train_examples),
        _limit(test, options.test_examples),
    )


def fashion_mnist(options: DatasetOptions, data_dir: Path) -> Data:
    folder = next(
        (
            d
            for d in (data_dir / "fashion-mnist", *FASHION_MNIST_DIRS)
            if (d / FASHION_MNIST_FILES["x_train"]).is_file()
        ),
        None,
    )
    if folder is None:
        raise DatasetError(
            "fashion_mnist is not installed: `sudo apt-get install dataset-fashion-mnist` "
            f"(Debian/Ubuntu), or put the four idx .gz files in {data_dir / 'fashion-mnist'}"
        )
    arrays = {key: _read_idx(folder / name) for key, name in FASHION_MNIST_FILES.items()}
    train = ArraySource(arrays["x_train"][..., None], arrays["y_train"].astype(np.int32))
    test = ArraySource(arrays["x_test"][..., None], arrays["y_test"].astype(np.int32))
    return Data(
        "fashion_mnist",
        "classification",
        (28, 28, 1),
        10,
        _limit(train, options.train_examples),
        _limit(test, options.test_examples),
    )


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, dims = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise DatasetError(f"{path} is not an idx file of unsigned bytes")
    shape = struct.unpack(">" + "I" * dims, raw[4 : 4 + 4 * dims])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def quadratic(options: DatasetOptions) -> Data:
    a, b, c = options.coefficients or (1.5, -2.0, 0.5)
    n_train = options.train_examples or 4096
    n_test = options.test_examples or 1024
    rng = np.random.default_rng(SPLIT_SEED)
    x = rng.uniform(-2.0, 2.0, size=(n_train + n_test, 1)).astype(np.float32)
    y = (a * x**2 + b * x + c + options.noise * rng.normal(size=x.shape)).astype(np.float32)
    return Data(
        "quadratic", "regression", (1,), 1, ArraySource(x[:n_train], y[:n_train]), ArraySource(x[n_train:], y[n_train:])
    )


def npz(path: Path, options: DatasetOptions, data_dir: Path) -> Data:
    """Arrays `x_train, y_train, x_test, y_test`, or `x, y` split by `test_fraction`."""
    if not path.is_file():
        raise DatasetError(f"npz file {path} not found")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot read {path.name}: {err}") from err
    if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        train = ArraySource(arrays["x_train"], arrays["y_train"])
        test = ArraySource(arrays["x_test"], arrays["y_test"])
    elif {"x", "y"} <= arrays.keys():
        train, test = _split(arrays["x"], arrays["y"], options.test_fraction)
    else:
        raise DatasetError(f"{path.name} must hold x_train, y_train, x_test, y_test (or x, y); it has {sorted(arrays)}")
    return _array_data(f"npz:{path.name}", train, test, options)


def _array_data(name: str, train: ArraySource, test: ArraySource, options: DatasetOptions) -> Data:
    for split, source in (("train", train), ("test", test)):
        if source.x.shape[0] != source.y.shape[0]:
            raise DatasetError(f"{name}: {split} has {source.x.shape[0]} inputs but {source.y.shape[0]} labels")
    x_train, x_test = _with_channels(train.x), _with_channels(test.x)
    if np.issubdtype(train.y.dtype, np.integer):
        classes = int(max(train.y.max(initial=0), test.y.max(initial=0))) + 1
        if train.y.min(initial=0) < 0:
            raise DatasetError(f"{name}: labels must be 0, 1, 2, ...; found {train.y.min()}")
        task: Task = "classification"
        y_train: np.ndarray = train.y.astype(np.int32).reshape(-1)
        y_test: np.ndarray = test.y.astype(np.int32).reshape(-1)
    else:
        classes, task = 1, "regression"
        y_train, y_test = (
            train.y.astype(np.float32).reshape(len(train.y), -1),
            test.y.astype(np.float32).reshape(len(test.y), -1),
        )
    if x_train.dtype != np.uint8:
        x_train, x_test = x_train.astype(np.float32), x_test.astype(np.float32)
    return Data(
        name,
        task,
        tuple(x_train.shape[1:]),
        classes,
        _limit(ArraySource(x_train, y_train), options.train_examples),
        _limit(ArraySource(x_test, y_test), options.test_examples),
    )


def _with_channels(x: np.ndarray) -> np.ndarray:
    if x.ndim == 1:
        return x[:, None]
    if x.ndim == 3:
        return x[..., None]
    return x


def image_folder(folder: Path, options: DatasetOptions, data_dir: Path) -> Data:
    """One sub-folder per class; `test_path` names a folder of the same layout, else
    `test_fraction` of the images are held out."""
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
    if not classes:
        raise DatasetError(f"image folder {folder} has no class sub-folders")
    paths, labels = _list_images(folder, classes, data_dir)
    if not paths:
        raise DatasetError(f"image folder {folder} has no images ({', '.join(IMAGE_SUFFIXES)})")
    size, channels = _image_geometry(paths[0], options)
    if options.test_path is not None:
        test_paths, test_labels = _list_images(_inside(data_dir, options.test_path), classes, data_dir)
        order = np.arange(len(paths))
        train_idx, test_src = order, (test_paths, test_labels)
    else:
        order = np.random.default_rng(SPLIT_SEED).permutation(len(paths))
        n_test = max(1, int(round(len(paths) * options.test_fraction)))
        train_idx = order[n_test:]
        test_src = ([paths[i] for i in order[:n_test]], labels[order[:n_test]])
    train = FileSource([paths[i] for i in train_idx], labels[train_idx], size, channels)
    test = FileSource(list(test_src[0]), np.asarray(test_src[1]), size, channels)
    return Data(f"images:{folder.name}", "classification", (*size, channels), len(classes), train, test)


def _list_images(folder: Path, classes: list[str], data_dir: Path) -> tuple[list[str], np.ndarray]:
    root = data_dir.resolve()
    paths, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).glob("*")):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            real = path.resolve()
            if root not in real.parents:
                raise DatasetError(f"{path.name} leads outside TOWERQ_DATA_DIR (through a symbolic link)")
            paths.append(str(real))
            labels.append(label)
    return paths, np.asarray(labels, dtype=np.int32)


def _image_geometry(path: str, options: DatasetOptions) -> tuple[tuple[int, int], int]:
    try:
        image = tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
    except tf.errors.OpError as err:
        raise DatasetError(f"cannot decode {Path(path).name}: {err.message}") from err
    height, width, channels = image.shape
    size = tuple(options.image_size) if options.image_size else (int(height), int(width))
    return (int(size[0]), int(size[1])), int(channels)


def tfrecords(pattern: str, options: DatasetOptions, data_dir: Path) -> Data:
    """TFRecord files of tf.train.Examples with `image` (PNG/JPEG bytes) and `label` (int64)."""
    files = _record_files(pattern, data_dir)
    first = next(iter(tf.data.TFRecordDataset(files[:1]).map(parse_record).take(1)), None)
    if first is None:
        raise DatasetError(f"{files[0]} holds no records")
    image, _ = first
    decoded = tf.io.decode_image(image, expand_animations=False)
    size = tuple(options.image_size) if options.image_size else tuple(int(d) for d in decoded.shape[:2])
    channels = int(decoded.shape[2])
    classes = options.classes
    if classes is None:
        raise DatasetError("tfrecord datasets need dataset_options.classes (the number of labels)")
    if options.test_path is not None:
        test_files = _record_files(options.test_path, data_dir)
        train = RecordSource(files, (size[0], size[1]), channels)
        test = RecordSource(test_files, (size[0], size[1]), channels)
    else:
        every = max(2, int(round(1 / options.test_fraction)))
        train = RecordSource(files, (size[0], size[1]), channels, (every, False))
        test = RecordSource(files, (size[0], size[1]), channels, (every, True))
    train.size = options.train_examples or _count_records(train)
    return Data(f"tfrecord:{pattern}", "classification", (size[0], size[1], channels), classes, train, test)


def _record_files(pattern: str, data_dir: Path) -> list[str]:
    root = data_dir.resolve()
    base = _inside(data_dir, pattern.split("*")[0].rsplit("/", 1)[0] if "/" in pattern else ".")
    del base  # only checked: the pattern's folder must be inside the data folder
    files = sorted(glob.glob(str(root / pattern)))
    for f in files:
        if root not in Path(f).resolve().parents:
            raise DatasetError(f"{f} leads outside TOWERQ_DATA_DIR (through a symbolic link)")
    if not files:
        raise DatasetError(f"no TFRecord files match {pattern!r} under TOWERQ_DATA_DIR ({data_dir})")
    return files


def parse_record(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_single_example(
        record,
        {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)},
    )
    return parsed["image"], parsed["label"]


def _count_records(source: RecordSource) -> int:
    return int(records(source).reduce(0, lambda n, _: n + 1).numpy())


def records(source: RecordSource) -> tf.data.Dataset:
    """The (image bytes, label) records of a source, its held-out share removed or kept."""
    records = tf.data.TFRecordDataset(source.files).map(parse_record)
    if source.holdout is None:
        return records
    every, keep_test = source.holdout
    kept = records.enumerate().filter(lambda i, _: tf.equal(i % every, 0) == keep_test)
    return kept.map(lambda _, record: record)
