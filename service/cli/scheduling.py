"""`towerq scheduler`: a pass whenever someone asks (submit, finish, cancel) and on a timer."""

from __future__ import annotations

import gc
import logging
import threading
import time
from datetime import timedelta

import redis

from service.core import defaults, keys
from service.core.context import Context
from service.core.keyspace import KeptClaim, identity
from service.core.models import utcnow
from service.jobs import asha
from service.notifications.prometheus import record_pass
from service.notifications.webhooks import Deliverer, owe_sweep_notifications
from service.scheduler.live import LiveScheduler

log = logging.getLogger(__name__)

SWEEP_WEBHOOK_WINDOW = timedelta(days=1)
"""A sweep whose last job ended longer ago than this (while no scheduler ran) is not announced."""
KICK_WAIT_S = 5.0
"""The longest single wait for a kick: under the Redis client's 10 s socket timeout."""


def pass_gap(pass_s: float) -> float:
    """The pause after a pass before the next kick is served: as long as the pass took, up
    to `MAX_PASS_GAP_S`. Kicks that arrive meanwhile are served together, so a burst of
    submissions costs the scheduler at most half its time, while a lone kick (a job
    submitted the moment another ended) waits only as long as one pass."""
    return min(defaults.MAX_PASS_GAP_S, pass_s)


def forecast_between_passes(ctx: Context, scheduler: LiveScheduler, stop: threading.Event) -> None:
    """Go on with the replay of expected starts a slice at a time until it is over (then a
    pass is asked for, which writes them) or a pass is asked for by someone else."""
    while scheduler.forecasting and not stop.is_set() and not ctx.redis.llen(keys.SCHEDULER_KICK):
        if scheduler.advance_forecast(defaults.FORECAST_SLICE_S):
            ctx.redis.lpush(keys.SCHEDULER_KICK, 1)


def wait_for_kick(ctx: Context, until: float, stop: threading.Event) -> None:
    """Until a pass is asked for, or the timer's `until` (monotonic), or `stop`: in Redis
    waits of at most `KICK_WAIT_S`, below the client's socket timeout, which a longer
    `scheduler_interval_s` would otherwise run into (every timer pass lost to a timeout)."""
    while not stop.is_set() and (left := until - time.monotonic()) > 0:
        if ctx.redis.blpop([keys.SCHEDULER_KICK], timeout=max(0.01, min(left, KICK_WAIT_S))):
            return


def sweeps_asked(ctx: Context) -> bool:
    """Whether a worker said a setting of an adaptive sweep reached a rung since the last look
    (`keys.SWEEPS_DUE`, set with the kick that brought this pass)."""
    try:
        pipe = ctx.redis.pipeline(transaction=True)
        pipe.get(keys.SWEEPS_DUE)
        pipe.delete(keys.SWEEPS_DUE)
        return bool(pipe.execute()[0])
    except redis.RedisError:
        return False  # the look every CHECK_S still comes


def sweep_duties(ctx: Context, scheduler: LiveScheduler) -> None:
    """Stop the settings of adaptive sweeps that fell behind at a rung (`service.jobs.asha`),
    and owe each sweep that ended its `sweep.finished` webhook."""
    try:
        stopped = asha.decide(ctx.db, scheduler.executor)
        owe_sweep_notifications(ctx.db, utcnow() - SWEEP_WEBHOOK_WINDOW)
    except Exception:  # a pass must still come: said, and tried again at the next check
        log.exception("sweeps: deciding the rungs or owing the webhooks failed")
        return
    if stopped:
        log.info("adaptive sweeps: %d setting(s) stopped early", stopped)


def serve(ctx: Context, stop: threading.Event) -> None:
    """Run passes until `stop` is set: after each kick, and every `scheduler_interval_s`."""
    scheduler = LiveScheduler(ctx)
    kept = KeptClaim(ctx.settings.redis_url, identity(ctx.db), defaults.KEYSPACE_CLAIM_S)
    Deliverer(ctx, stop).start()  # webhooks, in a thread of their own: never inside a pass
    interval = ctx.settings.scheduler_interval_s
    # What is loaded by now lives as long as the process (~100k objects): out of the garbage
    # collector's full passes, each of which would walk it all (~45 ms) inside some pass.
    gc.freeze()
    log.info("scheduler started (pass every %.1fs and on demand)", interval)
    timer = time.monotonic() + interval
    sweeps_at = 0.0
    while not stop.is_set():
        kept.keep(time.monotonic())  # KeyspaceError: another service took it (after a flush): stop
        try:
            forecast_between_passes(ctx, scheduler, stop)
            owed = scheduler.replay_owed_at  # a job that came during the last replay: its pass
            wait_for_kick(ctx, timer if owed is None else min(timer, owed), stop)
            if stop.is_set():
                break
            ctx.redis.delete(keys.SCHEDULER_KICK)
        except redis.RedisError as err:
            log.warning("Redis unavailable (%s); retrying", err)
            stop.wait(min(interval, 2.0))
            continue
        started = time.monotonic()
        timer = started + interval
        try:
            report = scheduler.run_pass()
            ctx.db.checkpoint()
        except redis.RedisError as err:
            log.warning("pass skipped, Redis unavailable: %s", err)
            continue
        except Exception:
            log.exception("scheduling pass failed")
            stop.wait(1.0)
            continue
        finally:
            stop.wait(pass_gap(time.monotonic() - started))
        if report is not None:
            log.debug("pass of %.1f ms: %d waiting", report.seconds * 1000, report.waiting)
            try:
                record_pass(ctx.redis, report.seconds)
            except redis.RedisError:
                pass  # a lost sample of a histogram, not a failed pass
        if time.monotonic() >= sweeps_at or sweeps_asked(ctx):  # rungs of adaptive sweeps; webhooks of ended ones
            sweeps_at = time.monotonic() + asha.CHECK_S
            sweep_duties(ctx, scheduler)
        if report is not None and (report.placed or report.repairs.requeued or report.repairs.hosts_down):
            log.info(
                "pass: started %d, waiting %d, requeued %d, hosts down %s (%.1f ms)",
                len(report.placed),
                report.waiting,
                len(report.repairs.requeued),
                report.repairs.hosts_down or "none",
                report.seconds * 1000,
            )
