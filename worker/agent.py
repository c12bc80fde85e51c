"""The worker of one GPU host: `towerq worker`.

It registers the host and its GPUs, heartbeats, and listens on its RQ queue
(`towerq:host:<name>`). A message there is a launch: `launch(job_id, attempt)` starts a
`JobRunner` thread that supervises the trainer process for as long as it trains, so the
RQ job itself takes a moment and RQ's timeouts never cut a training run short. Several
jobs run at once on one host, each in its own process on its own GPUs. While jobs wait in
the queue, it builds their requirements' environments (`worker.prepare`).

On SIGTERM/SIGINT the worker stops taking launches, stops its trainers (each checkpoints)
and puts their jobs back in the queue; signals that come while it does are said and let be.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.job import Job as RQJob
from rq.worker import WorkerStatus
from sqlalchemy import select

from service.core import keys, launches
from service.core.context import Context
from service.core.exceptions import StaleAttemptError
from service.core.lifecycle import requeue, runs_on
from service.core.models import Job, JobState
from towerq.contract.messages import MessageError, StopMessage, decode
from worker import cgroups, disk, disk_kind
from worker.attempt import AttemptRunner
from worker.attempt_disk import fate_of_attempts
from worker.host import heartbeat, host_info, mark_down, register
from worker.inventory import Inventory, detect
from worker.inventory import NoGpusError as NoGpusError  # for `towerq worker`
from worker.kinds import runner_for
from worker.launch import read_launch, sandboxed_here
from worker.notebook import why_no_sessions
from worker.outcome import Stop
from worker.phases import Phases
from worker.pool import TrainerPool
from worker.prepare import EnvPreparer
from worker.processes import is_trainer, kill_group, pid_alive
from worker.sandbox import SandboxError as SandboxError  # for `towerq worker`

log = logging.getLogger(__name__)

_current: HostAgent | None = None
RECONNECT_DELAY_S = 2.0
LOOP_JOIN_S = 10.0
"""How long the worker's stop waits for its heartbeat and control loops (each looks at the
stop every second; a heartbeat in the middle of its database write finishes it)."""
COMMANDS_POLL_S = 1.0
"""How often the thread reading RQ's command channel looks at its stop (`LaunchWorker.subscribe`)."""
SLOW_STOP_S = 10.0
"""A stop that takes longer is said in the log, phase by phase (`towerq up` and a service
manager give a worker a minute before they kill it)."""
LEFTOVER_KILL_TIMEOUT_S = 10.0


