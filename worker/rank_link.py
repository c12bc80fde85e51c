"""What a rank of a job over several hosts needs of its worker beyond a one-host attempt.

- Meeting the other ranks before its trainer or program starts (`worker.rendezvous`), and,
  for a sandboxed rank without the network, holding its gate to them
  (`worker.trainer.tunnel`).
- Noticing that its trainer is frozen (stopped by a signal) before the ranks compute,
  which hangs the others: after the collective timeout it is killed.
- Giving a trainer that said it stopped with the others the stop's grace once rank 0 has
  recorded the stop, and no more.

The runner (`worker.attempt`) decides what each finding means for the attempt.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from service.core.context import Context
from worker import rendezvous, sandbox
from worker.launch import Launch, trainer_user
from worker.processes import read_process
from worker.trainer import tunnel


class RankLink:
    def __init__(self, ctx: Context | None, launch: Launch) -> None:
        self._ctx = ctx
        self.launch = launch
        self.gate: tunnel.Gate | None = None
        """A sandboxed rank's way to the other ranks, without the network."""
        self._frozen_since: float | None = None
        self._moved_on_since: float | None = None

    def meet(self, still_wanted: Callable[[], bool], ports: int, sandboxed: bool) -> None:
        """Wait until every rank is launched and learn where they listen (`launch.cluster`),
        with a run of `ports` ports for this one; raises `RendezvousError` when they do not
        come, or no port is free."""
        launch = self.launch
        ctx = self.ctx
        launch.cluster = rendezvous.meet(
            ctx.db,
            ctx.settings,
            launch.job_id,
            launch.attempt,
            launch.rank,
            launch.ranks,
            still_wanted,
            ports,
        )
        if sandboxed and not launch.spec.get("network"):
            self._open_gate()

    def _open_gate(self) -> None:
        """The sandboxed rank's only way out: its public port and control socket, held here
        (`worker.trainer.tunnel`); the trainer's sandbox gets no network of the host."""
        launch = self.launch
        port = int(launch.cluster[launch.rank].rpartition(":")[2])
        folder = Path(tempfile.mkdtemp(prefix="towerq-rank-"))
        try:
            secrets = rendezvous.keys(self.ctx.db, launch.job_id, launch.attempt, launch.ranks)
            self.gate = tunnel.Gate(str(folder), ("0.0.0.0", port), launch.cluster, launch.rank, secrets)
        except OSError as err:
            shutil.rmtree(folder, ignore_errors=True)
            raise rendezvous.RendezvousError(f"port {port} for rank {launch.rank}: {err}") from err
        identity = trainer_user(self.ctx.settings)
        sandbox.hand_over(folder, identity)  # the trainer's user reaches the socket: nobody else does
        sandbox.hand_over(Path(self.gate.path), identity)
        launch.gate = folder

    @property
    def ctx(self) -> Context:
        """The lab's database, where the ranks meet: a GPU host's worker has it."""
        if self._ctx is None:
            raise RuntimeError("a job over several hosts meets its ranks through the lab's database")
        return self._ctx

    def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
            self.gate = None
        if self.launch.gate is not None:
            shutil.rmtree(self.launch.gate, ignore_errors=True)

    def frozen_for(self, pids: set[int]) -> float:
        """How long one of `pids` has been stopped by a signal (SIGSTOP), 0 while none is."""
        now = time.monotonic()
        if not any((info := read_process(pid)) is not None and info.state in "Tt" for pid in pids):
            self._frozen_since = None
            return 0.0
        if self._frozen_since is None:
            self._frozen_since = now
        return now - self._frozen_since

    def grace_over(self, grace_s: float) -> bool:
        """Called while the job has moved on from an attempt whose trainer said it stopped
        with the others: whether it has had `grace_s` since this was first seen."""
        now = time.monotonic()
        if self._moved_on_since is None:
            self._moved_on_since = now
        return now - self._moved_on_since > grace_s
