"""An attempt of a model job: towerq's own trainer (`worker.trainer`), warm from the pool
where it can be.

The trainer reads its spec from a file the worker writes (`worker.launch`) and speaks the
whole protocol of `towerq.contract.events`: `started` (once an attempt; a resume reads
its metrics log back), `checkpoint`, `stopped` (it checkpointed on SIGTERM, with the
other ranks of a job over several hosts), `done` and `error`, besides the metric, eval
and log lines any attempt has. The attempt's life is `worker.attempt`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from service.core.context import Context
from service.core.settings import Settings
from towerq.contract import events
from towerq.contract.attempts import AttemptChannel
from worker.attempt import AttemptRunner, Starter
from worker.cgroups import AttemptGroup
from worker.inventory import Inventory
from worker.launch import Launch, start_trainer, trainer_command, trainer_environment, write_trainer_spec
from worker.pace import pause_cycle
from worker.pool import TrainerPool, WarmTrainer, hand_over
from worker.pool import end as end_warm
from worker.processes import descendants


class JobRunner(AttemptRunner):
    def __init__(
        self,
        ctx: Context | None,
        inventory: Inventory,
        launch: Launch,
        on_exit: Callable[[Any], None],
        sandboxed: bool = False,
        pool: TrainerPool | None = None,
        *,
        channel: AttemptChannel | None = None,
        settings: Settings | None = None,
    ) -> None:
        super().__init__(ctx, inventory, launch, on_exit, sandboxed, channel=channel, settings=settings)
        self.pool = pool
        self.owes_refill = False
        """The trainer came warm from the pool (`worker.pool`), which has not yet been told to
        warm the next one."""
        self.started_once = False
        """A valid `started` line came: later ones are the trainer's word only, and ignored."""
        self.warm: WarmTrainer | None = None
        """The warm trainer this attempt took, if it took one."""
        hyper = launch.spec.get("hyperparameters") or {}
        self.sink.paces.cycle = pause_cycle(hyper.get("eval_every"), hyper.get("checkpoint_every"))

    def _prepare(self) -> Starter:
        settings = self.settings
        env = trainer_environment(self.launch.indices, settings.trainer_env_pass)
        # a rank sets up its cluster before any TensorFlow op: never a warm trainer
        warm = None
        if self.pool is not None and self.launch.ranks < 2:  # its disk, if any, takes the warm trainer's
            warm = self.pool.take(self.launch, self.artifacts, self.folder_disk.held)
        self.warm = warm
        try:
            spec_path = write_trainer_spec(self.launch, settings, self.artifacts, self.sandboxed)
        except Exception:
            if warm is not None:
                end_warm(warm.process)
            raise

        def start(group: AttemptGroup) -> tuple[subprocess.Popen[bytes], dict[str, str], str]:
            if warm is not None:
                group.adopt({warm.process.pid} | descendants(warm.process.pid))  # before it runs user code
                if hand_over(warm, spec_path, env):
                    self.owes_refill = True
                    return warm.process, env, "in a warm trainer from the pool"
            command = trainer_command(self.launch, settings, spec_path, self.sandboxed)
            return start_trainer(command, spec_path.parent, env, group), env, "in a new trainer (cold start)"

        return start

    def _event(self, event: events.TrainerEvent | events.Refused) -> None:
        match event:
            case events.Started():
                self._on_started(event)
            case events.Checkpoint():
                self.sink.log("info", f"checkpoint at step {event.step}: {event.path}")
                self._flush()  # what led up to a checkpoint goes to the database at once
            case events.Done():
                self.outcome.done = event.model_dump()
            case events.Error():
                self.outcome.error = {"kind": event.kind, "message": event.message}
                self.sink.log("error", event.message or event.kind)  # as the job's error
                if self.outcome.peer_lost and self.outcome.stop is None:
                    self._record_now()  # the gang is lost: back in the queue without waiting for the exit
            case events.Stopped():
                self.outcome.agreed_stop = True
                self.sink.last_words = True
                self.sink.log("info", f"trainer stopped at step {event.step} after a checkpoint")
            case _:
                super()._event(event)
                if isinstance(event, events.Metric):
                    self._refill()

    def _on_started(self, started: events.Started) -> None:
        self._note_pids()  # the pid the line names is the trainer's word: not taken
        if self.started_once:  # a resume reads the trainer's metrics log back: once an attempt
            self.sink.log("warning", "a second 'started' line was ignored: an attempt starts once")
            return
        self.started_once = True
        if not self.chief:
            return
        if started.resumed_from_step is not None:
            self.sink.resume(started.resumed_from_step)
        self._flush(started.job_fields())

    def _refill(self) -> None:
        """This job is training (or over): the pool may warm the next trainer."""
        if self.owes_refill and self.pool is not None:
            self.owes_refill = False
            self.pool.refill()

    def _after(self) -> None:
        self._refill()
        if self.warm is not None and self.pool is not None:
            self.pool.release(self.warm)
