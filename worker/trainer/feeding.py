"""The input pipeline: global batches of a dataset, in an order that is a pure function.

The order of training examples is a pure function of (seed, dataset size, global batch):
epoch e visits the examples in the permutation `stateless_shuffle(range(n), [seed, e])`,
and step s takes positions `s*B .. s*B+B-1` of that endless sequence. So a k-tower job
and a one-device job with the same global batch see the same examples in the same order,
and a resumed job starts exactly at the step after its checkpoint, with no iterator state
to save.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from worker.trainer.datasets import ArraySource, Data, FileSource, RecordSource, records

MAX_EPOCHS = 2**40


def train_batches(data: Data, global_batch: int, seed: int, start_step: int, steps: int) -> tf.data.Dataset:
    """Global batches for steps `start_step .. steps-1` (see the module docstring)."""
    source = data.train
    if isinstance(source, RecordSource):
        shuffled = records(source).shuffle(10_000, seed=seed, reshuffle_each_iteration=True).repeat()
        batches = shuffled.batch(global_batch, drop_remainder=True).skip(start_step)
        return (
            batches.take(steps - start_step)
            .map(_decoder(source, batched=True), num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(2)
        )
    n = source.size
    seed_t = tf.constant(seed, tf.int64)

    def permutation(epoch: tf.Tensor) -> tf.Tensor:
        return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=tf.stack([seed_t, epoch]))

    first = start_step * global_batch
    first_epoch, offset = first // n, first % n

    def epoch_order(epoch: tf.Tensor) -> tf.Tensor:
        # The first epoch of a resumed run starts where the checkpointed run left it.
        return permutation(epoch)[tf.where(tf.equal(epoch, first_epoch), offset, 0) :]

    epochs = tf.data.Dataset.range(first_epoch, MAX_EPOCHS).map(epoch_order)
    batches = epochs.rebatch(global_batch, drop_remainder=True).take(steps - start_step)
    return batches.map(_gatherer(source), num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


def eval_batches(data: Data, batch: int) -> tf.data.Dataset:
    """The held-out split, in order, in batches of `batch` (the last one may be smaller)."""
    source = data.test
    if isinstance(source, RecordSource):
        return records(source).batch(batch).map(_decoder(source, batched=True)).prefetch(2)
    indices = tf.data.Dataset.range(source.size).batch(batch)
    return indices.map(_gatherer(source)).prefetch(2)


def _gatherer(source: ArraySource | FileSource) -> Any:
    if isinstance(source, FileSource):
        paths = tf.constant(source.paths)
        labels = tf.constant(source.labels)
        decode = _decoder(source, batched=False)
        return lambda idx: (
            tf.map_fn(decode, tf.gather(paths, idx), fn_output_signature=tf.float32),
            tf.gather(labels, idx),
        )
    x = tf.constant(source.x)
    y = tf.constant(source.y)
    scale = 1.0 / 255.0 if source.x.dtype == np.uint8 else None

    def gather(idx: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batch = tf.gather(x, idx)
        batch = tf.cast(batch, tf.float32) * scale if scale is not None else batch
        return batch, tf.gather(y, idx)

    return gather


def _decoder(source: FileSource | RecordSource, batched: bool) -> Any:
    size, channels = source.image_size, source.channels

    def decode_image(data: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32), size)
        return tf.ensure_shape(image / 255.0, (*size, channels))

    if isinstance(source, FileSource):
        return lambda path: decode_image(tf.io.read_file(path))
    del batched
    return lambda images, labels: (
        tf.map_fn(decode_image, images, fn_output_signature=tf.float32),
        tf.cast(labels, tf.int32),
    )