class LaunchWorker(SimpleWorker):
    """An RQ worker that runs towerq's launch messages and nothing else: anything else
    found on the host's queue (another function, other arguments, a payload that is not
    JSON) is logged, counted (`towerq:refused:<host>`) and dropped, never run."""

    stop_asked: float | None = None
    """When a signal asked it to stop (monotonic), once one did."""

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_asked = time.monotonic()
        super().request_stop(signum, frame)

    def subscribe(self) -> None:
        """RQ's command channel (its shutdown and kill commands), read by a thread that looks
        at its stop every `COMMANDS_POLL_S`, not RQ's minute: RQ's stop unsubscribes, then
        stops the thread, and with redis-py 8.2 (whose `PubSubWorkerThread.stop` waits for
        the thread) a thread that saw the unsubscription first waited out its minute for a
        new subscription: some stops (2 of 14 in a loaded test run) took a minute, and
        `towerq up` or the service manager killed the worker."""
        log.debug("worker %s: subscribing to %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ's is typed None
            sleep_time=COMMANDS_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def execute_job(self, job: RQJob, queue: Queue) -> None:
        try:
            launches.check(job)
        except launches.NotALaunch as refused:
            log.warning("refused message %s on %s: %s", job.id, queue.name, refused)
            self.connection.incr(keys.refused_count(queue.name.removeprefix(keys.host_queue(""))))
            job.delete(delete_dependents=False)
            self.set_state(WorkerStatus.IDLE)
            return
        super().execute_job(job, queue)


def launch(job_id: int, attempt: int) -> dict[str, Any]:
    """RQ entry point: start `attempt` of `job_id` on this host."""
    if _current is None:
        raise RuntimeError("towerq launch messages must be run by `towerq worker`, not a plain rq worker")
    return _current.launch(job_id, attempt)


class HostAgent:
    """Everything `towerq worker` does for one host."""

    def __init__(self, ctx: Context, name: str, inventory: Inventory | None = None) -> None:
        self.ctx = ctx
        self.name = name
        self.inventory = inventory or detect(name, ctx.settings.simulated_gpus, ctx.settings.require_gpus)
        self.sandboxed = sandboxed_here(ctx.settings)
        self.pool = TrainerPool(ctx.settings, name, ctx.settings.trainer_pool, self.sandboxed, self.inventory.simulated)
        self.runners: dict[tuple[int, int], AttemptRunner] = {}
        self.lock = threading.Lock()
        self.loops: list[threading.Thread] = []
        self.stopping = threading.Event()
        self.rq_worker: SimpleWorker | None = None
        gpus = len(self.inventory.gpus())
        self.preparer = EnvPreparer(ctx, name, gpus, self.stopping) if ctx.settings.envs_prepare else None

    # -- start and stop -------------------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT; then stop every trainer and requeue its job."""
        global _current
        _current = self
        self.start()
        try:
            self._serve_queue()
        finally:
            self._keep_stopping()
            self.shutdown()
            _current = None

    def start(self) -> None:
        with self.ctx.db.write() as session:
            register(session, self.name, self.inventory, self._info())
        log.info(
            "worker %s registered %d %s GPUs",
            self.name,
            len(self.inventory.gpus()),
            "simulated" if self.inventory.simulated else "NVIDIA",
        )
        log.info("worker %s: %s", self.name, disk_kind.described(self.ctx.settings))
        self._recover_leftovers()
        self.pool.start()
        loops = [(self._heartbeat_loop, "heartbeat"), (self._control_loop, "control")]
        if disk_kind.in_use(self.ctx.settings):
            loops.append((self._disk_loop, "disks"))
        if self.preparer is not None:
            loops.append((self.preparer.run, "envs"))
        for target, label in loops:
            loop = threading.Thread(target=target, name=f"{self.name}-{label}", daemon=True)
            loop.start()
            self.loops.append(loop)
        self._kick()

    def _keep_stopping(self) -> None:
        """From here on a signal is said, not obeyed: RQ took one more than a second after
        the first as a cold shutdown and raised SystemExit in the middle of `shutdown`, so
        jobs were not requeued or the worker hung at exit. `towerq up`'s Ctrl+C sends two
        (the terminal's SIGINT, then its own SIGTERM, later on a busy machine); the stop is
        bounded by the trainers' grace, and SIGKILL remains for whoever cannot wait."""
        if threading.current_thread() is not threading.main_thread():
            return

        def said(signum: int, frame: object) -> None:
            running = len(self.runners)  # not under self.lock: this thread may hold it now
            # `towerq up`'s Ctrl+C sends one more by design: worth a line only while jobs stop.
            log.log(
                logging.INFO if running else logging.DEBUG,
                "worker %s got %s while stopping: it goes on (%d job%s left to checkpoint and requeue)",
                self.name,
                signal.Signals(signum).name,
                running,
                "" if running == 1 else "s",
            )

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, said)

    def _info(self) -> dict[str, Any]:
        return host_info(self.sandboxed, disk_kind.in_use(self.ctx.settings), why_no_sessions(self.sandboxed))

    def shutdown(self) -> None:
        """Take no new jobs (the host is marked down first, so the scheduler stops sending
        any), stop the trainers (each checkpoints) and put their jobs back in the queue."""
        self.stopping.set()
        if self.preparer is not None:
            self.preparer.stop()  # a queued job's pip: it is built again, by that job or after a restart
        asked = self.rq_worker.stop_asked if isinstance(self.rq_worker, LaunchWorker) else None
        phases = Phases(since=asked)
        if asked is not None:
            phases.mark("the launch queue")
        # A heartbeat already past its check of `stopping` would mark the host up again after
        # this marks it down, and the scheduler would send the jobs requeued below back here
        # (a clean-clone run beside two CPU burners saw it): it ends first, within a second.
        for loop in [loop for loop in self.loops if loop.name.endswith("-heartbeat")]:
            loop.join(LOOP_JOIN_S)
        phases.mark("heartbeat")
        try:
            with self.ctx.db.write() as session:
                mark_down(session, self.name)
        except Exception:
            log.exception("could not mark %s down", self.name)
        phases.mark("marked down")
        with self.lock:
            runners = list(self.runners.values())
        self.pool.stop_warming()
        for runner in runners:
            runner.request_stop(Stop.SHUTDOWN, f"worker on {self.name} shut down")
        for runner in runners:
            runner.join()
        phases.mark(f"{len(runners)} attempt{'' if len(runners) == 1 else 's'}")
        self.pool.close()  # only now: a trainer dies with the pool's thread, taken ones too
        phases.mark("warm trainers")
        # The loops end within a second of `stopping`; they must, before the context closes:
        # a daemon thread frozen at exit inside Redis's connection pool holds its lock, and
        # the client's close at exit then waited for it forever (the worker outlived SIGTERM).
        for loop in self.loops:
            loop.join(LOOP_JOIN_S)
        phases.mark("loops")
        self._sweep_disks(None)  # the folders kept for jobs that run again: back on the host's disk
        phases.mark("disks")
        self.inventory.close()
        phases.mark("GPUs")
        if phases.total() > SLOW_STOP_S:
            log.warning("worker %s took %.1f s to stop (%s)", self.name, phases.total(), phases)
        log.info("worker %s stopped", self.name)

    def _serve_queue(self) -> None:
        queue = launches.host_queue(self.ctx.redis, self.name)
        while not self.stopping.is_set():
            self.rq_worker = LaunchWorker(
                [queue],
                connection=self.ctx.redis,
                name=f"towerq-{self.name}-{time.time_ns()}",
                serializer=launches.SERIALIZER,
            )
            try:
                self.rq_worker.work(burst=False, logging_level="WARNING", with_scheduler=False)
                return  # a signal asked it to stop
            except redis.ConnectionError as err:
                log.warning("lost Redis (%s); reconnecting in %.0fs", err, RECONNECT_DELAY_S)
                time.sleep(RECONNECT_DELAY_S)

    def _recover_leftovers(self) -> None:
        """Jobs this host was running before the worker restarted: their trainers died with
        the old worker (or are killed now, with whatever is left in their cgroups); the jobs
        go back to the queue. A job over several hosts with a rank here goes back whole: its
        ranks elsewhere see the attempt move on and stop."""
        if ended := cgroups.remove_stale():
            log.warning("ended %d cgroups of trainer attempts left by a worker that is gone", ended)
        with self.ctx.db.write() as session:
            jobs = session.scalars(
                select(Job).where(runs_on(self.name), Job.state == JobState.RUNNING).with_for_update()
            ).all()
            for job in jobs:
                here = job.host_name == self.name  # the pid is rank 0's, on its own host
                if here and job.pid is not None and pid_alive(job.pid) and is_trainer(job.pid):
                    kill_group(job.pid, timeout=LEFTOVER_KILL_TIMEOUT_S)
                requeue(session, job, f"worker on {self.name} restarted", crashed=True)
                log.warning("requeued job %s: it was running when the worker on %s stopped", job.id, self.name)
        self._sweep_disks(fate_of_attempts(self.ctx))

    # -- launching ------------------------------------------------------------------------

    def launch(self, job_id: int, attempt: int) -> dict[str, Any]:
        if self.stopping.is_set():
            raise RuntimeError("worker is shutting down")
        with self.lock:
            if (job_id, attempt) in self.runners:
                return {"status": "already running"}
        try:
            spec = read_launch(self.ctx, job_id, attempt, self.name)
        except StaleAttemptError as err:
            log.info("ignoring launch: %s", err)
            return {"status": "stale", "reason": str(err)}
        runner = runner_for(self.ctx, self.inventory, spec, self._runner_done, self.sandboxed, self.pool)
        with self.lock:
            runner.after = [r for r in self.runners.values() if set(r.launch.indices) & set(spec.indices)]
            self.runners[runner.key] = runner
        runner.start()
        return {"status": "started"}

    def _runner_done(self, runner: AttemptRunner) -> None:
        with self.lock:
            self.runners.pop(runner.key, None)

    def runner_for(self, job_id: int) -> AttemptRunner | None:
        with self.lock:
            return next((r for (j, _), r in self.runners.items() if j == job_id), None)

    # -- background loops -----------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        interval = self.ctx.settings.heartbeat_interval_s
        while not self.stopping.wait(interval):
            try:
                states = self.inventory.refresh()
                if self.stopping.is_set():
                    return
                with self.lock:
                    attempts = list(self.runners)
                with self.ctx.db.write() as session:
                    if not heartbeat(session, self.name, states, attempts, self.pool.ready()):
                        register(session, self.name, self.inventory, self._info())
            except Exception:
                log.exception("heartbeat of %s failed", self.name)

    def _disk_loop(self) -> None:
        """Every `worker.disk.SWEEP_S`: the job folders kept on their images for a next
        attempt come back once their jobs end without one (cancelled while queued)."""
        fate = fate_of_attempts(self.ctx)
        while not self.stopping.wait(disk.SWEEP_S):
            self._sweep_disks(fate)

    def _sweep_disks(self, fate: disk.Fate | None) -> None:
        """`worker.disk.sweep`: with no `fate`, every folder no attempt holds comes back."""
        disk.sweep(disk.disks_of(self.ctx.settings), fate)

    def _control_loop(self) -> None:
        """Stop requests (cancel, preemption) published for this host."""
        while not self.stopping.is_set():
            try:
                with self.ctx.redis.pubsub(ignore_subscribe_messages=True) as pubsub:  # its connection goes back
                    pubsub.subscribe(keys.host_control_channel(self.name))
                    while not self.stopping.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message is not None:
                            self._control(message["data"])
            except redis.RedisError as err:
                log.debug("control channel lost: %s", err)
                self.stopping.wait(RECONNECT_DELAY_S)

    def _control(self, data: bytes) -> None:
        try:
            message = decode(data)
        except MessageError:
            message = None
        if not isinstance(message, StopMessage):
            log.warning("bad control message: %r", data[:200])
            return
        runner = self.runner_for(message.job_id)
        if runner is not None:
            runner.look()  # the job's row says whether and why to stop; the message only wakes it

    def _kick(self) -> None:
        try:
            self.ctx.redis.lpush(keys.SCHEDULER_KICK, 1)
        except redis.RedisError:
            pass
