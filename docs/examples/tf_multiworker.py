"""TensorFlow's MultiWorkerMirroredStrategy in a custom training loop, as a towerq command
job, one process per GPU:

    towerq run --gpus 2 --per-gpu -- python tf_multiworker.py --steps 200

towerq gives each process TF_CONFIG (the cluster of the job's processes and this one's
index), which the strategy reads. Each process sees only its own GPU. Worker 0 (the
chief) reports the job's metrics and writes its checkpoints.
"""

import argparse
import json
import os

import tensorflow as tf

import towerq

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
steps = parser.parse_args().steps

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
chief = task["index"] == 0
print("workers in sync:", strategy.num_replicas_in_sync, flush=True)

global_batch = 64 * strategy.num_replicas_in_sync
truth = tf.range(16, dtype=tf.float32) / 16


def batches():
    generator = tf.random.Generator.from_seed(task["index"])
    while True:
        x = generator.normal([64, 16])
        yield x, tf.linalg.matvec(x, truth)


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input([16]), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.05)
    step_var = tf.Variable(0, dtype=tf.int64)

folder = os.environ.get("TOWERQ_CHECKPOINT_DIR", "checkpoints")
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
manager = tf.train.CheckpointManager(checkpoint, folder if chief else os.path.join("/tmp", "ckpt"), max_to_keep=1)
checkpoint.restore(manager.latest_checkpoint)


@tf.function
def train_step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.squeeze(model(x), 1) - y)) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=(x, y)), axis=None)


data = batches()
while int(step_var.numpy()) < steps:
    x, y = next(data)
    loss = train_step(x, y)
    step_var.assign_add(1)
    step = int(step_var.numpy())
    if chief:
        towerq.report(step=step, loss=float(loss))
    if step % 50 == 0 or step == steps:
        manager.save()  # every worker takes part; only the chief's folder is the job's
