"""An attempt's job folder on a disk of its own (`TOWERQ_JOB_DISK`, `worker.disk`): held
before the worker first writes into the folder, filled once the attempt's files are there,
and closed once its processes are gone (back onto the host's disk, or kept on its image for
the job's next attempt)."""

from __future__ import annotations

from pathlib import Path

from service.core.context import Context
from service.core.lifecycle import attempt_fate
from service.core.settings import Settings
from worker import disk, disk_kind
from worker.folder import size_words
from worker.outcome import Outcome, Stop
from worker.relay import MetricSink


def fate_of_attempts(ctx: Context) -> disk.Fate:
    """What became of a job since one of its attempts (`worker.disk.settle`), as the lab's
    database says."""

    def fate(job_id: int, attempt: int) -> str:
        with ctx.db.read() as session:
            return attempt_fate(session, job_id, attempt)

    return fate


class AttemptDisk:
    """The job folder's disk for one attempt, while it holds one (`held`)."""

    def __init__(self, folder: Path, settings: Settings, key: tuple[int, int], sink: MetricSink) -> None:
        self.folder, self.settings, self.key, self.sink = folder, settings, key, sink
        self.held: disk.JobDisk | None = None

    def hold(self, ctx: Context | None, ranks: int) -> None:
        """Before the worker first writes into the job's folder, the attempt holds its disk
        (`worker.disk.JobDisk.hold`: an image the last attempt kept is taken as it is; one a
        dead worker left comes back first). A job over several hosts keeps the measure (its
        ranks share the folder), as does a Slurm node's runner (`ctx` None: no database to ask
        what ran since)."""
        if ranks > 1 or ctx is None or not disk_kind.in_use(self.settings):
            return
        self.held = disk.hold_for(self.folder, self.settings, self.key, fate_of_attempts(ctx))
        if self.held.dropped is not None:
            self.sink.log("warning", self.held.dropped)

    def fill(self) -> None:
        """The folder (made by the attempt's `_prepare`) goes on a disk of its own, unless it
        came on a warm trainer's (`worker.pool`)."""
        if self.held is not None and not self.held.mounted:
            disk.fill_for(self.held, self.settings)

    def close(self, outcome: Outcome) -> None:
        """The attempt's processes are gone: its folder comes back onto the host's disk, or,
        for a job stopped to run again (preempted, resized), stays on its image for its next
        attempt. A process that failed on a full disk fails the job, naming the limit (a
        retry would only fill it again). Once: a closed disk is neither full nor closed again."""
        held = self.held
        if held is None:
            return
        if held.full() and outcome.returncode not in (0, None):
            said = (
                f"its folder's disk is full ({size_words(held.size)}, TOWERQ_JOB_FOLDER_MAX_BYTES): "
                "what it wrote past that failed"
            )
            self.sink.log("error", said)
            if outcome.stop is None:
                outcome.stop, outcome.stop_message = Stop.FOLDER_FULL, f"failed: {said}"
        keep = outcome.stop == Stop.PREEMPT and disk.keeps_between_attempts(self.settings)
        if (failed := held.close(keep)) is not None:
            self.sink.log(
                "error",
                f"its folder stays on its disk image for now ({failed}); it is served from there and comes back "
                "onto the host's disk at its next attempt on this host or at its worker's next sweep",
            )
