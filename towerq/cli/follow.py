"""`towerq follow ID` and `towerq submit --follow`: a job's progress, live, in the terminal.

On a terminal one line is redrawn in place:

    job 12 running   [########------------]  40%  step 400/1000  loss 0.4123  acc 91.2%  8,120 ex/s  ETA 0:42

elsewhere (a log, a pipe) a line is printed at most every few seconds. Queued, it says
where the job stands and why. It follows the API's event stream and reconnects with
back-off when the API restarts (`towerq.Client.events`). It ends with the final metrics,
and its exit code says how the job ended: 0 succeeded, 1 failed, 3 cancelled.

With the job's log (`towerq run`, `towerq follow --logs`) its lines are printed as they are
stored, above the progress line (`LogTail`).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Any

from towerq.cli.plain import rewrite_line
from towerq.cli.views import wall_rate
from towerq.client import Client
from towerq.errors import ApiError, UnreachableError

EXIT_FOR_STATE = {"succeeded": 0, "failed": 1, "cancelled": 3}
PLAIN_EVERY_S = 5.0
BAR_WIDTH = 20
LOG_EVERY_S = 1.0
"""How often the log is read while following it (as `towerq logs -f` does)."""


class ProgressLine:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.live = sys.stdout.isatty()
        self.printed = 0.0
        self.latest: dict[str, Any] = {}
        self.eval: dict[str, Any] = {}
        self.pace_from: tuple[int, float] | None = None
        """The first train point this follower saw: (step, when it came)."""
        self.pace_s: float | None = job.get("pace_s")
        """Wall-clock seconds per step, evaluations and checkpoints included (the API's until
        this follower has seen two points of its own)."""
        self.lock = threading.Lock()
        """One writer at a time: the progress line and the log's lines above it."""

    def update(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "metric":
            self.latest = event
            self._note_pace(int(event.get("step") or 0))
        elif kind == "eval":
            self.eval = event
        elif kind == "state":
            self.job["state"] = event.get("state", self.job["state"])
            if not self.live and self.job["state"] in EXIT_FOR_STATE:
                return  # its end is said once, by `finish`, with its results
        self.draw(force=kind == "state")

    def text(self) -> str:
        job, latest = self.job, self.latest
        head = f"job {job['id']} {job['state']:<9}"
        if job["state"] == "queued":
            position = job.get("queue_position")
            why = job.get("reason") or "waiting for the scheduler"  # its requirements' failure too
            return f"{head} #{position} in the queue: {why}" if position else f"{head} {why}"
        if job["state"] == "dispatched" and job.get("reason"):  # held by the executor's cluster (Slurm's reason)
            return f"{head} {job['reason']}"
        total = job.get("total_steps") or 0
        step = latest.get("step") or job.get("step") or 0
        parts = [head]
        if total:
            done = min(step / total, 1.0)
            filled = int(done * BAR_WIDTH)
            parts.append(f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * done:3.0f}%")
        if total or step:  # a program that reports no steps shows none
            parts.append(f"step {step}/{total}" if total else f"step {step}")
        if latest.get("loss") is not None:
            parts.append(f"loss {latest['loss']:.4f}")
        if latest.get("accuracy") is not None:
            parts.append(f"acc {100 * latest['accuracy']:.1f}%")
        speed = wall_rate(latest, self.pace_s) or latest.get("examples_per_sec")
        if speed:
            parts.append(f"{speed:,.0f} ex/s")
        if self.pace_s and total and step < total and job["state"] == "running":
            parts.append(f"ETA {_clock((total - step) * self.pace_s)}")
        return "  ".join(parts).rstrip()

    def _note_pace(self, step: int) -> None:
        now = time.monotonic()
        if self.pace_from is None or step < self.pace_from[0]:  # the first point, or a new attempt's
            self.pace_from = (step, now)
        elif step > self.pace_from[0]:
            self.pace_s = (now - self.pace_from[1]) / (step - self.pace_from[0])

    def say(self, *lines: str) -> None:
        """Lines printed above the progress line (which is drawn again under them, once)."""
        with self.lock:
            if self.live:
                rewrite_line("")
            print("\n".join(lines), flush=True)
            if self.live:
                self._draw_now()

    def draw(self, force: bool = False) -> None:
        with self.lock:
            self._draw(force)

    def _draw_now(self) -> None:
        width = shutil.get_terminal_size((120, 20)).columns
        rewrite_line(self.text()[: width - 1])

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if self.live:
            self._draw_now()
        elif force or now - self.printed >= PLAIN_EVERY_S:
            self.printed = now
            print(self.text(), flush=True)

    def finish(self, job: dict[str, Any]) -> None:
        if self.live:
            print()
        latest = job.get("latest") or {}
        results = []
        for label, key, percent in (
            ("loss", "loss", False),
            ("accuracy", "accuracy", True),
            ("eval loss", "eval_loss", False),
            ("eval accuracy", "eval_accuracy", True),
        ):
            value = latest.get(key)
            if value is not None:
                results.append(f"{label} {100 * value:.2f}%" if percent else f"{label} {value:.4f}")
        tail = f": {job['error']}" if job.get("error") else ""
        print(f"job {job['id']} {job['state']}{tail}" + (f" ({', '.join(results)})" if results else ""), flush=True)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def log_line(row: dict[str, Any]) -> str:
    """A log line as `towerq logs` prints it."""
    return f"{row['time'][11:19]} {row['level']:<7} {row['message']}"


class LogTail:
    """The job's log as it is stored, printed above the progress line: read every
    `LOG_EVERY_S` after the last line printed (`/api/jobs/{id}/logs?after_id=`), so that the
    lines stored before the follower listened, or while the API restarted, are printed too,
    once and in order. `after`: the line to print after (0: from the job's last thousand)."""

    def __init__(self, client: Client, job_id: int, line: ProgressLine, after: int = 0) -> None:
        self.client, self.job_id, self.line, self.after = client, job_id, line, after
        self._reading = threading.Lock()
        self._done = threading.Event()
        self._private = False
        self._thread = threading.Thread(target=self._run, name=f"log-{job_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        """The job ended: stop reading, then print what is left of its log."""
        self._done.set()
        self._thread.join(LOG_EVERY_S * 10)
        self.read()

    def _run(self) -> None:
        while not self._done.wait(LOG_EVERY_S):
            self.read()

    def read(self) -> None:
        """Print the lines stored since the last one printed."""
        with self._reading:
            if self._private:
                return
            try:
                rows = list(self.client.log_lines(self.job_id, after=self.after))
            except UnreachableError:
                return  # the API restarts: the next read catches up
            except ApiError as err:
                if err.status == 403:
                    self._private = True
                    self.line.say(f"(job {self.job_id}'s log is its owner's: towerq share {self.job_id})")
                return
            if rows:
                self.line.say(*(log_line(row) for row in rows))
                self.after = max(self.after, *(int(row["id"]) for row in rows))


def follow_job(client: Client, job_id: int, logs: bool = False) -> int:
    """Follow the job until it ends, with its log's lines where `logs`; the exit code of
    its end."""
    job = client.job(job_id).data
    line = ProgressLine(job)
    tail = LogTail(client, job_id, line) if logs else None
    if tail is not None:
        tail.read()
        tail.start()
    line.draw(force=True)
    for event in client.events(job_id):
        if event.get("type") == "state" and event.get("state") != line.job["state"]:
            line.job = client.job(job_id).data  # its reason, total steps, allocation
        if tail is not None and event.get("type") == "state" and event.get("state") in EXIT_FOR_STATE:
            tail.read()  # its last words before its end
        line.update(event)
    if tail is not None:
        tail.finish()
    final = client.job(job_id).data
    line.finish(final)
    return EXIT_FOR_STATE.get(final["state"], 1)
