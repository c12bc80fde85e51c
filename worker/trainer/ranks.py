"""One job over several hosts: the trainer's side of the gang.

Each host runs one trainer (a rank) with its towers, as a one-host job does. The ranks are
joined by TensorFlow's collective ops over gRPC (`MultiWorkerMirroredStrategy` sets up the
cluster from `TF_CONFIG`; RING on CPUs), and each step's tower-averaged gradients are
all-reduced across them before the one update, so every rank applies the same update and
holds the same weights. What crosses the network each step is one packed vector: the
gradients weighted by the rank's share of the global batch, the loss, the number correct,
the user metrics' sums and the batch-norm moving statistics.

- The global batch is `batch_size` × all towers; rank r feeds its towers slice r of the
  global batch every step (the order is the one-host order, `feeding`), so 2 hosts × 2
  towers train step by step like one device on the whole batch.
- Batch norm over several hosts normalises by the host's part of the batch; the moving
  statistics are averaged over the hosts (the between-host part of the variance is left
  out). Within a host it is as on one host.
- Rank 0's weights, optimizer state and step are broadcast to every rank before the first
  step (after it restored the checkpoint), so the ranks start identical whatever they read.
- A stop (SIGTERM) is agreed: after each call of steps the ranks all-reduce their stop
  flags, so all stop after the same step and rank 0 writes the one checkpoint.
- Nothing hangs: every collective has a timeout (`collective_timeout_s`); a peer that is
  killed fails the next collective at once (`UnavailableError`), one frozen or stalled
  fails it when the timeout runs out. The trainer then says `peer_lost` and exits; the
  worker puts the job back in the queue.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from towerq.contract.runtime import RuntimeSpec
from worker.trainer import tunnel
from worker.trainer.errors import TrainerError

GROUP_KEY = 1
STEP_KEY, BROADCAST_KEY, STOP_KEY = 1, 2, 3
"""The collectives' instance keys: the same op on every rank meets under the same key."""
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)
"""What a collective raises when a peer is gone, frozen or too slow."""


class PeerLostError(TrainerError):
    """Another rank of the job died, froze or stalled past the collective timeout."""

    kind = "peer_lost"


@dataclass
class Ranks:
    """This trainer's place in the gang."""

    rank: int
    size: int
    share: float
    """This rank's part of the global batch (its examples / all examples)."""
    timeout_s: float
    start_timeout_s: float

    @property
    def chief(self) -> bool:
        return self.rank == 0

    def step_reduce(
        self,
        grads: list[tf.Tensor],
        loss: tf.Tensor,
        correct: tf.Tensor,
        state: list[tf.Tensor],
        sums: dict[str, tf.Tensor],
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, list[tf.Tensor], dict[str, tf.Tensor]]:
        """The whole gang's gradients, loss, number correct, moving statistics and metric
        sums, from this rank's (weighted by batch share where an average, summed where a
        count), in one collective."""
        floating = [i for i, s in enumerate(state) if s.dtype.is_floating]
        averaged = [*grads, loss, *(state[i] for i in floating)]
        counted = [correct, *sums.values()]
        parts = [tf.cast(t, tf.float32) * self.share for t in averaged] + [tf.cast(t, tf.float32) for t in counted]
        reduced = self._unpack(self.all_reduce(parts, STEP_KEY, self.timeout_s), parts)
        restored = [tf.cast(r, t.dtype) for r, t in zip(reduced, averaged + counted, strict=True)]
        n, a = len(grads), len(averaged)
        new_grads, new_loss = restored[:n], restored[n]
        new_state = list(state)
        for j, i in enumerate(floating):
            new_state[i] = restored[n + 1 + j]
        new_correct = restored[a]
        new_sums = dict(zip(sums, restored[a + 1 :], strict=True))
        return new_grads, new_loss, new_correct, new_state, new_sums

    def broadcast(self, variables: list[tf.Variable]) -> None:
        """Rank 0's values of `variables` on every rank (float64 carries float32 and the
        integer counters exactly); PeerLostError when a rank does not come."""
        values = [tf.cast(tf.convert_to_tensor(v), tf.float64) for v in variables]
        mine = values if self.chief else [tf.zeros_like(v) for v in values]
        with self.peers():
            reduced = self._unpack(self.all_reduce(mine, BROADCAST_KEY, self.start_timeout_s), values)
        for variable, value in zip(variables, reduced, strict=True):
            variable.assign(tf.cast(value, variable.dtype))

    def any_stops(self, mine: bool) -> bool:
        """Whether any rank was asked to stop (every rank gets the same answer)."""
        flag = tf.constant([1.0 if mine else 0.0])
        with self.peers():
            return bool(self.all_reduce([flag], STOP_KEY, self.timeout_s).numpy()[0] > 0)

    @contextmanager
    def peers(self) -> Iterator[None]:
        """What a collective raises when a peer is gone, frozen or too slow, as PeerLostError."""
        try:
            yield
        except PEER_ERRORS as err:
            raise PeerLostError(
                f"rank {self.rank}: another rank of this job stopped answering ({_first_line(err)})"
            ) from err

    def all_reduce(self, tensors: list[tf.Tensor], key: int, timeout_s: float) -> tf.Tensor:
        flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0) if tensors else tf.zeros([0])
        return collective_ops.all_reduce_v2(
            flat,
            group_size=self.size,
            group_key=GROUP_KEY,
            instance_key=key,
            merge_op="Add",
            final_op="Id",
            communication_hint="ring",
            timeout=timeout_s,
        )

    @staticmethod
    def _unpack(flat: tf.Tensor, like: list[tf.Tensor]) -> list[tf.Tensor]:
        pieces = tf.split(flat, [t.shape.num_elements() for t in like]) if like else []
        return [tf.reshape(p, t.shape) for p, t in zip(pieces, like, strict=True)]


def connect(runtime: RuntimeSpec) -> Ranks | None:
    """Join the gang this runtime names (None for a one-host job); must run after the
    devices are configured and before any other TensorFlow op. Returns once every rank has
    joined (or raises PeerLostError when they do not within the start timeout)."""
    if len(runtime.cluster) < 2:
        return None
    cluster = list(runtime.cluster)
    if runtime.rank_tunnel is not None:  # sandboxed: no network but through the worker
        try:
            cluster = tunnel.open_inside(runtime.rank_tunnel, runtime.rank, len(cluster))
        except OSError as err:
            raise PeerLostError(f"rank {runtime.rank} could not open its way to the other ranks: {err}") from err
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": runtime.rank}}
    )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=runtime.collective_timeout_s,
    )
    handler = signal.getsignal(signal.SIGTERM)
    try:
        tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except (*PEER_ERRORS, tf.errors.UnknownError) as err:  # UnknownError: its port was taken
        raise PeerLostError(f"rank {runtime.rank} could not join the other ranks: {_first_line(err)}") from err
    finally:
        signal.signal(signal.SIGTERM, handler)  # the gRPC server took SIGTERM: a stop must still checkpoint
    return Ranks(
        rank=runtime.rank,
        size=len(runtime.cluster),
        share=1 / len(runtime.cluster),  # whole hosts of one size: equal towers on every rank
        timeout_s=runtime.collective_timeout_s,
        start_timeout_s=max(runtime.collective_timeout_s, START_TIMEOUT_S),
    )


START_TIMEOUT_S = 300.0
"""How long the first collective (rank 0's weights to all) waits for every rank: each
loads its data and builds its model first, at its own pace."""


def _first_line(err: Any) -> str:
    text = getattr(err, "message", None) or str(err)
    return text.strip().splitlines()[0][:300] if text.strip() else type(err).__name__
