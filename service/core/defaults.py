"""Named constants: the defaults of settings that two homes share, and constants that are
not settings at all. Imports nothing, so anything may import it."""

DAY = 24 * 3600.0

DEFAULT_HALF_LIFE_S = 1 * DAY
"""Fair share: usage this long ago counts half (`TOWERQ_FAIR_SHARE_HALF_LIFE_S`)."""

DEFAULT_AGING_S = 4 * DAY
"""Waiting this long lifts a job by one priority class (`TOWERQ_AGING_S`)."""

DEFAULT_RESERVE_AFTER_S = 1 * DAY
"""A gang job that cannot start after waiting this long gets a reservation (`TOWERQ_RESERVE_AFTER_S`)."""

DEFAULT_MAX_RESERVATIONS = 2
"""How many jobs may hold reservations at once (`TOWERQ_MAX_RESERVATIONS`)."""

SCHEDULER_LOCK_TTL_S = 30
"""A pass that dies holding the lock frees it after this long."""

METRIC_FLUSH_INTERVAL_S = 0.25
"""The worker writes buffered metric rows at most this long after the trainer prints them."""

METRIC_FLUSH_ROWS = 200
"""...or as soon as this many are buffered."""

KILL_CHECK_INTERVAL_S = 0.2
"""How often a stopping runner checks whether the trainer's process group is gone."""

MAX_PASS_GAP_S = 0.5
"""The longest pause after a pass before the next kick is served (the pause is as long
as the pass took: `service.cli.scheduling.pass_gap`)."""

KEYSPACE_CLAIM_S = 10.0
"""How often a running scheduler claims its Redis keyspace again (`service.core.keyspace`):
a flush would otherwise leave it unclaimed, free for another service, until a process
started."""

FORECAST_COST_RATIO = 10.0
"""Waiting jobs' expected starts are replayed for every pass that writes the queue's
positions (each `PENDING_REFRESH_S`, and at once for a new job); unless the last replay
took over 1/this of the time since it ended (a long queue on hundreds of busy GPUs, ~0.1-0.2 s
a replay), when the previous one is shown until the replay has had its time: the replay
then costs the scheduler at most ~1/this of its time."""

FORECAST_SLICE_S = 0.01
"""The replay of expected starts goes on a slice of about this long at a time (one policy
call past it at most): one in the pass that starts it, the rest between passes while
no pass is asked for (one a pass if they keep coming). So a pass, whose own bar is 20 ms
at p99 and 50 ms at most on 256 GPUs, waits at most a slice for it; and a short replay (a
small lab's: a few ms) is over, and written, in the pass that starts it."""

PENDING_REFRESH_S = 1.0
"""Queued jobs' positions and reasons are rewritten at most this often (new jobs at once)."""

RQ_LAUNCH_TIMEOUT_S = 120
"""RQ timeout for a dispatch message: it only starts the trainer, which then runs for hours
under the worker's own supervision, outside RQ's timeout."""

JOB_PAGE_SIZE = 50
"""Default page size of `GET /api/jobs`."""

MAX_PAGE_SIZE = 500
"""Largest page `GET /api/jobs` returns."""

CATALOG_SCAN_MAX_AGE_S = 30.0
"""`GET /api/catalog` lists the user models and data files it found at most this long ago."""

METRICS_LOG_READ_BYTES = 256 * 2**20
"""How much of a trainer's `metrics.jsonl` the worker reads back when a job resumes: ~1 M
points at ~250 bytes each; the trainer writes the file, so the read must be bounded. It is
read a block at a time and stored a batch at a time: the worker never holds the file."""
METRICS_LOG_LINE_BYTES = 64 * 2**10
"""A line of `metrics.jsonl` longer than this is passed over on a resume (a point is ~250 bytes)."""

REDRAWN_LINE_EVERY_S = 10.0
"""A line a trainer or program redraws with carriage returns (a progress bar: tqdm redraws
up to ten times a second) is said in the job's log as it stands at most this often, and as
it ended (`worker.lines`): a long epoch's bar shows how far it got every few seconds a
person would glance at it, some 360 lines an hour rather than 36,000."""

TRAINER_LINE_BYTES = 1 * 2**20
"""The longest line the worker takes from a trainer's stdout or stderr; past it the line is
cut there (and said so in the job's log), so a trainer that writes without a newline
cannot grow the worker's memory without bound."""

METRIC_POINTS_PER_ATTEMPT = 1_000_000
"""Metric points one attempt may store; past it more points are dropped and the job's log
says so once. At the default `log_every` that is ~10 M steps."""

LOG_LINE_OVERHEAD = 64
"""What a stored log line takes besides its text: its row's other columns, or `log.txt`'s
time, attempt and level before it (counted in `Job.log_bytes`)."""

LOG_LINES_PER_ATTEMPT = 200_000
"""Log lines one attempt may relay (database and `log.txt`); past it they are dropped and
the log says so once. The database keeps the newest `towerq.contract.api.LOG_LINES_KEPT` of them anyway."""

API_SHUTDOWN_GRACE_S = 3.0
"""When the API stops, what it is answering gets this long to finish; then its live streams
are closed (the dashboard and the client reconnect on their own). Without a bound, one open
dashboard tab kept `towerq up` waiting for its supervisor's kill, a minute after Ctrl+C."""
