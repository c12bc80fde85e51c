"""The scheduling policy: a pure function from (queue, free capacity, usage, now) to
placements. The live scheduler and the trace simulator call the same `schedule`.

Policies:

- `fifo`: strict submit order; nothing passes a blocked job.
- `fit-first`: submit order, start anything that fits, no reservations (big jobs can starve).
- `towerq`: the real one. A job's rank is its priority class, minus one class for every
  `aging_s` it has waited, plus its owner's fair-share term (between 0 and 1: 0 for a user
  who used nothing lately, 1/2 for one who used exactly their share, towards 1 for one who
  used everything). Jobs start in rank order wherever they fit (the tightest host first).
  The longest-waiting job, once it has waited `reserve_after_s`, is the head: if it cannot
  start, its GPUs are reserved from the earliest time they free up (EASY backfill), and a
  later job may use a reserved GPU only if its time limit ends before that time.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable

from service.scheduler.capacity import FreeGpus
from service.scheduler.types import (
    EPSILON,
    INFINITY,
    Cluster,
    Decision,
    FairShare,
    Pending,
    Placement,
    Policy,
    PolicyConfig,
    QueuedJob,
    Reason,
    Wait,
)


def schedule(
    queued: Iterable[QueuedJob],
    cluster: Cluster,
    fair_share: FairShare,
    now: float,
    config: PolicyConfig,
) -> Decision:
    """Decide which queued jobs start now, where, and why the others wait."""
    scheduling_pass = _Pass(list(queued), cluster, fair_share, now, config)
    return scheduling_pass.run()


class _Pass:
    def __init__(
        self,
        queued: list[QueuedJob],
        cluster: Cluster,
        fair_share: FairShare,
        now: float,
        config: PolicyConfig,
    ) -> None:
        self.queued = queued
        self.cluster = cluster
        self.fair_share = fair_share
        self.now = now
        self.config = config
        self.free = FreeGpus(cluster)
        self.decision = Decision()
        self.position = 0
        self.user_load: dict[str, float] = defaultdict(float)
        for running in cluster.running:
            self.user_load[running.user] += running.gpu_load
        self.blocker: QueuedJob | None = None
        self.hosts_seen = {h.name for h in cluster.hosts}

    def run(self) -> Decision:
        if self.config.policy == Policy.TOWERQ:
            self._run_towerq()
        else:
            for job in sorted(self.queued, key=lambda j: (j.submitted, j.id)):
                self._consider(job, strict=self.config.policy == Policy.FIFO)
        return self.decision

    # -- towerq -----------------------------------------------------------------------------

    def _run_towerq(self) -> None:
        head = self._reservation_candidates()
        for job in head:
            self._consider(job, strict=False, reserve=True)
        head_ids = {job.id for job in head}
        for job in self._fair_share_order(j for j in self.queued if j.id not in head_ids):
            self._consider(job, strict=False)

    def _reservation_candidates(self) -> list[QueuedJob]:
        after = self.config.reserve_after_s
        after = self.config.aging_s if after is None else after
        oldest = [j for j in self.queued if self.now - j.submitted >= after]
        oldest.sort(key=lambda j: (j.submitted, j.id))
        return oldest[: self.config.max_reservations]

    def _fair_share_order(self, jobs: Iterable[QueuedJob]) -> Iterable[QueuedJob]:
        """Jobs by rank; a user's rank term is updated as their jobs are started, so one
        user does not take every GPU that frees up in a pass."""
        per_user: dict[str, list[tuple[float, float, int, QueuedJob]]] = defaultdict(list)
        for job in jobs:
            base = job.priority - (self.now - job.submitted) / self.config.aging_s
            per_user[job.user].append((base, job.submitted, job.id, job))
        shares = _FairShareTerms(self.fair_share, self.user_load, per_user.keys())
        heap = []
        for user, user_jobs in per_user.items():
            user_jobs.sort(key=lambda t: (t[0], t[1], t[2]))
            base, submitted, job_id, _ = user_jobs[0]
            heap.append((base + shares.term(user), submitted, job_id, user, 0))
        heapq.heapify(heap)
        while heap:
            _, _, _, user, k = heapq.heappop(heap)
            user_jobs = per_user[user]
            job = user_jobs[k][3]
            yield job
            if k + 1 < len(user_jobs):
                base, submitted, job_id, _ = user_jobs[k + 1]
                heapq.heappush(heap, (base + shares.term(user), submitted, job_id, user, k + 1))

    # -- one job ----------------------------------------------------------------------------

    def _consider(self, job: QueuedJob, strict: bool, reserve: bool = False) -> None:
        self.position += 1
        if strict and self.blocker is not None:
            self._wait(job, Reason(Wait.BEHIND, (self.blocker.id,)))
            return
        reason = self._cannot_run(job)
        if reason is None:
            end = self.now + job.limit_s if job.limit_s is not None else INFINITY
            slots = self.free.fit(job, end) if self.free.any_free else None
            if slots is not None:
                self._place(job, slots)
                return
            reason = self._why_no_fit(job)
        reserved = self._reserve(job) if reserve and reason.kind != Wait.USER_LIMIT else None
        if strict:
            self.blocker = job
        self._wait(job, reason, reserved)

    def _cannot_run(self, job: QueuedJob) -> Reason | None:
        if job.host is not None and job.host not in self.hosts_seen:
            return Reason(Wait.HOST_DOWN, (job.host,))
        if job.indices is not None and job.host is not None:
            unusable = self.free.hosts[job.host].unusable
            bad = tuple(i for i in job.indices if i in unusable or i >= len(self.free.free[job.host]))
            if bad:
                return Reason(Wait.GPU_UNUSABLE, (job.host, bad))
        limit = self.fair_share.limit(job.user)
        if limit is not None:
            used = self.user_load[job.user]
            if used + job.gpus * job.fraction > limit + EPSILON:
                return Reason(Wait.USER_LIMIT, (job.user, used, limit))
        return None

    def _place(self, job: QueuedJob, slots: list[tuple[str, tuple[int, ...]]]) -> None:
        self.free.take(slots, job.fraction)
        self.user_load[job.user] += job.gpus * job.fraction
        self.decision.placements.append(Placement(job.id, slots))
        self.position -= 1

    def _wait(self, job: QueuedJob, reason: Reason | None, reserved: float | None = None) -> None:
        if not self.config.explain:
            reason = None
        self.decision.pending.append(Pending(job.id, self.position, reason, reserved))

    def _reserve(self, job: QueuedJob) -> float | None:
        found = self.free.earliest(job, self.now)
        if found is None:
            return None
        start, slots = found
        self.free.hold(job.id, slots, start)
        return start

    def _why_no_fit(self, job: QueuedJob) -> Reason:
        if not self.config.explain:
            return Reason(Wait.NO_FIT)
        found = self.free.earliest(job, self.now)
        if found is None:
            return Reason(Wait.NO_FIT, (job.gpus, job.fraction, INFINITY))
        start, slots = found
        host, indices = slots[0]
        holds = self.free.holds.get(host, {})
        reserved_for = {holds[i].job_id for i in indices if i in holds and holds[i].job_id != job.id}
        if reserved_for:
            return Reason(
                Wait.RESERVED,
                (host, indices, min(reserved_for), holds[indices[0]].start if indices[0] in holds else start),
            )
        holders = tuple(sorted({r.id for r in self.free.running_on[host] if set(r.indices) & set(indices)}))
        if job.indices is not None or holders:
            return Reason(Wait.GPUS_BUSY, (host, indices, holders, start))
        return Reason(Wait.NO_FIT, (job.gpus, job.fraction, start))


class _FairShareTerms:
    """Each user's fair-share term in [0, 1): 1 - 2**-(used part / owed part), where the
    used part counts decayed GPU-seconds plus the GPUs held now, and the owed part is the
    user's share among the users present."""

    def __init__(self, fair_share: FairShare, load: dict[str, float], queued_users: Iterable[str]) -> None:
        self.fair_share = fair_share
        self.load = load
        users = set(queued_users) | {u for u, g in load.items() if g > 0}
        self.total_share = sum(fair_share.share(u) for u in users) or 1.0
        self.total_usage = sum(fair_share.usage.get(u, 0.0) for u in users)
        self.total_load = sum(load.values())

    def term(self, user: str) -> float:
        owed = self.fair_share.share(user) / self.total_share
        used_history = self.fair_share.usage.get(user, 0.0) / self.total_usage if self.total_usage > 0 else 0.0
        used_now = self.load[user] / self.total_load if self.total_load > 0 else 0.0
        used = (used_history + used_now) / 2
        return 1.0 - 2.0 ** (-used / owed) if owed > 0 else 1.0
