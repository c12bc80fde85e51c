"""The order the policy considers queued jobs in: fair share, priority, size, length and
time limit, each as a rank term; `FairShareTerms` tracks who is owed what during a pass."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator

from service.scheduler.outlook import expected_end
from service.scheduler.types import (
    FairShare,
    PolicyConfig,
    QueuedJob,
    RunningJob,
)

DEFAULT_RUN_S = 3600.0
"""Expected run time of a job whose owner has no history yet (for fair share only)."""


DEMOTED_CLASS = 1.0
"""Time slicing: rank a job loses once it has had its first `demote_after_gpu_s` (a whole
class: fresh work of its priority goes first, as in least-attained-service queues;
aging still lifts it). `SERVED_CLASS` ranks it lower still the more it has been served."""


SERVED_CLASS = DEMOTED_CLASS / 5
"""Time slicing, past the first slice: the further rank a job loses per doubling of the
GPU time it has had beyond it, at most 5 doublings (32 slices: one more class). So among
the jobs past their slice the least served go first, as in Tiresias's multi-level least
attained service: run times are heavy-tailed, so the less a job has run the sooner it is
likely to end, and a job stopped after a day no longer ranks with one stopped after an
hour. Not for a job that needs whole hosts (`whole_host`): its GPU time grows as fast as
its width, and it already waits for every GPU of a host at once. One fifth so that 5
doublings make one class. (Chosen on the trace families' seeds from 21 on: long-overload
41-80 mean avg JCT / fit-first 0.817 -> 0.599 and misses 2 -> 0; bursty 21-40 worst max
wait 1.048 -> 0.812; flood and fractional within 0.005; the Philly file with slicing
0.529 / 0.847 -> 0.516 / 0.760. Without the whole-host exception bursty's worst wait grew
to 1.177, and with a tenth per doubling to 1.347. Then on the seeds
held out, 11-20 of each family: both bars met on 39 of 40, against 37; the Philly
bootstraps 11-30, 15 of 20 against 14.)"""


MAX_SERVED_DOUBLINGS = 5.0


SIZE_CLASS = 0.3
"""Rank a fresh job loses per doubling of its GPU count (fading to 0 over `reserve_after_s`)."""


LENGTH_CLASS = 0.05
"""Rank a job loses per doubling of its owner's median run time past an hour, and gains per
halving below it (at most 3 either way): shortest expected job first lowers the mean
completion time, and the owner's recent run times are the only length the scheduler
knows. It does not fade, so among a user's jobs the older always goes first, and it is
small beside aging: the most it costs (0.15 of a class) is 0.6 day of waiting at the
default `aging_s`. (Chosen on the Philly file and its bootstraps 1-10, where 0.1 and a
fading variant met the bars on fewer. On bootstraps 1-30, before the simulator refreshed
queued jobs' medians, 0.05 met both bars on 15, 0.1 and 0.2 on 14, and 0 on 11.)"""


LIMIT_CLASS = 0.3
"""Rank a job loses per doubling of its own time limit past an hour, and gains per halving
below it (at most 3 either way); a job without a limit ranks as one with the longest.
A limit is a promise (the job is stopped there), so it ranks a job as firmly as its size
does: a doubling of either doubles the GPU-time the job may take, hence SIZE_CLASS's 0.3.
No limit ranks like the longest, so giving one never costs a job rank, and a tight one
gains it (as Slurm's backfill rewards accurate limits). It does not fade: aging alone
lifts long jobs. (The owner's median, a weak guess, did worse with weights this large;
a limit is what a user knows of the job itself. On bootstraps 1-40 with limits of run
time × U(1, 4), mean avg JCT / fit-first and both bars met: 0.05: 0.661, 24; 0.15: 0.634,
26; 0.3: 0.629, 25; 0.5: 0.628, 28. The gain levels off by 0.3, and counts move by ±2 from
one change to the next, so 0.3 stands on its reason above, not on these. A fading
variant, like the size term's, met both on 23.)"""


LENGTH_REFERENCE_S = 3600.0


MAX_DOUBLINGS = 3.0


def _length_doublings(seconds: float | None) -> float:
    """-3 (8 minutes or less) to 3 (8 hours or more); 0 (an hour) when unknown."""
    if seconds is None:
        return 0.0
    return max(-MAX_DOUBLINGS, min(MAX_DOUBLINGS, math.log2(max(seconds, 1.0) / LENGTH_REFERENCE_S)))


def _length_rank(job: QueuedJob) -> float:
    """The length term: the job's time limit (none: the longest) and its owner's median
    run time, never taken above the limit."""
    limit = MAX_DOUBLINGS if job.limit_s is None else _length_doublings(job.limit_s)
    return LIMIT_CLASS * limit + LENGTH_CLASS * _length_doublings(job.likely_run_s)


def base_rank(
    job: QueuedJob,
    now: float,
    config: PolicyConfig,
    whole_host: int,
    fixed: dict[tuple[int, float, float | None, float | None], _Fixed] | None = None,
) -> float:
    """The job's rank before fair share (lower goes first); `whole_host`: the GPUs of the
    largest host (a job of that many or more needs whole hosts). `fixed`: the terms that do
    not depend on the wait, by what they depend on, kept across the jobs of one pass (a
    long queue holds few sizes, limits and owners' medians)."""
    waited = now - job.submitted
    if not waited > 0.0:  # a submit clock ahead of the scheduler's counts as no wait
        waited = 0.0
    rank = job.priority - waited / config.aging_s
    key = (job.gpu_count, job.served_gpu_s, job.limit_s, job.typical_s)
    terms = fixed.get(key) if fixed is not None else None
    if terms is None:
        terms = _fixed_terms(job, config, whole_host)
        if fixed is not None:
            fixed[key] = terms
    size, demoted, served, length = terms
    if job.gpu_count > 1 and config.reserve_after_s > 0:
        fresh = 1.0 - waited / config.reserve_after_s  # the size term fades to 0
        if fresh > 0.0:
            rank += size * fresh
    if demoted:
        rank += DEMOTED_CLASS
        if served is not None:
            rank += served
    return rank + length


_Fixed = tuple[float, bool, float | None, float]
"""`base_rank`'s terms that do not depend on the wait: the size term before it fades, whether
the job is demoted, its served term (None: none), its length term."""


def _fixed_terms(job: QueuedJob, config: PolicyConfig, whole_host: int) -> _Fixed:
    size = SIZE_CLASS * math.log2(job.gpu_count) if job.gpu_count > 1 else 0.0
    demoted = 0 < config.demote_after_gpu_s <= job.served_gpu_s
    served = None
    if demoted and job.gpu_count < whole_host:
        served = SERVED_CLASS * min(MAX_SERVED_DOUBLINGS, math.log2(job.served_gpu_s / config.demote_after_gpu_s))
    return size, demoted, served, _length_rank(job)


class RankOrder:
    """Jobs by rank. Within an account (a user in a group) the order never changes (waiting
    lifts all alike), so each account's jobs are sorted once and merged by a heap keyed on
    the account's current term, which `terms.started` raises as the pass starts its jobs (an
    iteration goes on from the first job not yet given). Once no job can start, `rest` gives
    the rest of the order at once. `ranks`: each job's `base_rank` by id, for later sorts in
    the same pass."""

    def __init__(
        self, jobs: list[QueuedJob], terms: FairShareTerms, now: float, config: PolicyConfig, whole_host: int
    ) -> None:
        self.terms = terms
        self.ranks: dict[int, float] = {}
        self._accounts: dict[Account, list[tuple[float, float, int, QueuedJob]]] = defaultdict(list)
        fixed: dict[tuple[int, float, float | None, float | None], _Fixed] = {}
        for job in jobs:
            self.ranks[job.id] = rank = base_rank(job, now, config, whole_host, fixed)
            self._accounts[(job.user, job.group)].append((rank, job.submitted, job.id, job))
        for account_jobs in self._accounts.values():
            account_jobs.sort()  # job ids are unique: two entries never compare their jobs
        self._next = dict.fromkeys(self._accounts, 0)
        """Each account's first job not yet given."""

    def __iter__(self) -> Iterator[QueuedJob]:
        term = self.terms.term
        heap = []
        for account, k in self._next.items():  # from where an earlier iteration stopped, as a generator
            account_jobs = self._accounts[account]
            if k < len(account_jobs):
                base, submitted, job_id, _ = account_jobs[k]
                heap.append((base + term(*account), submitted, job_id, account))
        heapq.heapify(heap)
        while heap:  # job ids are unique: the heap never compares accounts
            account = heapq.heappop(heap)[3]
            account_jobs, k = self._accounts[account], self._next[account]
            self._next[account] = k + 1
            yield account_jobs[k][3]
            if k + 1 < len(account_jobs):
                base, submitted, job_id, _ = account_jobs[k + 1]
                heapq.heappush(heap, (base + term(*account), submitted, job_id, account))

    def rest(self, skip: set[int]) -> list[QueuedJob]:
        """The jobs not given yet nor in `skip`, in rank order with the terms as they are now
        (while no job starts, the rest of the order): one sort of tuples, no key function
        (the live pass with 5,000 queued takes most of them from here)."""
        keyed: list[tuple[float, float, int, QueuedJob]] = []
        for account, k in self._next.items():
            term = self.terms.term(*account)
            keyed += [
                (rank + term, sub, job_id, job)
                for rank, sub, job_id, job in self._accounts[account][k:]
                if job_id not in skip
            ]
        keyed.sort()
        return [entry[3] for entry in keyed]


Account = tuple[str, str | None]
"""A user and the group their job runs in (None: no group)."""


class FairShareTerms:
    """The fair-share term of each account, in two levels as Slurm's fair tree: between the
    groups present by their shares, then between the users present in each group by theirs.
    An account's term is the mean of its group's term and its user's term within the group,
    each `1 - 2**(-used/owed)` (0 to 1): an over-served group and an over-served user weigh
    alike, and fair share as a whole stays within one priority class as it was without
    groups, so aging lifts any job as soon as before (summed, the terms reached two classes,
    and on the Philly sample dealt into three groups the longest wait grew past fit-first's:
    1.066x, against 0.952x with the mean). Jobs without a group are one group of their own
    (share 1). Without groups every job is in that one group, and an account's term is its
    user's alone: the order and the terms are exactly as before groups.
    A user's use counts all their jobs, whichever group they ran in."""

    def __init__(
        self, fair_share: FairShare, running: list[RunningJob], queued: Iterable[QueuedJob], now: float
    ) -> None:
        self.fair_share = fair_share
        self.used: dict[str, float] = defaultdict(float)
        self.group_used: dict[str | None, float] = defaultdict(float)
        self.members: dict[str | None, set[str]] = defaultdict(set)
        """Each group present (queued or running jobs in it), with its users present."""
        for run in running:
            # A job past its time limit (stopping, or on a host that stopped reporting) has
            # nothing left: its rest is never negative use.
            likely = run.gpu_load * max(0.0, expected_end(run, now) - now)
            self.used[run.user] += likely
            self.group_used[run.group] += likely
            self.members[run.group].add(run.user)
        for job in queued:
            self.members[job.group].add(job.user)
        users: set[str] = set().union(*self.members.values())
        for user in users:
            self.used[user] += fair_share.usage.get(user, 0.0)
        for group in self.members:
            self.group_used[group] += fair_share.group_usage.get(group, 0.0)
        # Fixed for the pass, so every term stays comparable as jobs start; never below one
        # typical job's use, so the first job started counts when nobody has used anything.
        self.total_share = sum(fair_share.group_share(g) for g in self.members) or 1.0
        self.total_used = max(sum(self.group_used[g] for g in self.members), DEFAULT_RUN_S)
        self.member_share = {g: sum(fair_share.share(u) for u in us) or 1.0 for g, us in self.members.items()}
        self.member_used = {g: max(sum(self.used[u] for u in us), DEFAULT_RUN_S) for g, us in self.members.items()}
        self._terms: dict[Account, float] = {}
        self._above: dict[Account, bool] = {}

    def started(self, job: QueuedJob) -> None:
        run_s = job.typical_s if job.typical_s is not None else DEFAULT_RUN_S
        self.used[job.user] += job.gpu_count * job.fraction * run_s
        self.group_used[job.group] += job.gpu_count * job.fraction * run_s
        self._terms.clear()
        self._above.clear()

    def group_owed(self, group: str | None) -> float:
        """The group's share among the groups present."""
        return self.fair_share.group_share(group) / self.total_share

    def group_used_part(self, group: str | None) -> float:
        return self.group_used[group] / self.total_used

    def group_term(self, group: str | None) -> float:
        """0 while one group alone is present (it has nobody to be weighed against: a lab
        without groups sees the users' terms alone, 0 to 1)."""
        if len(self.members) < 2:
            return 0.0
        return 1.0 - 2.0 ** (-self.group_used_part(group) / self.group_owed(group))

    def owed(self, user: str, group: str | None = None) -> float:
        """The user's share among the users present in their group."""
        return self.fair_share.share(user) / self.member_share.get(group, 1.0)

    def used_part(self, user: str, group: str | None = None) -> float:
        """The user's part of the use of the users present in their group (decayed, plus
        their running jobs' likely rest)."""
        return self.used[user] / self.member_used.get(group, DEFAULT_RUN_S)

    def above_share(self, user: str, group: str | None = None) -> bool:
        """The user's part of their group's use is over their share of it (kept until a
        job starts)."""
        key = (user, group)
        found = self._above.get(key)
        if found is None:
            found = self._above[key] = self.used_part(user, group) > self.owed(user, group)
        return found

    def user_term(self, user: str, group: str | None = None) -> float:
        return 1.0 - 2.0 ** (-self.used_part(user, group) / self.owed(user, group))

    def term(self, user: str, group: str | None = None) -> float:
        """Kept until a job starts (a pass asks for each queued job's, most of them alike)."""
        key = (user, group)
        found = self._terms.get(key)
        if found is None:
            own = self.user_term(user, group)
            found = self._terms[key] = own if len(self.members) < 2 else (self.group_term(group) + own) / 2
        return found
